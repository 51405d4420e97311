"""Smaller rough edges a new user met (issue 27.6): `runs` in pipes and its metric column,
the summary under `ema.validate: both`, doubled prefixes and pydantic's wording in
messages, inspect-checkpoint's doubled count, shell completion, `init`'s list of the newer
keys, and the stop line under plain torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import CPU_RECIPE, FACTORIES, run_cli, worker_env, write_recipe
from tests.support.cli import invoke


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny finished runs (validated at every update) below one directory."""
    root = tmp_path_factory.mktemp("round3") / "outputs"
    for name in ("a", "b"):
        recipe = write_recipe(root.parent / f"{name}.yaml", root / name, **{
            "trainer.max_updates": 4, "trainer.validate_every": 1, "trainer.save_every": 0,
            "trainer.log_every": 1, "seed": 0 if name == "a" else 1})
        assert invoke("train-sl", "--config", str(recipe), "--no-progress").exit_code == 0
    return root


def test_runs_json_lines_gives_one_object_per_line(small_runs: Path) -> None:
    """Catches `runs` offering only a pretty-printed array, which `| head -1` cuts open."""
    proc = run_cli("runs", str(small_runs), "--json-lines")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    assert [Path(json.loads(line)["directory"]).name for line in lines] == ["a", "b"]


def test_runs_in_a_pipe_keeps_to_columns_and_shows_the_best(small_runs: Path) -> None:
    """Catches a piped `runs` ignoring COLUMNS (170-column lines), and its metric column
    showing the last value where the summary shows the best."""
    narrow = run_cli("runs", str(small_runs), env=worker_env(COLUMNS="80"))
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80, narrow.stdout
    wide = run_cli("runs", str(small_runs))  # piped, no COLUMNS: whole lines, one per run
    rows = {Path(json.loads(line)["directory"]).name: json.loads(line)
            for line in run_cli("runs", str(small_runs), "--json-lines").stdout.splitlines()}
    for name, row in rows.items():
        assert row["metric_best"] != row["metric_last"] or row["metric_best_step"] == 4
        line = next(line for line in wide.stdout.splitlines() if f"/{name} " in line)
        assert (f"validation/mse {row['metric_best']:.4g} (best, update "
                f"{row['metric_best_step']})") in line
    assert "best metric" in wide.stdout and "metric (last)" not in wide.stdout


def test_the_summary_shows_the_ema_validation_too() -> None:
    """Catches the end-of-run summary leaving out `validation_ema/*` (`ema.validate: both`)."""
    from embodichain.core.observe.summary import metric_figures

    records = [{"step": 1, "train/loss": 1.0, "validation/mse": 0.5, "validation_ema/mse": 0.7},
               {"step": 2, "train/loss": 0.9, "validation/mse": 0.4, "validation_ema/mse": 0.6}]
    figures = {f.key: f for f in metric_figures(records)}
    assert set(figures) == {"train/loss", "validation/mse", "validation_ema/mse"}
    assert (figures["validation_ema/mse"].final, figures["validation_ema/mse"].final_step) \
        == (0.6, 2)


@pytest.mark.parametrize("changes, expected, not_expected", [
    (["optimizer.name=sgd", "optimizer.betas=[0.9,0.99]"],
     "invalid recipe {r}: optimizer.betas: applies to adam and adamw, not sgd",
     "optimizer: optimizer.betas"),
    (["trainer.precision=fp16"], "invalid recipe {r}: trainer.precision: fp16 needs a CUDA",
     "(recipe):"),
    (["optimizer.betas=[0.9]"], "optimizer.betas: expected at least 2 items, got [0.9]",
     "after validation"),
])
def test_messages_name_each_key_once_in_our_words(tmp_path: Path, changes: list[str],
                                                  expected: str, not_expected: str) -> None:
    """Catches `optimizer: optimizer.betas: ...`, `(recipe): trainer.precision: ...` and
    pydantic's "list should have at least 2 items after validation"."""
    args = [a for c in changes for a in ("--set", c)]
    result = invoke("validate-config", str(CPU_RECIPE), *args)
    assert result.exit_code == 2
    assert expected.format(r=CPU_RECIPE) in result.stderr, result.stderr
    assert not_expected not in result.stderr


