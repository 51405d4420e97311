"""Examples of the cart-pole-from-pixels HDF5 files, read lazily.

Example `i` is the stack of the `stack` frames ending at frame t of trajectory n, with the
state at t as its target. Only the small `states` array is read up front; frames are read
(and decompressed) per example, through a file handle that each process opens on first use:
HDF5 handles do not survive a fork, so the DataLoader's workers each open their own
(R-DATA-6).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F


def state_features(states: torch.Tensor) -> torch.Tensor:
    """`[x, sin θ, cos θ, ẋ, θ̇]`: the regression targets (θ without its wrap-around)."""
    x, theta, x_dot, theta_dot = states.unbind(-1)
    return torch.stack((x, torch.sin(theta), torch.cos(theta), x_dot, theta_dot), dim=-1)


class PixelFrames:
    """`{"frames": float [stack*3, S, S] in [0, 1], "state": [4]}` per example."""

    def __init__(self, path: str | Path, stack: int = 2, shift: int = 0) -> None:
        import h5py

        self.path, self.stack, self.shift = str(path), stack, shift
        with h5py.File(self.path, "r") as f:
            self.states = torch.from_numpy(f["states"][...])
            self.size = int(f.attrs["size"])
        trajectories, frames = self.states.shape[:2]
        if frames < stack:
            raise ValueError(f"{path}: trajectories of {frames} frames are shorter than "
                             f"data.stack ({stack})")
        self.per_trajectory = frames - stack + 1
        self._length = trajectories * self.per_trajectory
        self._file = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return self._length

    def _frames(self):
        if self._file is None or self._pid != os.getpid():  # first use in this process
            import h5py

            self._file, self._pid = h5py.File(self.path, "r"), os.getpid()
        return self._file["frames"]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        n, offset = divmod(int(index), self.per_trajectory)
        t = offset + self.stack - 1
        frames = torch.from_numpy(self._frames()[n, t - self.stack + 1:t + 1])
        image = frames.reshape(-1, self.size, self.size).float().div_(255.0)
        if self.shift:  # random shift: pad by repeating the border, crop back at random
            s = self.shift
            padded = F.pad(image.unsqueeze(0), (s, s, s, s), mode="replicate")[0]
            du, dv = torch.randint(0, 2 * s + 1, (2,)).tolist()
            image = padded[:, dv:dv + self.size, du:du + self.size]
        return {"frames": image, "state": self.states[n, t]}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_file": None, "_pid": None}  # never pickle a handle
