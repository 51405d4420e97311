"""Diffusion Policy in closed loop: the policy's side of the evaluation (R-DP-3).

`HistoryActing` is a `ClosedLoopPolicy` for a batch of environment slots. Each slot keeps
its own history of the last `n_obs_steps` observations (at its episode's start the first
observation repeated, as the dataset pads), held by the artifact runner's own `Frames`;
every `n_action_steps` steps of a slot's episode (every step under temporal ensembling) a
new horizon is sampled for it, from the noise `runner.episode_noise(seed, k, shape)` of its
episode's seed (`seed_episode`, which the evaluation calls after `reset`) and the horizon's
index k in the episode: an episode's noise, hence its verdict, does not depend on the rank
or slot that ran it, and the exported artifact's runner draws the same noise by the same
rule (numpy's, which needs no torch). The horizons become actions by the runner's own
execution (`execution`, as the artifact's interface names it): the first `n_action_steps`
of each (`Horizon`), or ACT's ensemble of every horizon's prediction for the step
(`TemporalEnsemble`). Each slot samples alone (a batch of one): a batched convolution's
float32 result depends in its last bits on the other rows, which a closed loop's contacts
grow into another trajectory. The acting copy holds the full weights, so these forwards are
local also under FSDP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from embodichain.core.deploy.runner import Frames, episode_noise, execution_for
from embodichain_models.policies.act.execution import observed

SampleFn = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


class HistoryActing:
    """See the module's docstring. `sample_fn(histories, noise) -> raw horizon`;
    `execution`: `{"horizon": n_action_steps}` or `{"temporal_ensemble": m}`."""

    def __init__(self, sample_fn: SampleFn, keys: Sequence[str], n_obs_steps: int,
                 horizon: int, action_dim: int, execution: Mapping[str, float | int],
                 device: torch.device | str = "cpu") -> None:
        self.sample_fn, self.keys = sample_fn, list(keys)
        self.noise_shape = (horizon, action_dim)
        self.device = torch.device(device)
        self.frames = Frames([n_obs_steps] * len(self.keys))
        self.execution = execution_for({"chunk": horizon, "execution": execution})
        self.episodes: dict[int, list[int]] = {}  # slot: [its episode's seed, horizons drawn]

    def reset(self, env_index: int) -> None:
        self.frames.reset(env_index)
        self.execution.reset(env_index)
        self.seed_episode(env_index, 0)

    def seed_episode(self, env_index: int, seed: int) -> None:
        """The episode starting in slot `env_index` draws its noise from `seed`."""
        self.episodes[env_index] = [int(seed), 0]

    def act(self, observations: Mapping[str, Any]) -> np.ndarray:
        arrays = [_array(observed(observations, k)) for k in self.keys]
        histories = self.frames.push(arrays)
        batch = len(arrays[0])
        execution = self.execution
        execution.start(batch)
        horizon = None
        if execution.wants_chunk():  # some slots start a new horizon
            horizon = np.zeros((batch, *self.noise_shape), np.float32)
            for i in np.flatnonzero(execution.fresh()):
                episode = self.episodes.setdefault(int(i), [0, 0])
                noise = torch.from_numpy(episode_noise(*episode, self.noise_shape)[None])
                episode[1] += 1
                inputs = {k: torch.from_numpy(h[i:i + 1]).to(self.device)
                          for k, h in zip(self.keys, histories, strict=True)}
                horizon[i] = self.sample_fn(inputs, noise.to(self.device))[0].detach().cpu()
        return execution.step(horizon)


def _array(value: Any) -> np.ndarray:
    """A batched observation as the policy takes it: camera frames (uint8) as they come, the
    rest float32 (gym-aloha's agent_pos is float64)."""
    array = np.asarray(value)
    return np.ascontiguousarray(array if array.dtype == np.uint8 else array.astype(np.float32))
