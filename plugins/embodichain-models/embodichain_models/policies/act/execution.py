"""Executing action chunks in closed loop: the policy's side of the evaluation (R-EVAL-1).

`ChunkExecution(chunk_fn, ...)` is a `ClosedLoopPolicy`: at every step it asks `chunk_fn`
for a chunk of the next `chunk` actions for every environment slot (one batched forward)
and returns one action per slot, either

- temporal ensembling (ACT): the action for step t is the average of every prediction made
  for t by the chunks of steps t-chunk+1 .. t, weighted exp(-m i) with i = 0 the oldest
  (m = 0.01 in ACT: older predictions weigh slightly more), or
- a fixed horizon h: a chunk's first h actions are executed, then a new chunk is taken.

The execution is the exported artifact's runner's (`core.deploy.runner.execution_for`, its
arithmetic `ensembled`): a checkpoint and its artifact execute equal chunks into equal
actions, bit for bit.

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

from embodichain.core.deploy.runner import execution_for


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
        execution = ({"horizon": horizon} if horizon is not None
                     else {"temporal_ensemble": temporal_ensemble})
        # The artifact runner's own execution (one arithmetic: R-DEPLOY-1's parity).
        self.execution = execution_for({"chunk": chunk, "execution": execution})

    def reset(self, env_index: int) -> None:
        self.execution.reset(env_index)

    def act(self, observations: Mapping[str, Any]) -> np.ndarray:
        inputs = {k: _tensor(observed(observations, k), self.device) for k in self.keys}
        execution = self.execution
        execution.start(len(next(iter(inputs.values()))))
        chunk = None
        if execution.wants_chunk():  # as the runner: no forward while every slot has a plan
            chunk = self.chunk_fn(inputs).detach().cpu().numpy()
        return execution.step(chunk)


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
