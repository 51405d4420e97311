"""Hostile or careless input, as one table: exit 2, one `error: …` paragraph naming the key or
file, and nothing created or changed (issue 12, design §9)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import CPU_RECIPE, run_cli, snapshot_dir, write_recipe
from tests.support.cli import invoke

GOOD = CPU_RECIPE.read_text()
NERD = Path(__file__).resolve().parents[2] / "examples/learning/nerd/configs/cartpole/sl.train.yaml"


def recipe(tmp: Path, *pairs: tuple[str, str], base: str = GOOD) -> str:
    """The example recipe writing to tmp/out, with textual replacements; returns its path."""
    text = base.replace("outputs/sl_ddp_cpu", str(tmp / "out"))
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp / "r.yaml"
    path.write_text(text)
    return str(path)


def a_file(tmp: Path) -> Path:
    path = tmp / "notes.txt"
    path.write_text("a regular file\n")
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (small) checkpoint: 2 updates of the example recipe."""
    root = tmp_path_factory.mktemp("hostile_ckpt")
    path = write_recipe(root / "r.yaml", root / "run", **{"trainer.max_updates": 2,
                                                          "trainer.save_every": 2})
    proc = run_cli("train-sl", "--config", str(path), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return root / "run" / "step_2.pt"


def a_png(tmp: Path) -> Path:
    path = tmp / "mine.png"
    path.write_bytes(b"not embodichain's")
    return path


def truncated(checkpoint: Path, tmp: Path) -> Path:
    path = tmp / "truncated.pt"
    data = checkpoint.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


Args = Callable[[Path, Path], list[str]]  # (tmp, checkpoint) -> command line

# (id, command line, exit code, what the message must name; "{tmp}" is the test's directory)
CASES: list[tuple[str, Args, int, list[str]]] = [
    ("lr-inf-validate",
     lambda t, c: ["validate-config", recipe(t, ("lr: 0.001", "lr: .inf"))],
     2, ["optimizer.lr", "finite", ".inf"]),
    ("lr-inf-train",
     lambda t, c: ["train-sl", "-c", recipe(t, ("lr: 0.001", "lr: .inf")), "--no-progress"],
     2, ["optimizer.lr", "finite"]),
    ("lr-nan-by-set",
     lambda t, c: ["validate-config", recipe(t), "--set", "optimizer.lr=.nan"],
     2, ["optimizer.lr", ".nan", "--set optimizer.lr=.nan"]),
    ("factory-section-nan",
     lambda t, c: ["validate-config", recipe(t, ("seed: 1234", "seed: -.inf"))],
     2, ["data.seed", "finite"]),
    ("batch-size-true",
     lambda t, c: ["train-sl", "-c", recipe(t, ("batch_size: 32", "batch_size: true")),
                   "--no-progress"],
     2, ["trainer.batch_size", "got true", "not a number"]),
    ("factory-int-true",
     lambda t, c: ["validate-config", recipe(t, ("hidden: 32", "hidden: true"))],
     2, ["model.hidden", "got true"]),
    ("nerd-schema-bool",
     lambda t, c: ["validate-config", str(NERD), "--set", "model.layers=true"],
     2, ["model.layers", "got true"]),
    ("quoted-integer",
     lambda t, c: ["validate-config", recipe(t, ("batch_size: 32", 'batch_size: "32"'))],
     2, ["trainer.batch_size", '"32"']),
    ("max-updates-1e18",
     lambda t, c: ["validate-config", recipe(t, ("max_updates: 200", "max_updates: 1e18"))],
     2, ["trainer.max_updates", '"1e18"', "YAML reads 1e18 as text", "1000000000000000000"]),
    ("output-dir-under-a-file",
     # Tests run as root here, for whom chmod stops no write: a path under a regular file is
     # the unwritable place that every user meets alike.
     lambda t, c: ["train-sl", "-c", recipe(t, (str(t / "out"), str(a_file(t) / "run"))),
                   "--no-progress"],
     2, ["trainer.output_dir", "Not a directory"]),
    ("config-is-a-directory",
     lambda t, c: ["train-sl", "--config", str(t), "--no-progress"],
     2, ["{tmp}", "is a directory"]),
    ("validate-a-directory",
     lambda t, c: ["validate-config", str(t)],
     2, ["{tmp}", "is a directory"]),
    ("resume-a-file",
     lambda t, c: ["resume", str(a_file(t))],
     2, ["notes.txt", "not a run directory"]),
    ("print-config-resume-missing",
     lambda t, c: ["train-sl", "-c", recipe(t), "--print-config", "--resume",
                   str(t / "nosuch.pt")],
     2, ["nosuch.pt"]),
    ("inspect-config-missing",
     lambda t, c: ["inspect-checkpoint", str(c), "--config", str(t / "missing.yaml")],
     2, ["missing.yaml", "file not found"]),
    ("inspect-config-directory",
     lambda t, c: ["inspect-checkpoint", str(c), "--config", str(t)],
     2, ["{tmp}", "is a directory"]),
    # Issue 17: numbers beyond what the code can use, an empty output_dir.
    ("batch-size-1e21",
     lambda t, c: ["train-sl", "-c", recipe(t, ("batch_size: 32",
                                                "batch_size: 1000000000000000000000")),
                   "--no-progress"],
     2, ["trainer.batch_size", "at most 2147483647", "1000000000000000000000"]),
    ("max-updates-beyond-int64",
     lambda t, c: ["validate-config", recipe(t), "--set",
                   "trainer.max_updates=9223372036854775808"],
     2, ["trainer.max_updates", "at most 9223372036854775807", "64-bit"]),
    ("seed-below-int64",
     lambda t, c: ["validate-config", recipe(t, ("seed: 0", "seed: -9223372036854775809"))],
     2, ["seed", "at least -9223372036854775808"]),
    ("output-dir-empty",
     lambda t, c: ["validate-config", recipe(t), "--set", "trainer.output_dir="],
     2, ["trainer.output_dir", "current directory", "--set trainer.output_dir="]),
    # report: a suffix that is not the format's, an existing file
    ("report-out-txt",
     lambda t, c: ["report", str(c.parent), "--out", str(t / "x.txt")],
     2, ["x.txt", ".png", ".html"]),
    ("report-html-as-png",
     lambda t, c: ["report", str(c.parent), "--format", "html", "--out", str(t / "x.png")],
     2, ["x.png", "--format html", ".html"]),
    ("report-existing-out",
     lambda t, c: ["report", str(c.parent), "--out", str(a_png(t))],
     2, ["mine.png", "exists", "--force"]),
    # export: nothing overwritten, no EMA invented, no file named like a checkpoint
    ("export-existing-out",
     lambda t, c: ["export", str(c), str(a_file(t))],
     2, ["notes.txt", "exists", "--force"]),
    ("export-ema-missing",
     lambda t, c: ["export", str(c), str(t / "model.pt"), "--ema"],
     2, ["step_2.pt", "no EMA", "without --ema"]),
    ("export-as-checkpoint-name",
     lambda t, c: ["export", str(c), str(t / "last.pt")],
     2, ["last.pt", "checkpoint's name"]),
    ("export-onto-itself",
     lambda t, c: ["export", str(c), str(c), "--force"],
     2, ["step_2.pt", "the checkpoint itself"]),
    ("export-truncated",
     lambda t, c: ["export", str(truncated(c, t)), str(t / "model.pt")],
     2, ["truncated.pt", "corrupt"]),
    ("inspect-config-invalid",
     lambda t, c: ["inspect-checkpoint", str(c), "--config",
                   recipe(t, ("batch_size: 32", "batch_size: false"))],
     2, ["trainer.batch_size", "got false"]),
]


@pytest.mark.parametrize(("args", "code", "names"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_hostile_input(args: Args, code: int, names: list[str], tmp_path: Path,
                       checkpoint: Path) -> None:
    command = args(tmp_path, checkpoint)
    before, ckpt_before = snapshot_dir(tmp_path), snapshot_dir(checkpoint.parent)
    result = invoke(*command)
    assert result.exit_code == code, result.output
    message = result.stderr
    assert message.startswith("error: "), message
    for name in names:
        name = name.format(tmp=tmp_path)
        assert name in message, (name, message)
    assert "Traceback" not in result.output and "╭" not in result.output
    assert ".tmp" not in message  # never an internal temp file
    assert snapshot_dir(tmp_path) == before, "a refused command changed files"
    assert snapshot_dir(checkpoint.parent) == ckpt_before
    assert not (tmp_path / "out").exists()
