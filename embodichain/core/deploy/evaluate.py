"""`embodichain eval ARTIFACT`: an exported policy judged in closed loop, as a checkpoint is.

An artifact exported from a run whose recipe has an `evaluation` section carries that
section in its interface; the episodes run in that environment with the same seeds, the
acting policy being `embodichain.core.deploy.runner.PolicyRunner` over the artifact (no
factory, no checkpoint), given the interface's keys of the environment's observations.
Success is the environment's `info["is_success"]` (a factory's own success predicate does
not travel with the artifact). One process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodichain.core.deploy import runner
from embodichain.core.errors import UsageError
from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation, Overrides
from embodichain.core.evaluation.records import EvaluationResult, summary
from embodichain.core.recipe.evaluation_schema import EvaluationConfig

ARTIFACT_SUFFIXES = (".onnx", ".pt2")


@dataclass(frozen=True)
class ArtifactTarget:
    """What is evaluated (the names `embodichain eval` prints)."""

    checkpoint: str
    step: int
    out: str


def is_artifact(path: Path) -> bool:
    return path.suffix in ARTIFACT_SUFFIXES and path.is_file()


def evaluate_artifact(path: Path, *, out: Path | None = None,
                      overrides: Overrides | None = None, progress: Any = None
                      ) -> tuple[ArtifactTarget, EvaluationResult]:
    """Run the artifact's evaluation episodes; write episodes.jsonl, summary.json (and
    films) into `out` (default: beside the artifact, `<name>_eval/`)."""
    overrides = overrides or Overrides()
    try:
        interface = runner.read_interface(path)
    except (runner.ArtifactError, ValueError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    section = interface.get("evaluation")
    if not isinstance(section, dict):
        raise UsageError(f"{path} carries no evaluation section (its run's recipe had none): "
                         "nothing says which environment to run")
    if interface.get("kind", "policy") != "policy":
        raise UsageError(f"{path} is a {interface.get('kind')}, not a policy")
    config = EvaluationConfig.model_validate(section)
    destination = out if out is not None else path.parent / f"{path.stem}_eval"
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise UsageError(f"--out {destination}: exists and is not an empty directory; name "
                         "another (nothing was overwritten)")
    step = int(interface.get("provenance", {}).get("update", 0))
    found = ArtifactTarget(str(path), step, str(destination))
    evaluation = ClosedLoopEvaluation(
        config, lambda model, device: _InterfaceKeys(runner.PolicyRunner(path)),
        factory=f"the artifact {path}")
    _check_observations(evaluation.facts.observation_space, interface, path)
    result = evaluation.run(None, "cpu", lockstep=False, overrides=overrides,
                            progress=progress)
    assert result is not None  # one process: rank 0
    destination.mkdir(parents=True, exist_ok=True)
    result.write(destination / "episodes.jsonl", destination / "videos", destination)
    about = {"artifact": str(path), "step": step,
             "environment": section["env"].get("id") or section["env"].get("constructor"),
             "seed": overrides.seed if overrides.seed is not None else config.seed,
             "weights": interface.get("provenance", {}).get("weights", "model"),
             "world_size": 1}
    (destination / "summary.json").write_text(json.dumps(summary(result, about), indent=2)
                                              + "\n")
    return found, result


class _InterfaceKeys:
    """The runner acting on the interface's observation keys of the environment's
    observations (an environment may give more, e.g. cameras the policy does not use)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def reset(self, env_index: int) -> None:
        self.runner.reset(env_index)

    def act(self, observations: Any) -> Any:
        if isinstance(observations, dict):
            keys = self.runner.observation_keys
            observations = {k: v for k, v in observations.items() if k in keys}
        return self.runner.act(observations)


def _check_observations(space: Any, interface: dict[str, Any], path: Path) -> None:
    """Refuse (exit 2) an environment whose observations are not what the artifact takes:
    each of its keys, one step's shape and dtype (a Box for a one-key interface)."""
    wanted = interface["observations"]
    spaces = getattr(space, "spaces", None)
    if not isinstance(spaces, dict):
        spaces = {next(iter(wanted)): space} if len(wanted) == 1 else {}
    problems = []
    for key, spec in wanted.items():
        got = spaces.get(key)
        if got is None:
            problems.append(f"{key} missing")
            continue
        shape, dtype = list(getattr(got, "shape", None) or []), str(getattr(got, "dtype", ""))
        if shape != spec["shape"] or dtype != spec["dtype"]:
            problems.append(f"{key} is {shape} {dtype}, the policy takes {spec['shape']} "
                            f"{spec['dtype']}")
    if problems:
        raise UsageError(f"{path} cannot act in its evaluation environment: "
                         + "; ".join(problems) + " (evaluate the checkpoint instead)")
