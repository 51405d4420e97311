"""What `eval` of a checkpoint or of its exported policy refuses before any episode
(R-EVAL-6, R-DEPLOY-1), in this process: closed_loop's Reach policy (tests/factories/
deploying.py) trained 2 updates with demonstration seeds [9] in its record, exported as
`.pt2` once; its recipe evaluates 2 episodes from seed 7 (seeds 7 and 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from embodichain.core.deploy import runner
from embodichain.core.deploy.artifact import export_policy
from embodichain.core.deploy.evaluate import check_artifact
from embodichain.core.errors import UsageError
from embodichain.core.evaluation.closed_loop import Overrides
from embodichain.core.launch.evaluate import find_target
from tests.support.in_process import train_in_process
from tests.support.processes import FACTORIES

DEMONSTRATIONS = [9]
REFUSED = "include 1 seed(s) the training data was recorded with (9)"


def _reach(recipe: dict[str, Any]) -> None:
    for key in ("model", "data"):
        recipe.pop(key)
    recipe["factory"] = "deploying:reach"
    recipe["evaluation"] = {"env": {"constructor": "closed_loop:make_reach"}, "episodes": 2,
                            "seed": 7, "max_steps": 12}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The checkpoint (its record holding the demonstration seeds, as a factory's
    `SupervisedTrainer(demonstration_seeds=...)` puts them) and its artifact."""
    root = tmp_path_factory.mktemp("reach_seeds")

    def with_demonstrations(trainer: Any) -> None:
        trainer.demonstration_seeds = list(DEMONSTRATIONS)

    train_in_process(root / "run", ["trainer.max_updates=2", "trainer.save_every=2",
                                    "trainer.validate_every=0", "trainer.log_every=1"],
                     edit=_reach, before_fit=with_demonstrations)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FACTORIES))
        export_policy(root / "run" / "last.pt", root / "policy.pt2")
    return root / "run" / "last.pt", root / "policy.pt2"


def _refusal(call: Any) -> str:
    with pytest.raises(UsageError) as refused:
        call()
    return " ".join(str(refused.value).split())


def test_export_carries_the_demonstration_seeds_that_eval_then_refuses(
        exported: tuple[Path, Path], tmp_path: Path) -> None:
    """Catches the checkpoint's demonstration seeds read from another key than the one the
    trainer writes: the artifact's provenance would lack them and `eval ARTIFACT --seed 9`
    would judge the policy on its own demonstration (as would `eval CHECKPOINT`)."""
    checkpoint, artifact = exported
    assert runner.read_interface(artifact)["provenance"]["demonstration_seeds"] == \
        DEMONSTRATIONS
    seed_9 = Overrides(seed=9)
    assert REFUSED in _refusal(lambda: check_artifact(artifact, tmp_path / "a", seed_9))
    assert REFUSED in _refusal(lambda: find_target(checkpoint, tmp_path / "c", seed_9, False))


def test_the_seeds_that_eval_episodes_adds_are_checked(exported: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    """Catches the refusal reading the recipe's episode count where `eval --episodes N`
    changes it: the recipe's 2 episodes from seed 7 stop at seed 8, `--episodes 3` runs
    seed 9, a demonstration's; refused for the checkpoint and for its artifact."""
    checkpoint, artifact = exported
    three = Overrides(episodes=3)
    for refused in (lambda: check_artifact(artifact, tmp_path / "a", three),
                    lambda: find_target(checkpoint, tmp_path / "c", three, False)):
        assert "evaluation seeds 7..9 " + REFUSED in _refusal(refused)


def test_an_environment_observing_another_dtype_than_the_artifact_takes_is_refused(
        exported: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the artifact's observation dtype check dropped (only its shape compared):
    an evaluation environment giving float64 where the artifact takes float32 is then left
    to the first act, which fails inside the runner, instead of the refusal naming the key,
    both dtypes and what to do."""
    _, artifact = exported
    interface = runner.read_interface(artifact)
    interface["evaluation"]["env"]["kwargs"] = {"dtype": "float64"}
    monkeypatch.syspath_prepend(str(FACTORIES))  # closed_loop:make_reach
    monkeypatch.setattr(runner, "read_interface", lambda path: interface)
    refused = _refusal(lambda: check_artifact(artifact, tmp_path / "out", Overrides(seed=100)))
    assert "cannot act in its evaluation environment: x is [1] float64, the policy takes " \
        "[1] float32" in refused
