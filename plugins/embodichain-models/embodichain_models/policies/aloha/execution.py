"""Executing action chunks in closed loop: the policy's side of the evaluation (R-EVAL-1).

`ChunkExecution(chunk_fn, ...)` is a `ClosedLoopPolicy`: at every step it asks `chunk_fn`
for a chunk of the next `chunk` actions for every environment slot (one batched forward)
and returns one action per slot, either

- temporal ensembling (ACT): the action for step t is the average of every prediction made
  for t by the chunks of steps t-chunk+1 .. t, weighted exp(-m i) with i = 0 the oldest
  (m = 0.01 in ACT: older predictions weigh slightly more), or
- a fixed horizon h: a chunk's first h actions are executed, then a new chunk is taken.

`chunk_fn` maps a dict of batched tensors (the observation keys: float32, camera frames
uint8 `[B, H, W, 3]` as the environment gives them) to the raw chunk `[B, chunk, action_dim]`
(the model's `act_chunk`, or an exported deployable forward). The observation keys are the
dataset's; gym-aloha's `pixels_agent_pos` observation is read under lerobot's names for it
(`agent_pos` is `observation.state`, `pixels[c]` is `observation.images.c`), so the same
policy acts in our environments and in gym-aloha's own, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch


class ChunkExecution:
    """Chunk execution for a batch of environment slots (see the module's docstring)."""

    def __init__(self, chunk_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                 keys: Sequence[str], chunk: int, device: torch.device | str = "cpu", *,
                 temporal_ensemble: float | None = None, horizon: int | None = None) -> None:
        if (temporal_ensemble is None) == (horizon is None):
            raise ValueError("give temporal_ensemble (its m) or horizon, not both or neither")
        if horizon is not None and not 1 <= horizon <= chunk:
            raise ValueError(f"horizon {horizon} must lie in 1..chunk ({chunk})")
        self.chunk_fn, self.keys, self.chunk = chunk_fn, list(keys), chunk
        self.device = torch.device(device)
        self.m, self.horizon = temporal_ensemble, horizon
        self.slots: dict[int, _Slot] = {}

    def reset(self, env_index: int) -> None:
        self.slots[env_index] = _Slot()

    def act(self, observations: Mapping[str, Any]) -> np.ndarray:
        inputs = {k: _tensor(observed(observations, k), self.device) for k in self.keys}
        chunks = self.chunk_fn(inputs).detach().to("cpu", torch.float64).numpy()
        actions = []
        for i, chunk in enumerate(chunks):
            slot = self.slots.setdefault(i, _Slot())
            actions.append(slot.ensemble(chunk, self.m) if self.m is not None
                           else slot.follow(chunk, self.horizon))
            slot.t += 1
        return np.stack(actions).astype(np.float32)


class _Slot:
    """One environment slot's step count and the chunks it still uses."""

    def __init__(self) -> None:
        self.t = 0
        self.plans: list[tuple[int, np.ndarray]] = []  # (step it was made at, chunk), oldest first

    def ensemble(self, chunk: np.ndarray, m: float) -> np.ndarray:
        self.plans.append((self.t, chunk))
        self.plans = [(t0, c) for t0, c in self.plans if self.t - t0 < len(c)]
        predictions = np.stack([c[self.t - t0] for t0, c in self.plans])
        weights = np.exp(-m * np.arange(len(predictions)))
        return (weights[:, None] * predictions).sum(0) / weights.sum()

    def follow(self, chunk: np.ndarray, horizon: int) -> np.ndarray:
        if self.t % horizon == 0:
            self.plans = [(self.t, chunk)]
        t0, plan = self.plans[0]
        return plan[self.t - t0]


STATE_KEY, IMAGE_PREFIX = "observation.state", "observation.images."


def observed(observations: Mapping[str, Any], key: str) -> Any:
    """The observation `key` (a dataset feature's name), or gym-aloha's `pixels_agent_pos`
    entry for it (lerobot's mapping: `agent_pos`, `pixels[camera]`)."""
    if key in observations:
        return observations[key]
    if key == STATE_KEY and "agent_pos" in observations:
        return observations["agent_pos"]
    camera = key[len(IMAGE_PREFIX):] if key.startswith(IMAGE_PREFIX) else None
    pixels = observations.get("pixels")
    if camera is not None and isinstance(pixels, Mapping) and camera in pixels:
        return pixels[camera]
    raise KeyError(f"the policy reads {key!r}: the observation has {list(observations)}")


def _tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A batched observation as the policy takes it: camera frames (uint8) as they come, the
    rest as float32 (gym-aloha's agent_pos is float64)."""
    array = np.asarray(value)
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.to(device, torch.uint8 if array.dtype == np.uint8 else torch.float32)
