"""Closed-loop evaluation in training and by `embodichain eval` (R-EVAL-1..3).

The recipe is tests/factories/closed_loop.py: a pure-Python gymnasium environment (`Reach`)
and a linear policy whose acting weights are fixed (`data.policy_weight`), so one, two
ranks, DDP and FSDP all act with the same weights bitwise; the episodes' outcomes must then
be the same, record for record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import assert_ok, factories_env, run_cli, run_torchrun
from tests.support.shared import built_once

EPISODES = 7  # odd: 2 ranks hold 4 and 3 (contiguous blocks of 7 // 2 would lose one)


def write(path: Path, output_dir: Path, *, evaluation: dict | None = None,
          data: dict | None = None, trainer: dict | None = None) -> Path:
    """A closed_loop recipe: 4 updates, validation (and the closed loop) at 2 and 4."""
    recipe = {
        "factory": "closed_loop:build_supervised_trainer", "seed": 0,
        "trainer": {"batch_size": 8, "max_updates": 4, "validate_every": 2, "save_every": 4,
                    "log_every": 2, "output_dir": str(output_dir), **(trainer or {})},
        "optimizer": {"name": "adam", "lr": 0.01},
        "data": {"policy_weight": -1.0, **(data or {})},
        "evaluation": {"env": {"constructor": "closed_loop:make_reach"},
                       "episodes": EPISODES, "seed": 100, "max_steps": 8,
                       "envs_per_rank": 2, "videos": 2, **(evaluation or {})}}
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def validation_lines(run: Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("validation/")}
            for r in lines if "validation/success_rate" in r}


@pytest.fixture(scope="module")
def world_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The recipe trained by 1 and 2 ranks under DDP and FSDP (shared, read-only); the
    one-process DDP run also logs to TensorBoard, and each run counts its policy calls."""
    def build(root: Path) -> dict[str, str]:
        runs = {}
        for strategy in ("ddp", "fsdp"):
            for ranks in (1, 2):
                name = f"{strategy}{ranks}"
                acts = root / f"{name}-acts"
                acts.mkdir()
                loggers = ["jsonl", "tensorboard"] if name == "ddp1" else ["jsonl"]
                recipe = write(root / f"{name}.yaml", root / name,
                               trainer={"strategy": strategy, "loggers": loggers},
                               data={"acts_log": str(acts)})
                args = ("train-sl", "--config", str(recipe), "--no-progress")
                assert_ok(run_torchrun(*args, env=factories_env()) if ranks == 2
                          else run_cli(*args, env=factories_env()))
                runs[name] = str(root / name)
        return runs
    return built_once(tmp_path_factory, "closed-loop-worlds", build)


@pytest.mark.slow
def test_outcomes_do_not_depend_on_world_size_or_strategy(world_runs: dict[str, str]) -> None:
    """Catches: a seed derived from the rank or the slot (records differ on 2 ranks), rank 0
    alone evaluating (episodes missing), episodes split in contiguous blocks (the odd one
    lost on 2 ranks), records merged out of order, a rank whose episodes ended skipping
    forwards under FSDP (its peer hangs or the counts differ), a policy batch that changes
    shape with the world size, and the return or length metrics summed, not averaged."""
    runs = {name: Path(path) for name, path in world_runs.items()}
    reference = runs["ddp1"]
    for step in (2, 4):
        expected = records(reference / "evaluations" / f"update_{step:06d}.jsonl")
        assert [r["episode"] for r in expected] == list(range(EPISODES))
        assert [r["seed"] for r in expected] == [100 + e for e in range(EPISODES)]
        assert {r["success"] for r in expected} == {True, False}  # a mix, so it can differ
        for name, run in runs.items():
            assert records(run / "evaluations" / f"update_{step:06d}.jsonl") == expected, name
    metrics = validation_lines(reference)
    assert set(metrics) == {2, 4}
    assert metrics[4]["validation/success_rate"] == pytest.approx(5 / 7)
    for step in (2, 4):  # the means of the records, not their sums
        found = records(reference / "evaluations" / f"update_{step:06d}.jsonl")
        assert metrics[step]["validation/return"] == \
            pytest.approx(sum(r["return"] for r in found) / EPISODES)
        assert metrics[step]["validation/episode_length"] == \
            pytest.approx(sum(r["length"] for r in found) / EPISODES)
    for name, run in runs.items():
        assert validation_lines(run) == metrics, name
    # Under FSDP the forward is collective: both ranks called the policy equally often.
    counts = [len((Path(world_runs["fsdp2"] + "-acts") / f"rank{r}.txt").read_text().split())
              for r in (0, 1)]
    assert counts[0] == counts[1] > 0


