"""Video frames by timestamp (PyAV), PNG images, and the encoders that write them.

Decoding follows lerobot's PyAV path: seek to the keyframe at or before the first wanted
timestamp, decode forward past the last, and take for each wanted timestamp the nearest
decoded frame, which must lie within `tolerance_s`. Unlike lerobot's PyAV path (which
opens the file for every example) each process keeps its containers open, opened on first
use in that process: a DataLoader worker opens its own after the fork, never inherits one.
Decoders run on one thread. Only the frames picked are converted to RGB, once each.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from fractions import Fraction
from pathlib import Path

import numpy as np

from embodichain_models.data.lerobot.errors import LeRobotDecodeError, LeRobotFormatError

VIDEO_CODEC = "libx264"  # in PyAV's wheels (its own FFmpeg); decoded by FFmpeg's h264
_OPEN_LIMIT = 16  # containers kept open per process


def video_length_s(path: Path, episode: int | None = None) -> tuple[float, int]:
    """The video's length in seconds (frames / frame rate) and its frame count, as its
    header says (a file cut short keeps its header: see `first_frame_missing`)."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            frames = int(stream.frames)
            rate = stream.average_rate or stream.guessed_rate
            if frames <= 0 or not rate:  # no frame count in the header: count them
                frames = sum(1 for _ in container.demux(stream) if _.size)
            return float(frames / rate), frames
    except (av.error.FFmpegError, IndexError) as exc:
        raise LeRobotFormatError(f"{path}: not a readable video{_of(episode)} ({exc})"
                                 ) from None


def first_frame_missing(path: Path, needs: list[tuple[float, int]], tolerance_s: float
                        ) -> tuple[float, int] | None:
    """Of `needs` (the time of an episode's last frame in the file, that episode), sorted by
    time, the first whose frame's packet is not wholly within the file, or None.

    A file cut short (a copy or download that stopped early) keeps its header, frame count
    included, when the header comes first (mp4 `faststart`): only reading shows what is
    there. Packets are read, never decoded: from the keyframe before the latest frame to
    that frame (a GOP) when all is there; else the same for each episode, in order, until
    one is missing.
    """
    import av

    size = path.stat().st_size
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]

            def present(t: float) -> bool:
                """Whether the file reaches time `t`: a packet shown at `t` or later lies
                wholly within it, and so does every packet decoded before `t` is shown."""
                container.seek(max(0, round(t / stream.time_base) - 1), backward=True,
                               any_frame=False, stream=stream)
                reached = False
                for packet in container.demux(stream):
                    if packet.size == 0 or packet.pts is None:
                        continue  # the demuxer's flush packet at the end of what is there
                    if packet.pos is not None and packet.pos + packet.size > size:
                        return False
                    reached = reached or packet.pts * stream.time_base >= t - tolerance_s
                    dts = packet.dts if packet.dts is not None else packet.pts
                    if reached and dts * stream.time_base > t + tolerance_s:
                        break  # decode order: nothing later is shown at or before `t`
                return reached

            if not needs or present(needs[-1][0]):
                return None
            return next((need for need in needs if not present(need[0])), needs[-1])
    except (av.error.FFmpegError, IndexError) as exc:
        raise LeRobotFormatError(f"{path}: not a readable video{_of(needs[0][1])} ({exc})"
                                 ) from None


def _of(episode: int | None) -> str:
    return "" if episode is None else f" (episode {episode}'s video)"