def test_inspect_counts_the_parameter_tensors_once(small_runs: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches both "parameter tensors 4 in 1 group(s)" and "parameter_tensors 4"."""
    shown = invoke("inspect-checkpoint", str(small_runs / "a" / "last.pt"))
    assert shown.exit_code == 0, shown.output
    assert "4 in 1 group(s)" in shown.stdout and "parameter_tensors" not in shown.stdout
    monkeypatch.syspath_prepend(str(FACTORIES))  # two groups: each says its own count
    recipe = write_recipe(tmp_path / "g.yaml", tmp_path / "g", **{
        "factory": "grouped:build_supervised_trainer", "trainer.max_updates": 1,
        "trainer.save_every": 0, "trainer.validate_every": 0})
    assert invoke("train-sl", "--config", str(recipe), "--no-progress").exit_code == 0
    shown = invoke("inspect-checkpoint", str(tmp_path / "g" / "last.pt"))
    assert "group 0: parameter tensors" in shown.stdout and "parameter_tensors" not in \
        shown.stdout


def _complete(words: str, cwd: Path) -> list[str]:
    env = worker_env(_EMBODICHAIN_COMPLETE="complete_bash", COMP_WORDS=words,
                     COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)))
    # the console script: the completion variable is named after the program
    program = Path(sys.executable).parent / "embodichain"
    proc = subprocess.run([str(program)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    return proc.stdout.split()


def test_shell_completion_completes_names_keys_and_paths(tmp_path: Path) -> None:
    """Catches completion offering nothing for `init NAME`, `--set KEY` or a recipe path."""
    write_recipe(tmp_path / "mine.yaml", tmp_path / "run")
    (tmp_path / "runs").mkdir()
    assert "sl_ddp" in _complete("embodichain init ", tmp_path)
    assert _complete("embodichain init sl_", tmp_path) == ["sl_ddp"]
    assert _complete("embodichain train-sl --config mi", tmp_path) == ["mine.yaml"]
    assert _complete("embodichain train-sl --config mine.yaml --set trainer.data_w",
                     tmp_path) == ["trainer.data_workers="]
    # the factory's own sections, from the recipe being typed
    assert _complete("embodichain validate-config mine.yaml --set mod", tmp_path) == \
        ["model.hidden="]
    assert _complete("embodichain resume ru", tmp_path) == ["runs/"]


def test_init_lists_the_newer_trainer_keys(tmp_path: Path) -> None:
    """Catches `init sl_ddp` mentioning none of accumulation, EMA, data workers, best,
    early stop, async saves; the copy still validates."""
    target = tmp_path / "r.yaml"
    assert invoke("init", "sl_ddp", str(target)).exit_code == 0
    text = target.read_text()
    for key in ("grad_accumulation: 1", "ema: null", "data_workers: 0", "best: null",
                "early_stop: null", "save_best: false", "async_save: true", "keep_last: null"):
        assert f"  # {key}" in text, text
    assert invoke("validate-config", str(target)).exit_code == 0
    # uncommented, the listed defaults are the schema's
    uncommented = text.replace("  # optional, with their defaults:\n", "")
    uncommented = "\n".join(line.replace("  # ", "  ", 1) if line.startswith("  # ") and
                            ": " in line and "loggers" not in line else line
                            for line in uncommented.splitlines())
    (tmp_path / "u.yaml").write_text(uncommented)
    resolved = invoke("validate-config", str(tmp_path / "u.yaml"))
    assert resolved.exit_code == 0, resolved.output


def test_the_stop_line_under_torchrun_names_torchruns_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the clean stop line followed, under plain torchrun, by torchrun's 20-line
    SignalException traceback with nothing saying whose it is."""
    import signal

    from embodichain.core.runs.commands import SELF_LAUNCHED
    from embodichain.core.training.stops import stopped

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv(SELF_LAUNCHED, raising=False)
    alone = str(stopped(signal.SIGINT, 5, 10, Path("run"), 1))
    assert "torchrun" not in alone
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert "the SignalException traceback it may print below is torchrun's own" in \
        str(stopped(signal.SIGINT, 5, 10, Path("run"), 2))
    monkeypatch.setenv(SELF_LAUNCHED, "1")  # self-launched: the launcher prints none
    assert "torchrun" not in str(stopped(signal.SIGINT, 5, 10, Path("run"), 2))


