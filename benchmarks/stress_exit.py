"""Stress the ends of 2-worker runs: every successful run must exit 0 on every rank (R-PROC-2).

Many short `torchrun --nproc-per-node=2` runs of the sl_ddp example, optionally while other
processes load every CPU, cycling through the ways a run ends:

  finish   a fresh run to its last update                      expect 0
  stop     SIGTERM to torchrun mid-run (snapshot, exit 143)    expect "stopped by SIGTERM"
  refuse   a fresh start into a finished run's directory        expect both workers exit 2
  restart  rank 1 SIGKILLed once, `--max-restarts 1 --resume auto` continues   expect 0
  selfstop SIGTERM to a self-launched run (`--nproc-per-node 2`) mid-run         expect 143

A run counts as an abort when any worker died of a signal it was not sent (SIGABRT: torch's
"terminate called without an active exception", a segfault) or the output shows one.

    python benchmarks/stress_exit.py --runs 40 --load 2 [--kinds finish,stop,refuse,restart]

Prints one line per run and a JSON summary (runs, failures and aborts per kind); the output
of each bad run is kept under --keep (default: a temporary directory, printed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CPU_RECIPE, REPO, TEST_FACTORIES, bench_env, torchrun

ABORT = re.compile(r"terminate called|SIGABRT|Signal 6|SIGSEGV|Signal 11|core dumped|"
                   r"exitcode\s*:\s*-(6|11)\b")


def _env(**extra: str) -> dict[str, str]:
    return bench_env(TEST_FACTORIES, PYTHONUNBUFFERED="1", **extra)


def _torchrun(*args: str, restarts: int = 0) -> list[str]:
    return torchrun(f"--max-restarts={restarts}", "--monitor-interval=0.2", "-m",
                    "embodichain", *args)


def _train(out: Path, updates: int, *extra: str) -> list[str]:
    return ["train-sl", "--config", str(CPU_RECIPE), "--set", f"trainer.output_dir={out}",
            "--set", f"trainer.max_updates={updates}", "--set", "trainer.save_every=10",
            "--set", "trainer.validate_every=10", "--set", "trainer.log_every=5",
            "--no-progress", *extra]


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def finish(work: Path, i: int) -> tuple[bool, int, str]:
    code, out = _run(_torchrun(*_train(work / f"finish{i}", 20)), _env(), 300)
    return code == 0, code, out


def stop(work: Path, i: int) -> tuple[bool, int, str]:
    code, out = _stopped(work / f"stop{i}", _torchrun)
    return "stopped by SIGTERM" in out, code, out  # torchrun reports no worker codes then


def selfstop(work: Path, i: int) -> tuple[bool, int, str]:
    def self_launched(*args: str) -> list[str]:
        return [sys.executable, "-m", "embodichain", *args, "--nproc-per-node", "2"]

    code, out = _stopped(work / f"selfstop{i}", self_launched)
    return code == 143 and "stopped by SIGTERM" in out, code, out


def _stopped(run: Path, launcher) -> tuple[int, str]:
    """SIGTERM to the launcher of an endless run once it saved update 10."""
    cmd = launcher(*_train(run, 100_000, "--set", "factory=restarting:build_supervised_trainer"))
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(EMBODICHAIN_TEST_SLEEP_S="0.01"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (run / "step_10.pt").exists() and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def refuse(work: Path, i: int) -> tuple[bool, int, str]:
    done = work / "finished"
    if not (done / "last.pt").exists():
        code, out = _run(_torchrun(*_train(done, 10)), _env(), 300)
        if code != 0:
            return False, code, "setting up the finished run failed:\n" + out
    code, out = _run(_torchrun(*_train(done, 10)), _env(), 300)
    ok = code == 1 and out.count("exitcode  : 2") == 2 and "already holds a run" in out
    return ok, code, out


def restart(work: Path, i: int) -> tuple[bool, int, str]:
    kills = json.dumps([{"id": f"r{i}", "rank": 1, "update": 15}])
    env = _env(EMBODICHAIN_TEST_KILLS=kills, EMBODICHAIN_TEST_KILL_LOG=str(work / f"kills{i}"))
    cmd = _torchrun(*_train(work / f"restart{i}", 30, "--resume", "auto", "--set",
                            "factory=restarting:build_supervised_trainer"), restarts=1)
    code, out = _run(cmd, env, 300)
    return code == 0 and "SIGKILL r" in out, code, out


KINDS = {"finish": finish, "stop": stop, "refuse": refuse, "restart": restart,
         "selfstop": selfstop}


def _load(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes meanwhile")
    parser.add_argument("--kinds", default="finish,stop,refuse,restart")
    parser.add_argument("--keep", type=Path, default=None, help="where bad runs' output go")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    work = Path(tempfile.mkdtemp(prefix="stress_exit_"))
    keep = args.keep or work / "bad"
    keep.mkdir(parents=True, exist_ok=True)
    stats = {k: {"runs": 0, "failed": 0, "aborts": 0} for k in kinds}
    load = _load(args.load)
    started = time.monotonic()
    try:
        for i, kind in zip(range(args.runs), itertools.cycle(kinds), strict=False):
            t = time.monotonic()
            ok, code, out = KINDS[kind](work, i)
            aborted = bool(ABORT.search(out))
            stats[kind]["runs"] += 1
            stats[kind]["failed"] += not ok or aborted
            stats[kind]["aborts"] += aborted
            verdict = "ABORT" if aborted else "ok" if ok else "FAILED"
            print(f"{i:4d} {kind:8s} exit {code:4d} {time.monotonic() - t:6.1f}s {verdict}",
                  flush=True)
            if aborted or not ok:
                (keep / f"{i:04d}_{kind}.txt").write_text(out)
    finally:
        for p in load:
            p.kill()
        shutil.rmtree(work / "finished", ignore_errors=True)
    total = {k: sum(s[k] for s in stats.values()) for k in ("runs", "failed", "aborts")}
    print(json.dumps({"per_kind": stats, "total": total, "load": args.load,
                      "wall_s": round(time.monotonic() - started, 1), "bad_output": str(keep)},
                     indent=1))
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
