"""`embodichain eval ARTIFACT`: an exported policy judged in closed loop, as a checkpoint is.

An artifact exported from a run whose recipe has an `evaluation` section carries that
section in its interface; the episodes run in that environment with the same seeds, the
acting policy being `embodichain.core.deploy.runner.PolicyRunner` over the artifact (no
factory, no checkpoint), given the interface's keys of the environment's observations.
Success is the environment's `info["is_success"]` (a factory's own success predicate does
not travel with the artifact). Under torchrun (or `--nproc-per-node`) the episodes are
split over the ranks as a checkpoint's are (R-EVAL-2) and rank 0 writes the results.

What cannot run is refused (exit 2) by rank 0 before any episode (R-EVAL-6): a file that is
not an artifact onnxruntime or torch can load, onnxruntime missing, an environment whose
observations are not the interface's (keys, shapes, dtypes), a policy that cannot act once
on a reset observation (e.g. a chunk shorter than the declared one), seeds among the
demonstration seeds the artifact records, an `--out` that is not new.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from embodichain.core.deploy import runner
from embodichain.core.distributed import process_group
from embodichain.core.errors import UsageError
from embodichain.core.evaluation.admission import (
    check_first_act,
    check_overrides,
    describe,
    describe_interface,
    refuse_demonstration_seeds,
    warn_unknown_seeds,
)
from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation, Overrides
from embodichain.core.evaluation.records import EvaluationResult, summary
from embodichain.core.evaluation.seed_ranges import judged_seeds
from embodichain.core.recipe.evaluation_schema import EvaluationConfig
from embodichain.core.training.model_facts import DEMONSTRATION_SEEDS_UNKNOWN, unknown_seeds

ARTIFACT_SUFFIXES = (".onnx", ".pt2")
DEPLOY_HINT = "pip install 'embodichain-sl[deploy]'"


@dataclass(frozen=True)
class ArtifactTarget:
    """What is evaluated (the names `embodichain eval` prints)."""

    checkpoint: str
    step: int
    out: str


def is_artifact(path: Path) -> bool:
    return path.suffix in ARTIFACT_SUFFIXES and path.is_file()


def read_artifact(path: Path) -> dict[str, Any]:
    """The artifact's interface, opened as the runner opens it; UsageError (exit 2) for a
    file that is not one, or onnxruntime missing (naming the extra)."""
    if not path.is_file():
        raise UsageError(f"{path}: no such exported policy")
    try:
        return runner.read_interface(path)
    except ImportError as exc:
        raise UsageError(f"{path}: {exc}; install it with: {DEPLOY_HINT}") from None
    except (runner.ArtifactError, ValueError) as exc:
        raise UsageError(f"{exc}" if str(path) in str(exc) else f"{path}: {exc}") from None


def check_artifact(path: Path, out: Path | None, overrides: Overrides) -> ArtifactTarget:
    """What rank 0 (or `--nproc-per-node`'s launcher) refuses before anything runs."""
    check_overrides(overrides.episodes, overrides.videos)
    interface = read_artifact(path)
    if interface.get("kind", "policy") != "policy":
        raise UsageError(f"{path} is a {interface.get('kind')}, not a policy")
    config = evaluation_of(interface, path)
    judged, _ = judged_seeds(config, overrides, f"{path}")
    refuse_demonstration_seeds(
        judged.seed, judged.episodes,
        interface.get("provenance", {}).get("demonstration_seeds") or [], f"{path}")
    destination = out if out is not None else path.parent / f"{path.stem}_eval"
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise UsageError(f"--out {destination}: exists and is not an empty directory; name "
                         "another (nothing was overwritten)")
    evaluation = ClosedLoopEvaluation(config, _make_policy(path),
                                      factory=f"the artifact {path}")
    spaces = (evaluation.facts.observation_space, evaluation.facts.action_space)
    _check_observations(spaces[0], interface, path)
    check_first_act(config, _make_policy(path)(None, "cpu"), spaces,
                    describe_interface(interface["observations"]), f"{path}")
    step = int(interface.get("provenance", {}).get("update", 0))
    return ArtifactTarget(str(path), step, str(destination))


def evaluation_of(interface: dict[str, Any], path: Path) -> EvaluationConfig:
    section = interface.get("evaluation")
    if not isinstance(section, dict):
        raise UsageError(f"{path} carries no evaluation section (its run's recipe had none): "
                         "nothing says which environment to run")
    return EvaluationConfig.model_validate(section)


def evaluate_artifact(path: Path, *, out: Path | None = None,
                      overrides: Overrides | None = None, progress: Any = None
                      ) -> tuple[ArtifactTarget, EvaluationResult | None]:
    """Run the artifact's evaluation episodes on every rank (one process, or torchrun);
    rank 0 writes episodes.jsonl, summary.json (and films) into `out` (default: beside the
    artifact, `<name>_eval/`) and returns the result (None elsewhere)."""
    asked = overrides or Overrides()
    found = ArtifactTarget(**process_group.from_rank_zero_before_group(
        "eval/artifact", lambda: asdict(check_artifact(path, out, asked))))
    interface = read_artifact(path)
    config = evaluation_of(interface, path)
    overrides, role = judged_seeds(config, asked, f"{path}")  # the test seeds by default
    unknown = unknown_seeds(interface.get("provenance", {}))
    if process_group.env_rank() == 0:
        warn_unknown_seeds(overrides.seed, overrides.episodes, unknown, f"{path}")
    with process_group.distributed_run("cpu"):
        evaluation = ClosedLoopEvaluation(config, _make_policy(path),
                                          factory=f"the artifact {path}")
        # lockstep, as a checkpoint's eval: rank 0's progress counts every rank's episodes
        result = evaluation.run(None, "cpu", lockstep=True, overrides=overrides,
                                progress=progress)
        world_size = process_group.world_size()
    if result is None:
        return found, None
    result.seed_role = role
    destination = Path(found.out)
    destination.mkdir(parents=True, exist_ok=True)
    result.write(destination / "episodes.jsonl", destination / "videos", destination)
    section = interface["evaluation"]
    about = {"artifact": str(path), "step": found.step,
             "environment": section["env"].get("id") or section["env"].get("constructor"),
             "seed": overrides.seed if overrides.seed is not None else config.seed,
             "weights": interface.get("provenance", {}).get("weights", "model"),
             "world_size": world_size,
             **({DEMONSTRATION_SEEDS_UNKNOWN: unknown} if unknown else {})}
    (destination / "summary.json").write_text(json.dumps(summary(result, about), indent=2)
                                              + "\n")
    return found, result


def _make_policy(path: Path) -> Any:
    return lambda model, device: _InterfaceKeys(runner.PolicyRunner(path))


class _InterfaceKeys:
    """The runner acting on the interface's observation keys of the environment's
    observations (an environment may give more, e.g. cameras the policy does not use), each
    found under its key or, where the environment names it otherwise, at its declared
    `source` (a path of keys, e.g. gym-aloha's ["agent_pos"]; a float array cast to the
    declared dtype, as the checkpoint's policy casts it). The episode's seed reaches the
    runner, which draws a sampler's noise from it (R-DP-3)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def reset(self, env_index: int) -> None:
        self.runner.reset(env_index)

    def seed_episode(self, env_index: int, seed: int) -> None:
        self.runner.seed_episode(env_index, seed)

    def act(self, observations: Any) -> Any:
        if isinstance(observations, dict):
            specs = self.runner.interface["observations"]
            observations = {k: _sourced(observations, k, spec) for k, spec in specs.items()
                            if _found(observations, k, spec) is not None}
        return self.runner.act(observations)


def _found(observations: Any, key: str, spec: dict[str, Any]) -> Any:
    """The environment's entry (an observation or a space) for `key`: under the key, else at
    the spec's `source` path; None where neither is."""
    if key in observations:
        return observations[key]
    found = observations if spec.get("source") else None
    for part in spec.get("source") or []:
        found = getattr(found, "spaces", found)
        found = found.get(part) if isinstance(found, dict) else None
    return found


def _sourced(observations: dict[str, Any], key: str, spec: dict[str, Any]) -> Any:
    import numpy as np

    value = _found(observations, key, spec)
    if key in observations or not np.issubdtype(np.asarray(value).dtype, np.floating):
        return value
    return np.asarray(value).astype(spec["dtype"])


def _check_observations(space: Any, interface: dict[str, Any], path: Path) -> None:
    """Refuse (exit 2) an environment whose observations are not what the artifact takes:
    each of its keys, one step's shape and dtype (a Box for a one-key interface)."""
    wanted = interface["observations"]
    spaces = getattr(space, "spaces", None)
    if not isinstance(spaces, dict):
        spaces = {next(iter(wanted)): space} if len(wanted) == 1 else {}
    problems = []
    for key, spec in wanted.items():
        got = _found(spaces, key, spec)
        if got is None:
            problems.append(f"{key} missing")
            continue
        shape, dtype = list(getattr(got, "shape", None) or []), str(getattr(got, "dtype", ""))
        cast = key not in spaces and dtype.startswith("float") and spec["dtype"].startswith(
            "float")  # a sourced float observation: cast as the checkpoint's policy does
        if shape != spec["shape"] or (dtype != spec["dtype"] and not cast):
            problems.append(f"{key} is {shape} {dtype}, the policy takes {spec['shape']} "
                            f"{spec['dtype']}")
    if problems:
        raise UsageError(f"{path} cannot act in its evaluation environment: "
                         + "; ".join(problems) + f" (the environment gives {describe(space)}; "
                         "evaluate the checkpoint instead)")
