"""A sampler's artifact (interface format 2): its `noise` input is drawn by the runner with
the one rule (`episode_noise`), keyed by the episode's seed and the horizon's index, each
slot alone (R-DP-3, R-DEPLOY-1); a declaration it cannot draw is refused when opened.

One tiny `.pt2` (chunk = noise + state, a horizon of 3 executed 2 steps at a time) written
once with torch.export and shared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from embodichain.core.deploy.interface import normalized_interface
from embodichain.core.deploy.runner import (
    NOISE_RULE,
    ArtifactError,
    ObservationError,
    PolicyRunner,
    episode_noise,
)
from embodichain.core.errors import UsageError
from tests.support.files import doctored_artifact

SHAPE = (3, 2)


class Sampler(nn.Module):
    def forward(self, state: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return noise + state[:, None, :]


def declared() -> dict[str, Any]:
    return {"observations": {"state": {"shape": [2], "dtype": "float32"}},
            "action": {"key": "action", "shape": list(SHAPE)}, "chunk": 3,
            "execution": {"horizon": 2},
            "noise": {"key": "noise", "shape": list(SHAPE), **NOISE_RULE}}


@pytest.fixture(scope="module")
def sampler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sampler") / "sampler.pt2"
    interface = normalized_interface(declared(), "sampler")
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Sampler(), (torch.zeros(2, 2), torch.zeros(2, *SHAPE)),
                                  dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, path, extra_files={"interface.json": json.dumps(interface)})
    return path


def test_the_rule_is_numpys_pcg64_keyed_by_seed_and_sample() -> None:
    """Catches a rule that drifts from the one the docs state (so a robot's own code, or
    an older runner, would draw other noise): float32 standard normal from
    Generator(PCG64(SeedSequence([seed, sample]))), other keys other numbers."""
    want = np.random.Generator(np.random.PCG64(np.random.SeedSequence([11, 1]))) \
        .standard_normal(SHAPE, dtype=np.float32)
    assert np.array_equal(episode_noise(11, 1, SHAPE), want)
    assert episode_noise(11, 1, SHAPE).dtype == np.float32
    assert not np.array_equal(episode_noise(11, 0, SHAPE), want)
    assert not np.array_equal(episode_noise(12, 1, SHAPE), want)


def test_act_draws_each_episodes_noise_whatever_its_slot(sampler: Path) -> None:
    """Catches a runner that leaves the noise to the caller, draws it per batch or per
    step rather than per episode and horizon (the k-th horizon of the episode of seed s
    takes episode_noise(s, k)), or whose sample count survives a slot's reset: the
    episode of seed 7 acts the same in slot 1 of 2 and alone in slot 0."""
    runner = PolicyRunner(sampler)
    assert runner.interface["format"] == 2 and runner.observation_keys == ("state",)
    runner.reset()
    runner.seed_episode(0, 11)
    runner.seed_episode(1, 7)
    state = np.zeros((2, 2), np.float32)
    pair = np.stack([runner.act({"state": state}) for _ in range(4)])
    for step in range(4):
        for slot, seed in enumerate((11, 7)):
            noise = episode_noise(seed, step // 2, SHAPE)
            assert np.array_equal(pair[step, slot], noise[step % 2])
    runner.reset(0)  # a new episode in slot 0: its first horizon again
    runner.seed_episode(0, 11)
    assert np.array_equal(runner.act({"state": state})[0], episode_noise(11, 0, SHAPE)[0])
    alone = PolicyRunner(sampler)
    alone.reset()
    alone.seed_episode(0, 7)
    single = np.stack([alone.act({"state": state[:1]}) for _ in range(4)])
    assert np.array_equal(single[:, 0], pair[:, 1])
    with pytest.raises(ObservationError, match="unknown"):  # the noise is not the caller's
        runner.act({"state": state, "noise": np.zeros((2, *SHAPE), np.float32)})


@pytest.mark.parametrize(("change", "named"), [
    (lambda i: i["noise"].update(kind="uniform"), "uniform"),
    (lambda i: i["noise"].update(version=2), "'version': 2"),
    (lambda i: i["noise"].update(keying="episode"), "'keying': 'episode'"),
    (lambda i: i["noise"].update(dtype="float64"), "float64"),
    (lambda i: i["noise"].update(key="state"), "'key': 'state'"),
    (lambda i: i["noise"].update(shape=[]), "'shape': []"),
    (lambda i: i.update(format=1), "'kind': 'gaussian'"),
    (lambda i: i.update(noise=["gaussian"]), "['gaussian']"),
])
def test_a_noise_declaration_the_runner_cannot_draw_is_refused(
        sampler: Path, tmp_path: Path, change: Any, named: str) -> None:
    """Catches a runner that would feed noise of another rule, dtype or shape than the
    model was exported for (or into an observation's slot), or read noise in a format 1
    interface: opening the artifact raises ArtifactError naming the declaration."""
    bad = doctored_artifact(sampler, tmp_path / "bad.pt2", change)
    with pytest.raises(ArtifactError, match="noise declaration") as refused:
        PolicyRunner(bad)
    assert named in str(refused.value)


@pytest.mark.parametrize(("noise", "named"), [
    ({"key": "noise", "shape": [3, 2], **NOISE_RULE, "kind": "uniform"}, "noise rule"),
    ({"key": "state", "shape": [3, 2], **NOISE_RULE}, "no input key of its own"),
    ({"key": "noise", "shape": [3, 2], "dtype": "float64", **NOISE_RULE}, "float32"),
    ({"key": "noise", **NOISE_RULE}, "has no shape"),
])
def test_export_refuses_a_noise_the_runner_cannot_draw(noise: dict, named: str) -> None:
    """Catches an export that writes an artifact no runner can act with: a model declaring
    another noise rule, a key of an observation, or non-float32 noise is refused (exit 2)."""
    with pytest.raises(UsageError, match=named):
        normalized_interface({**declared(), "noise": noise}, "sampler")
