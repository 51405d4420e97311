"""What a rank says when training hangs (R-OPS-1): its stack, where it is, and the message
that names the ranks that did not arrive (see hang_watch for when it is said)."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

HANG_DIR = "hang"
# Where a main thread waits when it has reached a collective and waits in it: torch's
# collectives, DDP's all-reduce inside backward, an FSDP gather.
COLLECTIVE_MODULES = ("torch/distributed/", "torch/autograd/", "torch/nn/parallel/")
DATA_LOADER = "torch/utils/data/"  # a main thread here waits for its data workers


def stack_file(directory: Path, rank: int) -> Path:
    return directory / HANG_DIR / f"rank_{rank}.txt"


def short_path(path: str) -> str:
    """`path` from its package on (torch/..., embodichain/...), not the machine's prefix."""
    for root in sorted((p for p in sys.path if p), key=len, reverse=True):
        with contextlib.suppress(ValueError):
            if os.path.commonpath([path, root]) == root:
                return os.path.relpath(path, root)
    return path


def _frame_text(frame: FrameType) -> str:
    return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def position(thread: int | None) -> dict[str, str]:
    """Where the thread `thread` is: its innermost frame and, when that one is not ours,
    the innermost frame of embodichain that led there ("" when none)."""
    frame = sys._current_frames().get(thread) if thread is not None else None
    if frame is None:
        return {"at": "an unknown place (the thread has no Python frame)", "from": ""}
    at, caller = _frame_text(frame), ""
    walk: FrameType | None = frame
    while walk is not None and not caller:
        if "embodichain" in short_path(walk.f_code.co_filename).split(os.sep)[0]:
            caller = _frame_text(walk) if walk is not frame else ""
            break
        walk = walk.f_back
    return {"at": at, "from": caller}


def describe(where: Mapping[str, str]) -> str:
    return where["at"] + (f" (called from {where['from']})" if where.get("from") else "")


def stack_text(header: str, main_thread: int | None) -> str:
    """`header`, the main thread's stack with its source lines, then every thread's stack as
    faulthandler writes it (it needs a file: a temporary one)."""
    frame = sys._current_frames().get(main_thread) if main_thread is not None else None
    main = "".join(traceback.format_stack(frame)) if frame is not None else "(none)\n"
    del frame
    with tempfile.TemporaryFile(mode="w+") as dump:
        dump.write(f"{header}\n\nThe main thread (0x{main_thread or 0:016x}), most recent "
                   f"call last:\n{main}\nEvery thread (faulthandler):\n")
        dump.flush()
        faulthandler.dump_traceback(dump, all_threads=True)
        dump.seek(0)
        return dump.read()


def write_stack(directory: Path, rank: int, text: str) -> Path | None:
    """RUN/hang/rank_N.txt, written whole (None where this node has no run directory)."""
    if not directory.is_dir():
        return None
    path = stack_file(directory, rank)
    with contextlib.suppress(OSError):
        path.parent.mkdir(exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        os.replace(partial, path)
        return path
    return None


def _waits_in_a_collective(answer: Mapping[str, Any]) -> bool:
    return any(m in answer["where"]["at"] for m in COLLECTIVE_MODULES)


def _proc_status(origin: Mapping[str, Any]) -> tuple[str, str] | None:
    """The state ("T (stopped)") and kernel wait channel of a process on this host, None
    where it is gone."""
    try:
        status = Path(f"/proc/{origin['pid']}/status").read_text()
        state = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                     if line.startswith("State:"))
        wchan = Path(f"/proc/{origin['pid']}/wchan").read_text().strip()
    except (OSError, StopIteration):
        return None
    return state, wchan


def _on_this_host(origin: Mapping[str, Any] | None) -> bool:
    return bool(origin) and origin["host"] == socket.gethostname()


