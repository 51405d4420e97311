"""Tiny LeRobot datasets for the tests, written with the reader's own writer, and the ways
the tests damage them (a video cut short, undecodable images)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

WRIST = "observation.images.wrist"  # an image camera (PNG in the rows) the policy ignores
SIDE = "observation.images.side"  # a video camera the policy ignores


def header_first(path: Path) -> None:
    """Rewrite an mp4 with its header (moov) before the frames, as `-movflags faststart`
    writes it: cut short, such a file still opens and still lists every frame."""
    import av

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with av.open(str(path)) as source, \
            av.open(str(tmp), "w", format="mp4", options={"movflags": "faststart"}) as out:
        stream = out.add_stream_from_template(source.streams.video[0])
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                out.mux(packet)
    os.replace(tmp, path)


def cut_tail(path: Path, keep: float = 0.6) -> None:
    """Keep the first `keep` of the file's bytes (a copy that stopped early)."""
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def spoil_images(path: Path, key: str) -> None:
    """Replace every image of `key` in a parquet file by bytes that decode as nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    column = table.column(key).combine_chunks()
    junk = pa.array([b"not a png"] * len(column), pa.binary())
    spoiled = pa.StructArray.from_arrays([junk, column.field("path")], names=["bytes", "path"])
    pq.write_table(table.set_column(table.column_names.index(key), key, spoiled), path)


def cartpole_with_unused_cameras(root: Path, episodes: int = 3, size: int = 32) -> Path:
    """The cart-pole recipe's demonstrations with two more cameras it never uses: WRIST
    (PNG in the rows, every image undecodable) and SIDE (a video cut to 60% of its bytes,
    header first, so its header still lists every frame)."""
    from embodichain_models.data.cartpole.prepare import FPS, demonstrations, features

    rng = np.random.default_rng(0)
    recorded = []
    for episode in demonstrations(episodes, seed=0, size=size):
        n = episode.length
        recorded.append(EpisodeData(episode.task, {
            **episode.values, WRIST: rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
            SIDE: rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)}))
    spec = {**features(size), WRIST: feature("image", (4, 4, 3)),
            SIDE: feature("video", (8, 8, 3))}
    write_dataset(root, recorded, spec, FPS, episodes_per_file=25, robot_type="cartpole")
    spoil_images(root / "data/chunk-000/file-000.parquet", WRIST)
    side = root / f"videos/{SIDE}/chunk-000/file-000.mp4"
    header_first(side)
    cut_tail(side)
    return root


MIXTURE_RENAME = {"state": "observation.state", "act": "action", "cam": "observation.images.top"}


def mixture_parts(root: Path, *, b_action: int = 2, b_image: int = 8,
                  b_state_key: str = "state", b_action_dtype: str = "float32"
                  ) -> tuple[Path, Path]:
    """Two small datasets to mix: A at 30 fps (`observation.state` [3], `action` [2], video
    `observation.images.top` 8x8; 3 episodes, task "pick") and B at 15 fps under other
    names (`state`, `act`, video `cam`; 2 episodes, tasks "place" then "pick"), B's action
    size, action dtype, image size and state key changeable to make parts that do not mix."""
    rng = np.random.default_rng(7)

    def episodes(lengths: list[int], tasks: list[str], keys: tuple[str, str, str],
                 action: int, image: int, dtype: str = "float32") -> list[EpisodeData]:
        return [EpisodeData(task, {
            keys[0]: rng.normal(size=(n, 3)).astype(np.float32),
            keys[1]: rng.normal(2.0, 3.0, size=(n, action)).astype(dtype),
            keys[2]: rng.integers(0, 256, (n, image, image, 3), dtype=np.uint8)})
            for n, task in zip(lengths, tasks, strict=True)]

    a_keys = ("observation.state", "action", "observation.images.top")
    a = write_dataset(root / "a", episodes([20, 25, 18], ["pick"] * 3, a_keys, 2, 8),
                      {a_keys[0]: feature("float32", (3,)), a_keys[1]: feature("float32", (2,)),
                       a_keys[2]: feature("video", (8, 8, 3))}, 30)
    b_keys = (b_state_key, "act", "cam")
    b = write_dataset(root / "b", episodes([12, 14], ["place", "pick"], b_keys, b_action,
                                           b_image, b_action_dtype),
                      {b_keys[0]: feature("float32", (3,)),
                       b_keys[1]: feature(b_action_dtype, (b_action,)),
                       b_keys[2]: feature("video", (b_image, b_image, 3))}, 15)
    return a, b


def noise_images(root: Path, episodes: int = 8, frames: int = 40, size: int = 512,
                 per_file: int = 1) -> Path:
    """A v3.0 dataset of random-noise PNG images (which hardly compress: about 0.8 MB a
    frame at 512 px, quick to write) and a small state vector."""
    rng = np.random.default_rng(0)
    recorded = [EpisodeData("noise", {
        "observation.image": rng.integers(0, 256, (frames, size, size, 3), dtype=np.uint8),
        "observation.state": rng.standard_normal((frames, 4)).astype(np.float32)})
        for _ in range(episodes)]
    spec = {"observation.image": feature("image", (size, size, 3)),
            "observation.state": feature("float32", (4,))}
    return write_dataset(root, recorded, spec, 10, episodes_per_file=per_file)
