"""Facts read from a run directory without torch: its snapshots in step order, the step a
checkpoint holds, and the command that continues the run the way it was launched."""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def snapshot_names(directory: Path) -> list[str]:
    """`step_N.pt` ordered by N (never by name: step_20 before step_100), then last/best."""
    steps = sorted((int(m.group(1)), p.name) for p in directory.glob("step_*.pt")
                   if (m := _STEP_FILE.match(p.name)))
    extra = [n for n in ("last.pt", "best.pt") if (directory / n).is_file()]
    return [name for _, name in steps] + extra


class _Inert:
    """Stands in for every non-builtin global while reading a checkpoint's manifest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _ManifestUnpickler(pickle.Unpickler):
    """Reads torch.save's pickle without torch and without running anything from the file:
    tensors, storages and dtypes all become inert placeholders."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        return _Inert

    def persistent_load(self, pid: Any) -> None:
        return None


def checkpoint_step(path: Path) -> int | None:
    """The step in a checkpoint's manifest, read without torch; None if unreadable."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            data = archive.read(name)
        step = _ManifestUnpickler(io.BytesIO(data)).load()["manifest"]["step"]
        return step if isinstance(step, int) else None
    except Exception:  # damaged or foreign file: the table shows no step for it
        return None


SELF_LAUNCHED = "EMBODICHAIN_SELF_LAUNCHED"  # set for workers started by --nproc-per-node


def command_for(args: str, world_size: int | None) -> str:
    """`embodichain ARGS` as this run's workers must be started again: in one process, or
    the way this run was launched (self-launch, torchrun on one node or on several).

    `world_size` is the run's, which may differ from this launch's (a refused resume names
    the launch that fits the run, not the one that was refused).
    """
    if not world_size or world_size <= 1:
        return f"embodichain {args}"
    if os.environ.get(SELF_LAUNCHED):
        return f"embodichain {args} --nproc-per-node {world_size}"
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
    if nodes > 1:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if nodes * per_node != world_size:  # this launch does not fit the run
            return (f"torchrun with --nnodes x --nproc-per-node = {world_size} workers (and "
                    f"this job's rendezvous options, on every node) -m embodichain {args}")
        return (f"torchrun --nnodes={nodes} --nproc-per-node={per_node} (and this job's "
                f"rendezvous options, on every node) -m embodichain {args}")
    return (f"OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node={world_size} "
            f"-m embodichain {args}")


def resume_command(directory: Path | str, world_size: int | None) -> str:
    """The exact command that continues `directory` in place with `world_size` workers."""
    return command_for(f"resume {directory}", world_size)


def fresh_command(checkpoint: Path, directory: Path, recipe: str | None = None,
                  world_size: int | None = None) -> str:
    """The command that resumes `checkpoint` (of `world_size` workers) into a fresh directory
    beside `directory`."""
    return command_for(f"train-sl --config {recipe or 'RECIPE.yaml'} --resume {checkpoint} "
                       f"--set trainer.output_dir={directory}_resumed", world_size)


def planned_updates(run_json: dict[str, Any]) -> int | None:
    """The run's `trainer.max_updates` now: the newest resume's (`--set
    trainer.max_updates=N` raises it), else the recipe's that started the run."""
    for event in reversed(run_json.get("events") or []):
        if isinstance(event, dict) and event.get("event") == "resumed" \
                and isinstance(event.get("max_updates"), int):
            return event["max_updates"]
    trainer = (run_json.get("config") or {}).get("trainer") or {}
    value = trainer.get("max_updates")
    return value if isinstance(value, int) else None