def process_state(origin: Mapping[str, Any] | None) -> str:
    """What this node sees of a rank's process (`origin`: its pid and host): its state and
    the kernel function it sleeps in, read from /proc on the same host."""
    if not origin:
        return "its process is unknown"
    seen = f"pid {origin['pid']} on {origin['host']}"
    if not _on_this_host(origin):
        return seen
    found = _proc_status(origin)
    if found is None:
        return f"{seen}, gone"
    state, wchan = found
    return f"{seen}, state {state}" + (f", sleeping in {wchan}" if wchan not in ("", "0")
                                       else "")


def end_if_stopped(origin: Mapping[str, Any] | None) -> bool:
    """SIGKILL a rank's process on this host that a signal stopped (state T), once the
    hang is reported. A stopped process takes no signal but SIGKILL: torchrun would send it
    SIGTERM, wait 30 s, then SIGKILL it; this is the same end without the wait. A process
    under a debugger (t, tracing stop) or waiting in the kernel (D) is left alone."""
    if origin is None or not _on_this_host(origin):
        return False
    found = _proc_status(origin)
    if found is None or not found[0].startswith("T"):
        return False
    with contextlib.suppress(OSError):
        os.kill(int(origin["pid"]), signal.SIGKILL)
        return True
    return False


def not_arrived(answers: Mapping[int, Mapping[str, Any]], world_size: int,
                origins: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """The ranks that did not arrive, each with why: no answer (stopped, frozen, or stuck
    where Python does not run), an earlier update, a wait for the rank's data workers, or
    another place than the ranks that wait in the collective (those whose main thread is in
    torch's collectives, or, when none is, the place most ranks share)."""
    found = {r: f"does not answer ({process_state(origins.get(r))}): no stack from it"
             for r in range(world_size) if r not in answers}
    latest = max(a["update"] for a in answers.values())
    shared = Counter(a["where"]["at"] for a in answers.values()).most_common(1)[0]
    for r, answer in sorted(answers.items()):
        where = describe(answer["where"])
        if answer["update"] < latest:
            found[r] = f"is still in update {answer['update']}, at {where}"
        elif DATA_LOADER in answer["where"]["at"]:
            found[r] = ("waits for its data workers: one hangs in the dataset's __getitem__ "
                        f"or in what that calls (at {where})")
        elif not _waits_in_a_collective(answer) and not (
                shared[1] > 1 and answer["where"]["at"] == shared[0]):
            found[r] = f"is at {where}"
    return dict(sorted(found.items()))


def missing_stack(rank: int, why: str, reporter: int) -> str:
    """What RUN/hang/rank_N.txt says of a rank that left no stack."""
    return (f"Rank {rank} {why}.\nRank {reporter} wrote this. A process "
            "in state T was stopped by a signal (SIGSTOP, Ctrl-Z), one in D waits in the "
            "kernel (a stuck file system or device); py-spy dump --pid PID reads the Python "
            "stack of a live process from outside.\n")


def message(answers: Mapping[int, Mapping[str, Any]], missing: Mapping[int, str],
            reporter: int, timeout_s: float, directory: Path, where_next: str,
            ended: tuple[int, ...] = ()) -> str:
    """The one message of a hang, said by `reporter` (rank 0 when it answers); `ended`:
    the stopped ranks it ended (end_if_stopped)."""
    mine = answers[reporter]
    if missing:
        ranks = ", ".join(str(r) for r in missing)
        who = (f"Rank{'s' if len(missing) > 1 else ''} {ranks} did not arrive: "
               + "; ".join(f"rank {r} {why}" for r, why in missing.items()))
    else:
        who = ("Every rank answered from inside a collective: none is missing (a network "
               "fault between them?)")
    if ended:
        ranks = ", ".join(str(r) for r in ended)
        who += (f". Rank{'s' if len(ended) > 1 else ''} {ranks}, stopped by a signal, "
                f"ended with SIGKILL (a stopped process takes no other)")
    return (f"training hangs: update {mine['update']} waited more than "
            f"trainer.collective_timeout ({timeout_s:g} s) for the other ranks. {who}. "
            f"Rank {reporter} was waiting at {describe(mine['where'])}. Each rank's stack: "
            f"{directory / HANG_DIR}/rank_N.txt. {where_next[:1].upper()}{where_next[1:]}")