@pytest.mark.slow
def test_first_episodes_are_filmed(world_runs: dict[str, str]) -> None:
    """Catches: films of other episodes than the first K by index, a film missing frames
    (the reset's or the last step's), and films that do not reach TensorBoard."""
    from embodichain.core.evaluation.video import decode_frames

    run = Path(world_runs["ddp1"])
    for name in ("ddp1", "fsdp2"):
        films = sorted((Path(world_runs[name]) / "evaluations" / "update_000004").iterdir())
        assert [f.name for f in films] == ["episode_0000.mp4", "episode_0001.mp4"]
    for record in records(run / "evaluations" / "update_000004.jsonl"):
        if record["episode"] < 2:
            frames = decode_frames(str(run / record["video"]))
            assert len(frames) == record["frames"] == record["length"] + 1
            assert frames[0].shape == (8, 24, 3)
        else:
            assert "video" not in record and "frames" not in record
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert {"evaluation/episode_0", "evaluation/episode_1"} <= set(events.Tags()["images"])
    assert [e.step for e in events.Images("evaluation/episode_0")] == [2, 4]


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_faults_fail_their_episode_only(tmp_path: Path, vector: str) -> None:
    """An environment raising at step 3 of episode 2, one returning NaN (episode 3), one
    sleeping past the wall-clock limit (episode 4; async: a step that never returns in
    time, cut off): those episodes fail with their reasons, the others succeed and the run
    finishes. Catches: a fault ending the evaluation or the run, a slot not rebuilt after
    its fault (the next episode in it fails too), and a hung step waited for."""
    sleep = {"sync": 0.4, "async": 60.0}[vector]
    recipe = write(tmp_path / "faults.yaml", tmp_path / "run",
                   data={"policy_weight": -1.5},
                   trainer={"max_updates": 2, "save_every": 2},
                   evaluation={"vector": vector, "videos": 0, "episode_timeout_s": 1.0,
                               "max_steps": 30, "env": {
                                   "constructor": "closed_loop:make_reach",
                                   "kwargs": {"raise_at": 102, "nan_at": 103,
                                              "sleep_at": 104, "sleep_s": sleep}}})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress",
                      env=factories_env()))
    found = records(tmp_path / "run" / "evaluations" / "update_000002.jsonl")
    failures = {r["episode"]: r["failure"] for r in found}
    assert "RuntimeError: the simulator broke at step 3" in failures[2]
    assert found[2]["length"] == 2  # the failed step is not counted
    assert failures[3] == "non-finite observation"
    assert failures[4].startswith("timeout")
    assert [r["success"] for r in found] == [True, True, False, False, False, True, True]
    assert all(failures[e] is None for e in (0, 1, 5, 6))
    assert validation_lines(tmp_path / "run")[2]["validation/episode_failures"] == 3
    if vector == "sync":  # `eval --videos` where nothing can render: refused before it runs
        for launch in ([], ["--nproc-per-node", "2"]):  # (there: before any worker starts)
            proc = run_cli("eval", str(tmp_path / "run"), "--videos", "1", *launch, "--out",
                           str(tmp_path / "films"), env=factories_env(REACH_NO_GL="1"))
            said = " ".join(proc.stderr.split())
            assert proc.returncode == 2, said  # one message, not one per worker and torchrun's
            assert said.count("--videos: episodes are to be filmed") == 1, said
            assert "MUJOCO_GL" in said and "(--videos 0)" in said and "Traceback" not in said
            assert not (tmp_path / "films").exists()