class VideoFrames:
    """Per-process cache of open containers; `frames()` decodes by timestamp."""

    def __init__(self, tolerance_s: float) -> None:
        self.tolerance_s = tolerance_s
        self._containers: OrderedDict[Path, object] = OrderedDict()
        self._pid = os.getpid()
        self._rgb = None  # one colour converter for every frame (see `_to_rgb`)
        self._rgb_threads = True  # whether this PyAV's converter takes `threads` (17 on)

    def __getstate__(self) -> dict:
        return {"tolerance_s": self.tolerance_s, "_containers": OrderedDict(),
                "_pid": None, "_rgb": None,
                "_rgb_threads": self._rgb_threads}  # never pickle an open container

    def _to_rgb(self, frame) -> np.ndarray:
        """uint8 `[H, W, 3]`, exactly `frame.to_ndarray(format="rgb24")`.

        `to_ndarray` gives each frame a converter of its own, with swscale's default of a
        thread pool (one thread per core): set up for every frame decoded, that cost more
        than converting a 224x224 frame, and the threads contend with the workers'. One
        single-threaded converter per process (made after a fork: a thread pool does not
        survive one) reuses its context while the size and format stay the same. PyAV
        before 17 has no `threads` argument (nor a thread pool in its converter): there the
        converter is called without it.
        """
        if self._rgb is None:  # reset after a fork by `_container`
            from av.video.reformatter import VideoReformatter

            self._rgb = VideoReformatter()
        if self._rgb_threads:
            try:
                return self._rgb.reformat(frame, format="rgb24", threads=1).to_ndarray()
            except TypeError as exc:
                if "threads" not in str(exc):
                    raise
                self._rgb_threads = False  # PyAV < 17
        return self._rgb.reformat(frame, format="rgb24").to_ndarray()

    def _container(self, path: Path):
        import av

        if self._pid != os.getpid():  # forked: the parent's containers are not ours
            self._containers, self._rgb = OrderedDict(), None
            self._pid = os.getpid()
        container = self._containers.get(path)
        if container is None:
            container = av.open(str(path))
            # One decoder thread, in every process: FFmpeg's default (a thread per core)
            # would oversubscribe the cores under N workers, and a threaded decoder opened
            # before a fork (the training process decodes examples when a source is opened)
            # deadlocks the worker that frees it, since its threads did not survive.
            container.streams.video[0].codec_context.thread_count = 1
            self._containers[path] = container
            if len(self._containers) > _OPEN_LIMIT:
                self._containers.popitem(last=False)[1].close()
        else:
            self._containers.move_to_end(path)
        return container

    def frames(self, path: Path, timestamps: list[float], episode: int,
               frame_indices: list[int]) -> np.ndarray:
        """uint8 `[len(timestamps), H, W, 3]`: the frames nearest each timestamp."""
        import av

        first, last = min(timestamps), max(timestamps)
        decoded: list[av.VideoFrame] = []
        times: list[float] = []

        def where(i: int = 0) -> str:
            return f"episode {episode}, frame {frame_indices[i]}, {path}"

        try:
            container = self._container(path)
            stream = container.streams.video[0]
            container.seek(_seek_target(first, stream.time_base), backward=True,
                           any_frame=False, stream=stream)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = float(frame.pts * stream.time_base)
                if t < first - self.tolerance_s:
                    continue
                decoded.append(frame)  # converted below only if it is picked
                times.append(t)
                if t >= last:
                    break
            loaded = np.asarray(times)
            picked: dict[int, np.ndarray] = {}
            order = []
            for i, t in enumerate(timestamps):
                nearest = int(np.abs(loaded - t).argmin()) if len(loaded) else -1
                if nearest < 0 or abs(loaded[nearest] - t) > self.tolerance_s:
                    found = (f"the nearest decoded frame is at {loaded[nearest]:.4f} s"
                             if nearest >= 0 else "no frame decodes from there on")
                    raise LeRobotDecodeError(
                        f"no video frame within tolerance_s={self.tolerance_s} of t={t:.4f} s "
                        f"({where(i)}): {found}")
                if nearest not in picked:
                    picked[nearest] = self._to_rgb(decoded[nearest])
                order.append(picked[nearest])
        except (av.error.FFmpegError, OSError) as exc:
            self._containers.pop(path, None)
            raise LeRobotDecodeError(f"cannot decode the video frame at t={first:.4f} s "
                                     f"({where()}): {exc}") from None
        return np.stack(order)


def _seek_target(first: float, time_base: Fraction) -> int:
    """The stream time to seek back from (to the keyframe at or before it) for frames
    from `first` seconds on.

    At most a quarter tick past `first`: the keyframe reached is then nearer to every
    wanted time than any frame before it (those lie a whole tick earlier), so the frames
    skipped could never be the nearest, and a keyframe at `first` itself (every other
    frame, as lerobot records) is decoded from, not the one before it.
    """
    return max(0, math.floor(first / time_base + 0.25))


def encode_video(path: Path, frames: np.ndarray, fps: int, *, codec: str = VIDEO_CODEC,
                 gop: int = 2, crf: int = 18) -> None:
    """Write uint8 frames `[T, H, W, 3]` as an mp4 (yuv420p, a keyframe every `gop`
    frames, as lerobot's recorder does) atomically; frame i at i / fps seconds."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    height, width = frames.shape[1:3]
    with av.open(str(tmp), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        if codec == "libx264":
            stream.options = {"crf": str(crf), "bf": "0", "preset": "veryfast"}
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    os.replace(tmp, path)


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of a uint8 `[H, W, 3]` image (lossless; PyAV's encoder, no Pillow)."""
    import av

    context = av.CodecContext.create("png", "w")
    context.height, context.width = image.shape[:2]
    context.pix_fmt = "rgb24"
    packets = list(context.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(image),
                                                             format="rgb24")))
    packets += list(context.encode(None))
    return b"".join(bytes(p) for p in packets)


def decode_png(data: bytes, where: str) -> np.ndarray:
    """uint8 `[H, W, 3]` of PNG (or JPEG) bytes; a LeRobotDecodeError naming `where`."""
    import av

    try:
        codec = "mjpeg" if data[:2] == b"\xff\xd8" else "png"
        frames = av.CodecContext.create(codec, "r").decode(av.Packet(data))
        if not frames:
            raise ValueError("no image in the bytes")
        return frames[0].to_ndarray(format="rgb24")
    except (av.error.FFmpegError, ValueError) as exc:
        raise LeRobotDecodeError(f"cannot decode the image ({where}): {exc}") from None
