"""Run `embodichain` training commands and SIGKILL them at random moments (R-CKPT-2).

A fork server: it imports torch and embodichain once, then runs each command in a forked
child (so a kill point costs a fraction of a second instead of an interpreter start) and
kills it with SIGKILL after a random delay. It never runs torch code itself, so forking is safe.
Children write checkpoints through a simulated slow disk (`_slow_disk`), so that kills land
inside saves often; the reference run too, so that all runs share one code path.

    python sigkill_driver.py RECIPE ROOT FRESH_KILLS CHAIN_KILLS SEED

RECIPE saves every update. Phases, all under ROOT:
  reference/    the recipe trained to REFERENCE_UPDATES without interruption (for content checks
                and to calibrate the kill window);
  fresh_<i>/    `train-sl` into a fresh directory, killed after run.json appeared;
  chain_<j>/    one directory trained, killed, then resumed in place with `embodichain resume`
                and killed again, repeatedly; after each kill its state is preserved in
                snap_<k>/ (checkpoints hard-linked, since they are only ever replaced by rename;
                the other files copied).
Prints a JSON report on stdout.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

REFERENCE_UPDATES = 60


def _preload() -> None:
    """Import what a training command imports lazily (torch._dynamo alone takes a second)."""
    import importlib

    for name in ("torch", "torch._dynamo", "torch.utils.serialization", "numpy.random",
                 "importlib_metadata", "embodichain.cli", "embodichain.core.launch.train",
                 "embodichain.core.recipe.discovery", "embodichain.plugins.sl_ddp"):
        importlib.import_module(name)


def _slow_disk() -> None:
    """In a child: checkpoint bytes reach the file in small flushed chunks with pauses, and
    renames and links pause first, so that random kills often land inside a save (with the
    real timings a save is mostly fsync, and partial writes last microseconds)."""
    import io

    import torch

    real_save, real_replace, real_link = torch.save, os.replace, os.link

    def save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        for start in range(0, len(data), CHUNK):
            f.write(data[start:start + CHUNK])
            f.flush()
            time.sleep(PAUSE)

    def replace(src, dst, *args, **kwargs):
        time.sleep(PAUSE)
        return real_replace(src, dst, *args, **kwargs)

    def link(src, dst, *args, **kwargs):
        time.sleep(PAUSE)
        return real_link(src, dst, *args, **kwargs)

    torch.save, os.replace, os.link = save, replace, link


CHUNK, PAUSE = 4096, 0.0005


def spawn(args: list[str], log: Path) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        from embodichain.cli import main

        _slow_disk()
        sys.argv = ["embodichain", *args]
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def reap(pid: int) -> dict[str, object]:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status)}


def exited(pid: int) -> bool:
    done, _ = os.waitpid(pid, os.WNOHANG)
    if done:
        raise RuntimeError(f"child {pid} ended before it was killed; see the logs")
    return False


def wait_for(path: Path, pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and not exited(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.002)


def kill(pid: int) -> dict[str, object]:
    os.kill(pid, signal.SIGKILL)
    return reap(pid)


def snapshot(directory: Path, target: Path) -> None:
    target.mkdir()
    if not directory.is_dir():  # killed before it claimed the directory
        return
    for path in directory.iterdir():
        if path.is_file():
            if path.suffix == ".pt":
                os.link(path, target / path.name)
            else:
                shutil.copy2(path, target / path.name)


def main() -> None:
    recipe, root = sys.argv[1], Path(sys.argv[2])
    fresh_kills, chain_kills, seed = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(seed)
    _preload()
    logs = root / "logs"
    logs.mkdir(parents=True)
    train = ["train-sl", "--config", recipe, "--no-progress"]
    report: dict[str, object] = {"kills": []}

    # reference run, timed from its claim (run.json) to its end
    reference = root / "reference"
    pid = spawn([*train, "--set", f"trainer.output_dir={reference}",
                 "--set", f"trainer.max_updates={REFERENCE_UPDATES}"], logs / "reference.log")
    wait_for(reference / "run.json", pid)
    start = time.monotonic()
    status = reap(pid)
    if status != {"exit": 0}:
        raise RuntimeError(f"reference run failed: {status}; see {logs / 'reference.log'}")
    window = (time.monotonic() - start) / 2  # about half the reference's updates
    report["reference"] = {"dir": str(reference), "updates": REFERENCE_UPDATES,
                           "window_s": window}

    startups = []
    for i in range(fresh_kills):
        directory = root / f"fresh_{i}"
        forked = time.monotonic()
        pid = spawn([*train, "--set", f"trainer.output_dir={directory}"],
                    logs / f"fresh_{i}.log")
        wait_for(directory / "run.json", pid)
        startups.append(time.monotonic() - forked)
        delay = rng.uniform(0.0, window)
        time.sleep(delay)
        report["kills"].append({"kind": "fresh", "dir": str(directory), "delay_s": delay,
                                **kill(pid)})

    startup = sorted(startups)[len(startups) // 2] if startups else 0.2
    chain, links = None, 0
    for k in range(chain_kills):
        if chain is None or not (chain / "last.pt").exists():
            chain = root / f"chain_{k}"
            args = [*train, "--set", f"trainer.output_dir={chain}",
                    "--set", "trainer.log_every=1000000"]  # no history ahead of last.pt
        else:
            args = ["resume", str(chain), "--no-progress"]
            links += 1
        pid = spawn(args, logs / f"chain_{k}.log")
        delay = rng.uniform(0.0, startup + window)
        time.sleep(delay)
        exited(pid)
        status = kill(pid)
        target = root / f"snap_{k}"
        snapshot(chain, target)
        report["kills"].append({"kind": "chain", "dir": str(target), "chain": str(chain),
                                "resumed": args[0] == "resume", "delay_s": delay, **status})
    report["in_place_resumes"] = links
    print(json.dumps(report))


if __name__ == "__main__":
    main()
