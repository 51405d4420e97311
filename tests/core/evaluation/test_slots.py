"""Async environment slots (`evaluation.vector: async`) run each environment in a process
that is not a fork of the evaluating process (issue 48 point 7)."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import gymnasium as gym
import numpy as np

from embodichain.core.evaluation.envs import EnvSpec
from embodichain.core.evaluation.slots import make_slots

SENTINEL = "embodichain_evaluating_process_sentinel"


class Probe(gym.Env):
    """Reports, at reset, what its process inherited from the evaluating process."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {"inherited": SENTINEL in sys.modules,
                                         "pid": os.getpid()}

    def step(self, action: Any):
        return np.zeros(1, np.float32), 0.0, True, False, {}


def make_probe() -> Probe:
    return Probe()


def test_async_slots_start_their_processes_without_forking_the_evaluator() -> None:
    """Catches environment processes forked from the evaluating process (after gloo's and
    OpenMP's threads exist, a fork copies their locks in whatever state they are in): a
    module that only the evaluating process holds is not in either slot's process, and
    both answer, each from a process of its own."""
    sys.modules[SENTINEL] = types.ModuleType(SENTINEL)
    slots = make_slots(EnvSpec(constructor=f"{__name__}:make_probe"), 2, "async")
    try:
        for slot in slots:
            slot.send("reset", 0, False)
        answers = [slot.receive(60.0) for slot in slots]
    finally:
        for slot in slots:
            slot.close()
        del sys.modules[SENTINEL]
    assert [a[0] for a in answers] == ["ok", "ok"], answers
    infos = [a[1][1] for a in answers]
    assert [i["inherited"] for i in infos] == [False, False], infos
    assert len({i["pid"] for i in infos} | {os.getpid()}) == 3
