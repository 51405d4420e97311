"""A SIGTERM during a closed-loop validation (R-EVAL-4): what is saved, and how fast.

The cart-pole BC recipe (embodichain-models, its packaged recipe with a small dataset made
here) under torchrun with 2 CPU workers, its simulator slowed to `--step-s` (0.2 s) a step
as a slow simulator is (an ALOHA validation takes a minute, insertion minutes), validating at
update `--validate-at`. Once the validation has reset its first episode, SIGTERM goes to
torchrun's process group (`kill -TERM -- -PGID`, as a batch system stops a job); the script
prints the update that last.pt holds, whether that validation is still due, and the seconds
from the signal to torchrun's exit. torchrun (and SLURM by default) SIGKILLs 30 s after its
SIGTERM: a stop that waited for the validation lost every update since the last snapshot.

    python benchmarks/stop_during_validation.py            # about 2 minutes on 2 cores
    python benchmarks/stop_during_validation.py --resume   # and resume it to the end

Needs `pip install -e 'plugins/embodichain-models[lerobot]'` (PyAV, pyarrow).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MARK = "STOP_BENCH_MARK"  # the file each reset of the slowed simulator appends to
STEP_S = "STOP_BENCH_STEP_S"  # its extra seconds a step (the resume runs at full speed)


def slow_cartpole(**kwargs: Any) -> Any:
    """The cart-pole swing-up environment, each step taking $STOP_BENCH_STEP_S longer."""
    import embodichain_models.envs  # noqa: F401 (registers the environment)
    import gymnasium

    class SlowStep(gymnasium.Wrapper):
        def reset(self, **options: Any) -> Any:
            if os.environ.get(MARK):
                with open(os.environ[MARK], "a") as f:
                    f.write(f"{os.getpid()}\n")
            return self.env.reset(**options)

        def step(self, action: Any) -> Any:
            time.sleep(float(os.environ.get(STEP_S, "0")))
            return self.env.step(action)

    return SlowStep(gymnasium.make("embodichain_models/CartPoleSwingUp-v0", **kwargs))


def recipe(root: Path, data: Path, validate_at: int) -> Path:
    from embodichain_models import recipes

    packaged = Path(recipes.__file__).parent / "cartpole_bc.yaml"
    config = yaml.safe_load(packaged.read_text())
    config["device"] = "cpu"
    config["trainer"].update({"batch_size": 16, "max_updates": 2 * validate_at,
                              "validate_every": validate_at, "save_every": 2 * validate_at,
                              "log_every": 5, "data_workers": 1,
                              "output_dir": str(root / "run")})
    config["model"] = {"channels": 8, "hidden": 32}
    config["data"].update(root=str(data), val_episodes=2)
    config["validation"] = {"max_examples": 32}
    config["evaluation"]["env"] = {
        "constructor": "benchmarks.stop_during_validation:slow_cartpole",
        "kwargs": {"size": 32, "render_size": 48}}
    path = root / "r.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            "--nproc-per-node=2", "-m", "embodichain", *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--validate-at", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.2)
    parser.add_argument("--resume", action="store_true", help="then resume the run to its end")
    args = parser.parse_args()
    from embodichain_models.data.cartpole.prepare import prepare

    from embodichain.core.checkpoint.file import read_checkpoint

    root = Path(tempfile.mkdtemp(prefix="stop_during_validation_"))
    data = prepare(root / "data", episodes=6, seed=0, size=32)
    path = recipe(root, data, args.validate_at)
    env = {**os.environ, "OMP_NUM_THREADS": "1", MARK: str(root / "resets.txt"),
           STEP_S: str(args.step_s),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = (root / "out.txt").open("w")
    proc = subprocess.Popen(torchrun("train-sl", "--config", str(path), "--no-progress"),
                            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    while not (root / "resets.txt").exists():
        if proc.poll() is not None:
            sys.exit(f"the run ended before its validation: {(root / 'out.txt').read_text()}")
        time.sleep(0.05)
    time.sleep(1.0)  # well inside the validation's first steps
    os.killpg(proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    code = proc.wait()
    took = time.monotonic() - signalled
    out.close()
    last = root / "run" / "last.pt"
    print(f"SIGTERM to torchrun's process group {1.0:.1f} s into the validation at update "
          f"{args.validate_at} (simulator {args.step_s} s a step): torchrun exited {code} "
          f"{took:.1f} s after the signal")
    if last.exists():
        saved = read_checkpoint(last)
        print(f"last.pt holds update {saved['manifest']['step']}; validation still due: "
              f"{bool(saved['payload']['run'].get('validation_due'))}")
    else:
        print("no last.pt: the updates were lost")
    for line in (root / "out.txt").read_text().splitlines():
        if "cut short" in line or line.startswith("stopped by"):
            print("  " + line)
    if args.resume:
        started = time.monotonic()
        env.pop(MARK), env.pop(STEP_S)
        resumed = subprocess.run(torchrun("resume", str(root / "run"), "--no-progress"),
                                 cwd=root, env=env, capture_output=True, text=True)
        print(f"resume: exit {resumed.returncode} in {time.monotonic() - started:.0f} s; "
              f"last.pt holds update {read_checkpoint(last)['manifest']['step']}")
    print(f"(run directory: {root})")


if __name__ == "__main__":
    main()
