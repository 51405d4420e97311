"""Films of episodes: rendered frames encoded as they come (mp4, H.264 through PyAV).

An episode's film holds the frame rendered after its reset and one after each step, so it
has `length + 1` frames. Frames are encoded as they arrive (an episode's raw frames would
not fit in memory for long episodes) into an in-memory mp4 that rank 0 writes under the run
directory. `gif` re-encodes a film for TensorBoard, which shows animated GIFs.

Filming is a side channel (R-EVAL-5): a frame that cannot be rendered or encoded drops the
episode's film, with the reason in its record (`video_missing`), and never changes the
episode's outcome. Frames are taken as environments give them: uint8 RGB(A), grayscale
`[H, W]` or `[H, W, 1]`, float in [0, 1] (or in [0, 255]), bool (`rgb_frame`).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy comes with gymnasium, imported only where an evaluation runs
    import numpy as np

AV_HINT = "pip install 'embodichain-sl[eval]'"


def av_module() -> Any:
    try:
        import av
    except ImportError:
        from embodichain.core.errors import UsageError

        raise UsageError("evaluation.videos needs PyAV (to write mp4), which is not installed; "
                         f"install it with: {AV_HINT}, or set evaluation.videos: 0") from None
    return av


@dataclass(frozen=True)
class NoFrame:
    """What an environment gave instead of a frame: why there is none (picklable)."""

    reason: str


def rgb_frame(frame: Any) -> np.ndarray:
    """A rendered frame as uint8 `[H, W, 3]`; raises ValueError saying why it is not one."""
    import numpy as np
    if frame is None:
        raise ValueError("render() returned None (no rgb_array frame)")
    image = np.asarray(frame)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.ndim == 2:  # grayscale
        image = np.repeat(image[..., None], 3, axis=-1)
    if image.ndim != 3 or image.shape[-1] not in (3, 4) or 0 in image.shape:
        raise ValueError(f"a frame of shape {list(image.shape)} is not an image ([H, W], "
                         "[H, W, 1], [H, W, 3] or [H, W, 4])")
    image = image[..., :3]
    kind = image.dtype.kind
    if kind == "b":
        image = image.astype(np.uint8) * 255
    elif kind in "iu" and image.dtype != np.uint8:
        if image.min() < 0 or image.max() > 255:
            raise ValueError(f"an integer frame ({image.dtype}) with values outside [0, 255]")
        image = image.astype(np.uint8)
    elif kind == "f":
        if not np.isfinite(image).all():
            raise ValueError("a float frame with NaN or infinite values")
        low, high = float(image.min()), float(image.max())
        if low < 0.0 or high > 255.0:
            raise ValueError(f"a float frame with values in [{low:g}, {high:g}] (expected "
                             "[0, 1] or [0, 255])")
        scale = 255.0 if high <= 1.0 else 1.0  # [0, 1] is the float convention
        image = np.rint(image.astype(np.float64) * scale).astype(np.uint8)
    elif image.dtype != np.uint8:
        raise ValueError(f"a frame of dtype {image.dtype} is not an image")
    return np.ascontiguousarray(image)


def _even(frame: np.ndarray) -> np.ndarray:
    """yuv420p needs even sides: an odd row or column is repeated."""
    import numpy as np
    h, w = frame.shape[:2]
    if h % 2 or w % 2:
        frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return np.ascontiguousarray(frame)


class FilmEncoder:
    """`add(frame)` uint8 `[H, W, 3]` frames one by one; `finish()` the mp4's bytes."""

    def __init__(self, fps: int, codec: str = "libx264") -> None:
        self.av = av_module()
        self.fps, self.codec = fps, codec
        self.buffer = io.BytesIO()
        self.container: Any = None
        self.stream: Any = None
        self.frames = 0

    def add(self, frame: Any) -> None:
        """Encode a frame (`rgb_frame`'s forms); raises (ValueError, or PyAV's error) on one
        that cannot be: the evaluation then abandons the film, the episode goes on."""
        image = _even(rgb_frame(frame))
        if self.container is not None and image.shape[:2] != (self.stream.height,
                                                              self.stream.width):
            raise ValueError(f"the frame size changed from {self.stream.height}x"
                             f"{self.stream.width} to {image.shape[0]}x{image.shape[1]}")
        if self.container is None:
            self.container = self.av.open(self.buffer, "w", format="mp4")
            self.stream = self.container.add_stream(self.codec, rate=self.fps)
            self.stream.height, self.stream.width = image.shape[:2]
            self.stream.pix_fmt = "yuv420p"
            if self.codec == "libx264":
                self.stream.options = {"crf": "23", "preset": "veryfast"}
        video = self.av.VideoFrame.from_ndarray(image, format="rgb24")
        video.pts, video.time_base = self.frames, Fraction(1, self.fps)
        self.container.mux(self.stream.encode(video))
        self.frames += 1

    def abandon(self) -> None:
        """Drop the film (a frame could not be added): free the encoder."""
        container, self.container = self.container, None
        if container is not None:
            with contextlib.suppress(Exception):
                container.close()

    def finish(self) -> bytes | None:
        """The mp4 (None when no frame came: the environment renders nothing)."""
        if self.container is None:
            return None
        self.container.mux(self.stream.encode(None))
        self.container.close()
        self.container = None
        return self.buffer.getvalue()


def decode_frames(data: bytes | str) -> list[np.ndarray]:
    """The RGB frames of an mp4 (a path or its bytes)."""
    av = av_module()
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    with av.open(source) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def gif(mp4: bytes, fps: int, max_side: int = 256) -> tuple[bytes, int, int]:
    """An animated GIF of a film (scaled to at most `max_side`), with its height and width."""
    av = av_module()
    frames = decode_frames(mp4)
    h, w = frames[0].shape[:2]
    scale = min(1.0, max_side / max(h, w))
    height, width = max(2, int(h * scale) // 2 * 2), max(2, int(w * scale) // 2 * 2)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="gif") as container:
        stream = container.add_stream("gif", rate=fps)
        stream.height, stream.width, stream.pix_fmt = height, width, "rgb8"
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(
                width=width, height=height, format="rgb8")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue(), height, width
