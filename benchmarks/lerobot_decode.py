"""Video decoding: the LeRobot source against lerobot's own `LeRobotDataset`, alternating.

For each frame size, a video dataset is written with the source's writer (libx264,
yuv420p, a keyframe every 2 frames, as lerobot's recorder spaces them; or `--codec
libsvtav1`, lerobot's default codec). Each measurement runs in a fresh process: ours in
this venv (`LeRobotFrames`), lerobot 0.6.1's `LeRobotDataset` with its default decoder
(torchcodec) in the venv that `../shared/tools/lerobot-venv.sh` builds (`--lerobot-venv`).
Both read the same 2-frame windows of one camera (`delta_timestamps` [-1/fps, 0]) through
the same DataLoader: a seeded random sampler, batch 32, 0 or 2 workers (fork). The rate is
examples per second after the first batch (worker start-up and the first decodes are left
out of both). Ours and theirs alternate pair by pair, so both see the same machine load;
the ratio reported is the median over pairs of ours / theirs.

    python benchmarks/lerobot_decode.py --sizes 224x224 480x640 --workers 0 2 --pairs 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

KEY = "observation.images.cam"
FPS = 30


def frames(n: int, h: int, w: int, seed: int) -> np.ndarray:
    """A camera-like clip: a moving blob over gradients and a fixed texture (smooth
    enough that the codec's rate resembles a real scene, not noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    texture = rng.integers(0, 40, (h, w, 3)).astype(np.float32)
    out = np.empty((n, h, w, 3), np.uint8)
    for t in range(n):
        cx, cy = w / 2 + w / 3 * np.sin(t / 20 + seed), h / 2 + h / 3 * np.cos(t / 15)
        blob = 200 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * (w / 8) ** 2))
        base = np.stack([blob, x / w * 180 + 20 * np.sin(t / 7), y / h * 180], -1)
        out[t] = np.clip(base + texture, 0, 255).astype(np.uint8)
    return out


def write(root: Path, h: int, w: int, episodes: int, length: int, codec: str,
          key: str = KEY) -> Path:
    from embodichain_models.data.lerobot import video, writer
    from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

    writer.encode_video = partial(video.encode_video, codec=codec)  # the writer's encoder
    recorded = [EpisodeData("move", {
        key: frames(length, h, w, e),
        "observation.state": np.zeros((length, 2), np.float32),
        "action": np.zeros((length, 2), np.float32)}) for e in range(episodes)]
    features = {key: feature("video", (h, w, 3)), "observation.state": feature("float32", (2,)),
                "action": feature("float32", (2,))}
    return write_dataset(root, recorded, features, FPS, episodes_per_file=max(1, episodes // 2))


def child(side: str, root: str, workers: int, batches: int, seed: int) -> None:
    """One measurement in this process: examples/s of `side`'s dataset."""
    import torch

    deltas = {KEY: [-1 / FPS, 0.0]}
    if side == "ours":
        from embodichain_models.data.lerobot.dataset import LeRobotFrames

        dataset = LeRobotFrames(root, delta_timestamps=deltas)
    else:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        dataset = LeRobotDataset("local/bench", root=root, delta_timestamps=deltas)
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True,
                                             num_samples=32 * (batches + 1),
                                             generator=torch.Generator().manual_seed(seed))
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler,
                                         num_workers=workers,
                                         multiprocessing_context="fork" if workers else None)
    count, start = 0, 0.0
    for n, batch in enumerate(loader):
        if n == 0:
            start = time.perf_counter()
        else:
            count += len(batch[KEY])
    print(json.dumps({"ex_s": count / (time.perf_counter() - start)}))


def measure(side: str, root: Path, workers: int, batches: int, seed: int, venv: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    python = sys.executable
    if side == "lerobot":
        python = str(venv / "bin/python")
        env["PYTHONPATH"] = str(venv / "tvstub")
    out = subprocess.run([python, __file__, "--child", side, str(root), str(workers),
                          str(batches), str(seed)], check=True, capture_output=True, text=True,
                         env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["ex_s"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        side, root, workers, batches, seed = sys.argv[2:7]
        child(side, root, int(workers), int(batches), int(seed))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["224x224", "480x640"])
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--batches", type=int, default=6, help="timed batches of 32")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--length", type=int, default=100, help="frames per episode")
    parser.add_argument("--codec", default="libx264")
    parser.add_argument("--lerobot-venv", type=Path, default=Path("/work/venvs/lerobot"))
    args = parser.parse_args()
    print(json.dumps({"uptime": os.getloadavg(), "codec": args.codec}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            h, w = (int(v) for v in size.split("x"))
            root = write(Path(tmp) / size, h, w, args.episodes, args.length, args.codec)
            for workers in args.workers:
                ours, theirs = [], []
                for pair in range(args.pairs):  # alternating, so both see the same load
                    first, second = ("ours", "lerobot") if pair % 2 == 0 else ("lerobot", "ours")
                    got = {s: measure(s, root, workers, args.batches, pair, args.lerobot_venv)
                           for s in (first, second)}
                    ours.append(got["ours"])
                    theirs.append(got["lerobot"])
                print(json.dumps({
                    "size": size, "workers": workers, "ours_ex_s": statistics.median(ours),
                    "lerobot_ex_s": statistics.median(theirs),
                    "ratio": statistics.median(a / b for a, b in zip(ours, theirs, strict=True)),
                    "pairs": [[round(a, 1), round(b, 1)] for a, b in zip(ours, theirs,
                                                                         strict=True)],
                    "load": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
