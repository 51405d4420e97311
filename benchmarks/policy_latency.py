"""Per-step latency of an exported policy at batch 1 (the robot's case), side by side:
the runner on the ONNX artifact (onnxruntime, CPU), the runner on the `.pt2` (torch), and
the checkpoint's deployable forward in eager PyTorch (R-DEPLOY-1).

Each step is one observation (numpy, as a robot's drivers give it) to one action (numpy),
the model queried every step (execution horizon 1 for the policy's own chunk execution is
not what is timed: every variant runs the forward). The three variants alternate in rounds
of `--steps` steps so that machine load falls on all alike; p50 and p99 over all steps.

    python benchmarks/policy_latency.py                 # the cart-pole policy, recipe size
    python benchmarks/policy_latency.py --run RUN_DIR   # any exportable run (e.g. ALOHA)

Without `--run`, a cart-pole behaviour-cloning run at the packaged recipe's model size
(64x64 camera, 2 frames, 32 channels, hidden 256, chunk 8) is trained for one update on 4
recorded episodes (latency does not depend on the weights).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from common import bench_env


def tiny_cartpole_run(root: Path) -> Path:
    from embodichain_models.data.cartpole.prepare import prepare

    data = prepare(root / "data", episodes=4, seed=0, size=64)
    subprocess.run([sys.executable, "-m", "embodichain", "init", "cartpole_bc",
                    str(root / "r.yaml")], check=True, env=bench_env(), capture_output=True)
    recipe = yaml.safe_load((root / "r.yaml").read_text())
    recipe["device"] = "cpu"
    recipe["trainer"].update({"batch_size": 4, "max_updates": 1, "save_every": 1,
                              "validate_every": 0, "data_workers": 0,
                              "output_dir": str(root / "run")})
    recipe["data"].update(root=str(data), val_episodes=1)
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    subprocess.run([sys.executable, "-m", "embodichain", "train-sl", "--config",
                    str(root / "r.yaml"), "--no-progress"], check=True, env=bench_env(),
                   capture_output=True)
    return root / "run"


def export(run: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "embodichain", "export", str(run), "--policy",
                    str(out)], check=True, env=bench_env())
    return out


def model_input(rng: np.random.Generator, spec: dict) -> np.ndarray:
    """One batch-1 input of an observation (its whole stack, if it has one)."""
    shape = (1, *([spec["stack"]] if spec.get("stack") else []), *spec["shape"])
    if spec["dtype"] == "uint8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.random(shape).astype(spec["dtype"])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="run directory or checkpoint to export")
    parser.add_argument("--steps", type=int, default=200, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of torch and onnxruntime alike")
    args = parser.parse_args()

    import torch

    from embodichain.core.deploy.program import Flat, deployable_of
    from embodichain.core.deploy.runner import PolicyRunner, input_specs
    from embodichain.core.deploy.trained import trained_model

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = args.run or tiny_cartpole_run(root)
        onnx_runner = PolicyRunner(export(run, root / "policy.onnx"), threads=args.threads)
        pt2_runner = PolicyRunner(export(run, root / "policy.pt2"))
        checkpoint = run / "last.pt" if run.is_dir() else run
        trained = trained_model(checkpoint)
        module, _ = deployable_of(trained.model, trained.factory)
        keys = list(input_specs(onnx_runner.interface))  # a sampler's noise last
        eager_module = Flat(module, list(keys)).eval()

        def eager(observations: dict[str, np.ndarray]) -> np.ndarray:
            with torch.inference_mode():
                return eager_module(*(torch.from_numpy(observations[k]) for k in keys)).numpy()

        interface = onnx_runner.interface
        rng = np.random.default_rng(0)
        observations = [{k: model_input(rng, v) for k, v in input_specs(interface).items()}
                        for _ in range(args.steps)]
        variants = {"onnx (onnxruntime, runner)": onnx_runner.predict,
                    "pt2 (torch.export, runner)": pt2_runner.predict,
                    "eager PyTorch (checkpoint)": eager}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for fn in variants.values():  # warm-up
            for obs in observations[:20]:
                fn(obs)
        for _ in range(args.rounds):
            for name, fn in variants.items():
                for obs in observations:
                    start = time.perf_counter()
                    fn(obs)
                    times[name].append(time.perf_counter() - start)

    shapes = ", ".join(f"{k} {v['shape']}" for k, v in interface["observations"].items())
    print(f"policy: {interface['provenance']['factory']} ({shapes} -> "
          f"{interface['action']['key']} {interface['action']['shape']}), batch 1, "
          f"{args.threads} thread(s), {args.rounds} rounds x {args.steps} steps, "
          f"torch {torch.__version__}")
    eager_p50 = statistics.median(times["eager PyTorch (checkpoint)"])
    print("| variant | p50 (ms) | p99 (ms) | p50 vs eager |")
    print("|---|--:|--:|--:|")
    for name, values in times.items():
        p50, p99 = statistics.median(values), percentile(values, 99)
        print(f"| {name} | {p50 * 1e3:.3f} | {p99 * 1e3:.3f} | {p50 / eager_p50:.2f}x |")


if __name__ == "__main__":
    main()
