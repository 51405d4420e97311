"""Frames by timestamp (`VideoFrames`) against a plain decode of the whole video from its
start: the seek, the frames kept and their colour conversion must change nothing."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from embodichain_models.data.lerobot.video import VideoFrames, encode_video

FPS = 30


def _clip(n: int) -> np.ndarray:
    """Frames unlike one another (a level per frame, a texture) in colour, so a frame
    off by one or a different chroma conversion shows."""
    rng = np.random.default_rng(3)
    texture = rng.integers(0, 60, (24, 32, 3))
    level = (np.arange(n) * 37) % 160
    return (level[:, None, None, None] + texture[None]
            + np.array([0, 30, 60])).clip(0, 255).astype(np.uint8)


def _with_b_frames(path: Path, frames: np.ndarray) -> None:
    """An mp4 whose decode order differs from its display order (B-frames, a keyframe
    every 6 frames), as other recorders write them."""
    import av

    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.codec_context.gop_size = 6
        stream.options = {"bf": "2", "preset": "veryfast", "crf": "18"}
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, FPS)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def _all_frames(path: Path) -> tuple[np.ndarray, list[np.ndarray]]:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoded = [(float(f.pts * stream.time_base), f.to_ndarray(format="rgb24"))
                   for f in container.decode(stream)]
    decoded.sort(key=lambda x: x[0])
    return np.array([t for t, _ in decoded]), [a for _, a in decoded]


@pytest.mark.parametrize("layout", ["gop2", "gop3", "bframes"])
def test_frames_equal_a_plain_decode_from_the_start_bitwise(layout: str,
                                                            tmp_path: Path) -> None:
    """Catches a seek that lands after the first wanted frame (e.g. from the last wanted
    time, or a frame too late: a frame off by one, or a refusal), frames picked from the
    wrong place in a window (repeated and unsorted times) and a colour conversion that
    differs from PyAV's rgb24 (e.g. BGR channel order): every window of
    1-3 frames, in a shuffled order on one open container, equals the frames nearest its
    times in a decode of every frame from the start."""
    n = 40
    path = tmp_path / f"{layout}.mp4"
    if layout == "bframes":
        _with_b_frames(path, _clip(n))
    else:
        encode_video(path, _clip(n), FPS, gop=int(layout[-1]))
    times, reference = _all_frames(path)
    assert len(times) == n
    videos = VideoFrames(tolerance_s=1e-4)
    rng = np.random.default_rng(0)
    windows = [[i] for i in range(n)] + [[i - 1, i] for i in range(1, n)]
    windows += [[i, i - 2, i - 2] for i in range(2, n)]  # unsorted, a frame repeated
    for w in rng.permutation(len(windows)):
        wanted = windows[w]
        stamps = [i / FPS + rng.uniform(-5e-5, 5e-5) for i in wanted]
        got = videos.frames(path, stamps, 0, wanted)
        for k, i in enumerate(wanted):
            assert np.array_equal(got[k], reference[i]), (layout, wanted, k)


class _ReformatterBefore17:
    """PyAV's converter as PyAV 14-16 has it: `reformat` without `threads`."""

    real = None  # PyAV's own class, set before it is replaced

    def __init__(self) -> None:
        self.inner, self.calls = self.real(), 0

    def reformat(self, frame, format=None, **options):  # noqa: A002 (PyAV's name)
        if "threads" in options:
            raise TypeError("reformat() got an unexpected keyword argument 'threads'")
        self.calls += 1
        return self.inner.reformat(frame, format=format, **options)


def test_frames_decode_with_a_pyav_whose_converter_takes_no_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a reader that passes `threads=` to PyAV's converter unconditionally: PyAV
    added it in 17 and the plugin declares av>=14, so with av 15 (what lerobot 0.6.1
    installs) every decode raised TypeError. Under a converter without it, the frames are
    those of a plain decode. (CI also runs the LeRobot tests with the lowest declared av.)"""
    from av.video import reformatter

    path = tmp_path / "v.mp4"
    encode_video(path, _clip(6), FPS)
    _, reference = _all_frames(path)
    monkeypatch.setattr(_ReformatterBefore17, "real", reformatter.VideoReformatter)
    monkeypatch.setattr(reformatter, "VideoReformatter", _ReformatterBefore17)
    videos = VideoFrames(tolerance_s=1e-4)
    got = videos.frames(path, [1 / FPS, 4 / FPS], 0, [1, 4])
    assert np.array_equal(got[0], reference[1]) and np.array_equal(got[1], reference[4])
    assert videos._rgb.calls == 2


class _Frames:
    """Decodes frame i of one video; gives the decoder's thread count."""

    def __init__(self, path: Path) -> None:
        self.path, self.videos = path, VideoFrames(tolerance_s=1e-4)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        self.videos.frames(self.path, [i / FPS], 0, [i])
        return self.videos._containers[self.path].streams.video[0].codec_context.thread_count


def test_decoders_run_on_one_thread_so_workers_forked_after_decoding_do_not_hang(
        tmp_path: Path) -> None:
    """Catches decoder threads left at FFmpeg's default (a thread per core), in the
    training process or in workers: workers x cores threads contend for the cores, and a
    threaded decoder inherited over a fork (the training process decodes when a source is
    opened) can deadlock the worker that frees it, its threads gone (seen in this suite;
    the DataLoader's timeout turns such a hang into a failure)."""
    import torch

    path = tmp_path / "v.mp4"
    encode_video(path, np.repeat(np.repeat(_clip(8), 8, axis=1), 8, axis=2), FPS)
    dataset = _Frames(path)
    assert dataset[0] == 1  # decoded in this process before the fork
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2, timeout=30,
                                         multiprocessing_context="fork", collate_fn=list)
    assert [n for batch in loader for n in batch] == [1, 1, 1, 1]