@pytest.mark.slow
def test_eval_of_a_checkpoint_equals_its_validation(world_runs: dict[str, str],
                                                    tmp_path: Path) -> None:
    """`eval` of the two-rank FSDP run's step_4 snapshot, in one process: the records and
    metrics of the validation at update 4. Catches: eval loading other weights (the EMA's,
    the initialisation), another seed or episode split, or its own batching."""
    run = Path(world_runs["fsdp2"])
    out = tmp_path / "eval"
    proc = run_cli("eval", str(run / "step_4.pt"), "--out", str(out), "--no-progress",
                   env=factories_env())
    assert_ok(proc)
    assert "validation/success_rate" in proc.stdout
    expected = records(run / "evaluations" / "update_000004.jsonl")
    got = records(out / "episodes.jsonl")
    assert [{k: v for k, v in r.items() if k != "video"} for r in got] == \
        [{k: v for k, v in r.items() if k != "video"} for r in expected]
    assert [r.get("video") for r in got[:2]] == ["videos/episode_0000.mp4",
                                                 "videos/episode_0001.mp4"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 4 and summary["world_size"] == 1
    assert summary["seed_role"] == "validation"  # no test_seed: said, not passed off as test
    assert summary["metrics"] == validation_lines(run)[4]
    # Refused by name (exit 2), nothing overwritten: the same --out again; --ema without EMA.
    before = (out / "summary.json").read_bytes()
    for args, message in ((["--out", str(out)], f"--out {out}: exists"),
                          (["--ema", "--out", str(tmp_path / "ema")], "--ema: the run of")):
        proc = run_cli("eval", str(run), *args, env=factories_env())
        assert proc.returncode == 2 and message in " ".join(proc.stderr.split()), proc.stderr
    assert (out / "summary.json").read_bytes() == before
    assert not (tmp_path / "ema").exists()


@pytest.fixture(scope="module")
def ema_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The EMA's weights acting (`acting: ema`), the acting layer trained (so the EMA and the
    model differ), by 2 ranks under DDP and FSDP; and `eval` of the FSDP run's step_4 in one
    process (which loads the saved EMA into the model)."""
    def build(root: Path) -> dict[str, str]:
        runs = {}
        for strategy in ("ddp", "fsdp"):
            recipe = write(root / f"{strategy}.yaml", root / strategy,
                           data={"policy_weight": None}, evaluation={"acting": "ema"},
                           trainer={"strategy": strategy, "ema": {"decay": 0.5}})
            assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                                   env=factories_env()))
            runs[strategy] = str(root / strategy)
        assert_ok(run_cli("eval", str(root / "fsdp" / "step_4.pt"), "--out",
                          str(root / "eval"), "--no-progress", env=factories_env()))
        runs["eval"] = str(root / "eval")
        return runs
    return built_once(tmp_path_factory, "closed-loop-ema", build)


def without_video(found: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "video"} for r in found]


@pytest.mark.slow
def test_the_emas_weights_act_under_ddp_and_fsdp(ema_runs: dict[str, str]) -> None:
    """`acting: ema` on 2 ranks: the policy is given a module of the model's own class (the
    factory's policy refuses anything else) holding the EMA's weights, under DDP and FSDP.
    Catches: FSDP handing the policy the sharded EMA's call-only view (ALOHA: no
    `act_chunk`, exit 1), the model's own weights acting instead of the EMA's (the records
    differ from `eval`'s of the saved EMA), and the model left holding the EMA's weights
    after the evaluation (training goes on from them: the FSDP run's EMA and losses
    differ from DDP's)."""
    evaluated = records(Path(ema_runs["eval"]) / "episodes.jsonl")
    assert json.loads((Path(ema_runs["eval"]) / "summary.json").read_text())["weights"] == "ema"
    for strategy in ("ddp", "fsdp"):
        run = Path(ema_runs[strategy])
        assert without_video(records(run / "evaluations" / "update_000004.jsonl")) == \
            without_video(evaluated), strategy
    losses = {s: [r["train/loss"] for r in (json.loads(x) for x in (Path(ema_runs[s]) /
              "metrics.jsonl").read_text().splitlines()) if "train/loss" in r]
              for s in ("ddp", "fsdp")}
    assert losses["ddp"] == pytest.approx(losses["fsdp"], rel=1e-5) and len(losses["ddp"]) == 2


def test_eval_refuses_bad_input_by_name(tmp_path: Path, sl_ddp_one_process: Path) -> None:
    """Each refusal exits 2 naming what is wrong, and writes nothing. Catches: a traceback
    (exit 1) instead, or an evaluation started without a section to say what to run."""
    cases = [
        (["eval", str(tmp_path / "missing")], "no such checkpoint file or run directory"),
        (["eval", str(sl_ddp_one_process)], "has no evaluation section"),
        (["eval", str(sl_ddp_one_process / "last.pt"), "--episodes", "0"], "--episodes"),
        (["eval", str(tmp_path)], "is a directory without a snapshot"),
    ]
    for args, message in cases:
        proc = run_cli(*args, env=factories_env())
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in " ".join(proc.stderr.split()), (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_a_policy_that_cannot_act_on_the_observations_is_refused_before_training(
        tmp_path: Path) -> None:
    """R-EVAL-6: the policy acts once on a reset observation when the run starts. An
    environment observing 2 numbers where the policy's layer takes 1: train-sl exits 2
    naming both sides (the environment's [2] float32, the error), and nothing is trained or
    claimed. Catches the misfit found only at the first validation (exit 1 after training
    for a while)."""
    recipe = write(tmp_path / "bad.yaml", tmp_path / "run",
                   evaluation={"env": {"constructor": "closed_loop:make_reach",
                                       "kwargs": {"dim": 2}}})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", env=factories_env())
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr
    assert "cannot act on the environment's observations" in said, said
    assert "the environment gives [2] float32" in said and "Traceback" not in said
    assert not (tmp_path / "run" / "run.json").exists()


def test_an_environment_that_cannot_be_built_is_refused_before_training(tmp_path: Path
                                                                         ) -> None:
    """An unknown gymnasium id: train-sl and validate-config --build exit 2 naming it, and
    no run directory is claimed. Catches: the env built only at the first validation
    (a run that fails after training for a while)."""
    recipe = write(tmp_path / "bad.yaml", tmp_path / "run",
                   evaluation={"env": {"id": "NoSuchEnv-v0"}})
    for args in (["train-sl", "--config", str(recipe), "--no-progress"],
                 ["validate-config", str(recipe), "--build"]):
        proc = run_cli(*args, env=factories_env())
        assert proc.returncode == 2, proc.stderr
        assert "evaluation.env: 'NoSuchEnv-v0'" in " ".join(proc.stderr.split())
    assert not (tmp_path / "run" / "run.json").exists()
    # Films asked for where the environment cannot render (R-EVAL-5): refused at the start,
    # naming MUJOCO_GL and the fix, not a run whose every film goes missing.
    recipe = write(tmp_path / "films.yaml", tmp_path / "run")
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress",
                   env=factories_env(REACH_NO_GL="1"))
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "evaluation.videos: episodes are to be filmed" in said
    assert "REACH_NO_GL is set" in said and "MUJOCO_GL=egl" in said, said
    assert not (tmp_path / "run" / "run.json").exists()
    # The EMA asked to act in a run that keeps none: the recipe itself is refused.
    recipe = write(tmp_path / "ema.yaml", tmp_path / "run", evaluation={"acting": "ema"})
    proc = run_cli("validate-config", str(recipe), env=factories_env())
    assert proc.returncode == 2 and "evaluation.acting: ema needs trainer.ema" in \
        " ".join(proc.stderr.split()), proc.stderr
