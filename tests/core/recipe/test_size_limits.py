"""Size-like keys: what no machine can serve is refused before anything starts, what this
machine cannot serve too, a large but possible value is warned about once (issue: a
`trainer.data_workers: 100000` that forked until the OOM killer came).

No test here forks or allocates what it guards against: refusals are asserted on a recipe
whose source is in memory (today's code would train it without a worker), or under a small
process limit, and the machine's facts are injected where the check is a function.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from embodichain.core.errors import ConfigError
from embodichain.core.recipe.limits import MAX_DATA_WORKERS
from embodichain.core.recipe.loading import check_recipe, load_recipe
from embodichain.core.recipe.machine_limits import WORKER_BYTES, Machine, machine_verdict
from tests.support import FACTORIES, REPO, worker_env, write_recipe

GB = 10**9


def _config(tmp_path: Path, **changes: object):
    return load_recipe(write_recipe(tmp_path / "r.yaml", tmp_path / "run", **changes)).config


def _problems(tmp_path: Path, **changes: object) -> list[str]:
    import yaml
    raw = yaml.safe_load(write_recipe(tmp_path / "r.yaml", tmp_path / "run", **changes)
                         .read_text())
    return check_recipe(raw).problems


def test_fixed_ceilings_refuse_what_no_machine_can_serve(tmp_path: Path) -> None:
    """Catches `data_workers: 100000` and an update of 10^10 indices validating: they were
    refused only by the machine (the OOM killer, a C++ error from torch.randint)."""
    problems = _problems(tmp_path, **{"trainer.data_workers": 100000})
    assert problems == [f"trainer.data_workers: expected at most {MAX_DATA_WORKERS} (one "
                        "process each, per rank), got 100000"]
    problems = _problems(tmp_path, **{"trainer.batch_size": 100000,
                                      "trainer.grad_accumulation": 100000})
    assert len(problems) == 1 and problems[0].startswith("trainer.grad_accumulation:")
    assert "100000 x 100000 = 10000000000" in problems[0] and "2147483647" in problems[0]
    assert not _problems(tmp_path, **{"trainer.data_workers": MAX_DATA_WORKERS})
    # float32 cannot take an EMA step below 2^-24: the average would never move
    assert _problems(tmp_path, **{"trainer.ema": {"decay": 0.99999999}})[0].startswith(
        "trainer.ema.decay: expected at most")


def test_machine_limits_refuse_and_warn_by_the_machine_given(tmp_path: Path) -> None:
    """Catches a machine-dependent size (processes, memory, CPUs) going unchecked: each
    case against an injected machine, so nothing is forked or allocated."""
    small = Machine(cpus=2, process_limit=50, memory_bytes=4 * GB)
    verdict = machine_verdict(_config(tmp_path, **{"trainer.data_workers": 60}), 1, small)
    assert len(verdict.problems) == 1 and "exceed the 50 processes" in verdict.problems[0]
    assert verdict.problems[0].startswith("trainer.data_workers: 60 worker processes")
    # two ranks per node double the processes
    verdict = machine_verdict(_config(tmp_path, **{"trainer.data_workers": 30}), 2, small)
    assert "60 worker processes (30 per rank x 2 ranks)" in verdict.problems[0]
    fits = 4 * GB // WORKER_BYTES
    verdict = machine_verdict(_config(tmp_path, **{"trainer.data_workers": fits + 1}), 1,
                              Machine(cpus=2, memory_bytes=4 * GB))
    assert f"at most {fits} per rank fit" in verdict.problems[0]
    verdict = machine_verdict(_config(tmp_path, **{"trainer.data_workers": 3}), 1, small)
    assert not verdict.problems and len(verdict.warnings) == 1
    assert "3 worker processes on the 2 CPUs" in verdict.warnings[0]
    assert machine_verdict(_config(tmp_path, **{"trainer.data_workers": 2}), 1, small) \
        .warnings == []
    verdict = machine_verdict(_config(tmp_path, **{"trainer.data_workers": 2,
                                                   "trainer.prefetch": 10**9}), 1, small)
    assert verdict.problems[0].startswith("trainer.prefetch: 2 workers x prefetch 1000000000")
    verdict = machine_verdict(_config(tmp_path, **{"trainer.batch_size": 2**30,
                                                   "trainer.grad_accumulation": 1}), 1, small)
    assert verdict.problems[0].startswith("trainer.grad_accumulation: an update draws")


def test_the_machine_limits_accept_exactly_what_fits(tmp_path: Path) -> None:
    """Catches an off-by-one at each machine limit: `workers >= process_limit` (50 workers
    under a limit of 50 refused) and `>=` against the memory (the workers that exactly fill
    it refused); one more is refused in each case, per rank counted (25 x 2 ranks at 50).
    The machine is injected: nothing is forked."""
    at_limit = Machine(cpus=64, process_limit=50)
    for workers, ranks in ((50, 1), (25, 2)):
        verdict = machine_verdict(_config(tmp_path, **{"trainer.data_workers": workers}),
                                  ranks, at_limit)
        assert verdict.problems == [], (workers, ranks)
    for workers, ranks in ((51, 1), (26, 2)):
        verdict = machine_verdict(_config(tmp_path, **{"trainer.data_workers": workers}),
                                  ranks, at_limit)
        assert len(verdict.problems) == 1 and "exceed the 50 processes" in verdict.problems[0]
    filled = Machine(cpus=64, memory_bytes=40 * WORKER_BYTES)
    assert machine_verdict(_config(tmp_path, **{"trainer.data_workers": 40}), 1,
                           filled).problems == []
    over = machine_verdict(_config(tmp_path, **{"trainer.data_workers": 41}), 1, filled)
    assert len(over.problems) == 1 and "at most 40 per rank fit" in over.problems[0]


def test_train_sl_and_validate_config_refuse_before_anything_starts(tmp_path: Path) -> None:
    """Catches `train-sl` starting a run for a size that is refused (the recipe's source is
    in memory, so the old code trained it without forking: exit 0, a run directory)."""
    from tests.support.cli import invoke

    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 2,
                                                       "trainer.data_workers": 100000})
    for command in (["validate-config", str(recipe)],
                    ["train-sl", "--config", str(recipe), "--no-progress"]):
        result = invoke(*command)
        assert result.exit_code == 2, result.output
        assert "trainer.data_workers: expected at most 1024" in result.stderr
        assert not run.exists()


def test_nproc_per_node_counts_its_ranks_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches `train-sl --nproc-per-node 2` checking the machine for one rank (the
    option's ranks not counted), and `resume --nproc-per-node 2` launching its workers
    without checking at all (each worker refused only after the launch): under a process
    limit of 5, 3 workers per rank fit once (a one-process run trains) but not twice, so
    both commands must refuse (exit 2) before the launcher is called, with no run directory
    created or changed. The limit is the one the check reads from this machine, set to 5;
    the launcher is replaced by a recorder, so the bugs launch nothing either."""
    from embodichain.core.launch import self_launch
    from embodichain.core.recipe import machine_limits
    from tests.support.cli import invoke

    monkeypatch.setattr(machine_limits, "_process_limit", lambda: 5)
    launched: list[tuple] = []
    monkeypatch.setattr(self_launch, "launch", lambda *a: launched.append(a) or 0)
    run, other = tmp_path / "run", tmp_path / "other"
    recipe = str(write_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 2,
                                                           "trainer.data_workers": 3}))
    once = invoke("train-sl", "--config", recipe, "--no-progress")  # one rank: it fits
    assert once.exit_code == 0, once.output
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    refused = "trainer.data_workers: 6 worker processes (3 per rank x 2 ranks) exceed the 5 "
    for command in (["train-sl", "--config", recipe, "--set", f"trainer.output_dir={other}"],
                    ["resume", str(run)]):
        twice = invoke(*command, "--nproc-per-node", "2", "--no-progress")
        assert twice.exit_code == 2, twice.output
        assert refused in twice.stderr and "Nothing was started" in twice.stderr
    assert launched == [] and not other.exists()
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before


