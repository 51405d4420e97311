"""Executing action chunks in closed loop: the policy's side of the evaluation (R-EVAL-1).

`ChunkExecution(chunk_fn, ...)` is a `ClosedLoopPolicy`: at every step it asks `chunk_fn`
for a chunk of the next `chunk` actions for every environment slot (one batched forward)
and returns one action per slot, either

- temporal ensembling (ACT): the action for step t is the average of every prediction made
  for t by the chunks of steps t-chunk+1 .. t, weighted exp(-m i) with i = 0 the oldest
  (m = 0.01 in ACT: older predictions weigh slightly more), or
- a fixed horizon h: a chunk's first h actions are executed, then a new chunk is taken.

The execution is the exported artifact's runner's (`deploy.runner.execution_for`, its
arithmetic `ensembled`): a checkpoint and its artifact execute equal chunks into equal
actions, bit for bit.

`chunk_fn` maps a dict of batched float32 tensors (the observation keys) to the raw chunk
`[B, chunk, action_dim]` (the model's `act_chunk`, or an exported deployable forward).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from embodichain_models.deploy.runner import execution_for


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
        inputs = {k: _tensor(observations[k], self.device) for k in self.keys}
        execution = self.execution
        execution.start(len(next(iter(inputs.values()))))
        chunk = None
        if execution.wants_chunk():  # as the runner: no forward while every slot has a plan
            chunk = self.chunk_fn(inputs).detach().cpu().numpy()
        return execution.step(chunk)


def _tensor(value: Any, device: torch.device) -> torch.Tensor:
    array = np.asarray(value)
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if array.dtype == np.uint8 and array.ndim == 4:  # camera frames [B, H, W, 3] -> [B, 3, H, W]
        tensor = tensor.permute(0, 3, 1, 2).float().div_(255.0)
    return tensor.to(device, torch.float32)