def _limited(nproc: int | None, cpus: int | None):
    """A child under a small process limit and/or on few CPUs."""
    def apply() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cpus]))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    return apply


@pytest.mark.slow  # a few seconds: kept out of the quick loop
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity and rlimits")
def test_a_process_limit_refuses_data_workers_and_many_cpus_warn_once(tmp_path: Path) -> None:
    """Catches data workers allowed beyond the user's process limit (`ulimit -u` 40: 60
    workers are refused, exit 2, no run directory; the recipe's source is in memory, so a
    broken check forks nothing), and the warning for more workers than CPUs shown more than
    once (the trainer's and the start's) or not at all (2 workers of a DatasetSource on 1
    CPU)."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 2,
                                                       "trainer.data_workers": 60})
    # Fresh, not warm: the limits are set in the child itself before it starts (preexec_fn).
    proc = subprocess.run([sys.executable, "-m", "embodichain", "train-sl", "--config",
                           str(recipe), "--no-progress"], env=worker_env(), text=True,
                          capture_output=True, timeout=120, preexec_fn=_limited(40, None))
    assert proc.returncode == 2, proc.stderr
    assert "trainer.data_workers: 60 worker processes exceed the 40 processes" in proc.stderr
    assert "Nothing was started" in proc.stderr and not run.exists()
    proc = subprocess.run([sys.executable, "-m", "embodichain", "train-sl", "--config",
                           str(recipe), "--no-progress", "--set", "trainer.data_workers=2",
                           "--set", "factory=augmenting:build_supervised_trainer"],
                          env=worker_env(PYTHONPATH=os.pathsep.join([str(FACTORIES),
                                                                     str(REPO)])),
                          text=True, capture_output=True, timeout=300,
                          preexec_fn=_limited(None, 1))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning: trainer.data_workers") == 1, proc.stderr
    assert "2 worker processes on the 1 CPUs" in proc.stderr


def test_keys_without_effect_are_warned_about(tmp_path: Path) -> None:
    """Catches a key that cannot take effect being ignored silently."""
    def warnings(**changes: object) -> tuple[str, ...]:
        return load_recipe(write_recipe(tmp_path / "r.yaml", tmp_path / "run", **changes)
                           ).warnings

    assert warnings() == ()
    assert warnings(**{"trainer.prefetch": 4})[0].startswith("trainer.prefetch: 4 has no effect")
    assert warnings(**{"trainer.save_every": 0, "trainer.keep_last": 3})[0].startswith(
        "trainer.keep_last: 3 has no effect")
    assert "never act" in warnings(**{"trainer.save_best": True,
                                      "trainer.validate_every": 500})[0]
    assert "the run never stops early" in warnings(
        **{"trainer.early_stop": {"patience": 10}})[0]
    assert "stays close to the initial weights" in warnings(
        **{"trainer.ema": {"decay": 0.9999}})[0]
    assert "never reaches optimizer.lr" in warnings(
        **{"scheduler": {"name": "linear", "warmup_updates": 1000}})[0]
    with pytest.raises(ConfigError, match="trainer.save_best: best.pt is written at a "
                       "validation"):
        load_recipe(write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                                 **{"trainer.save_best": True, "trainer.validate_every": 0}))
