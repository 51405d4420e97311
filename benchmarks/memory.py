"""Peak memory of `train-sl` against a hand-written loop: a 50 M-parameter MLP, Adam, one CPU
process.

The model is the wide MLP of async_save.py's "50m" size (4 -> 2048 -> 12 hidden layers of
2048 x 2048 -> 2, Tanh: 50.4 M parameters) on sl_ddp's corpus and loss, Adam at lr 1e-3,
batch 64, 30 updates, no save in between. Each run is its own process, one after the other:

- `hand loop`: `hand_loop()` below, the loop a user writes (imports nothing of embodichain);
- `train-sl`: the real CLI; on the CPU the skip is decided on the host (no copy);
- `train-sl, copy guard`: the same with the CPU treated as a GPU (guarded_step's
  `HOST_DEVICES` emptied by this factory), so the skip is applied without a host read, with
  `trainer.skip_guard: copy` (a copy of the parameters and Adam's state each update): what a
  GPU run of a non-fused optimizer pays, measured on the CPU;
- `train-sl, fused found_inf`: `optimizer.fused: true` with the CPU treated as a GPU: the
  skip handed to fused Adam as its `found_inf` (no copy); beside it `hand loop, fused`;
- with `--baseline-ref REF`, also `train-sl` as of git commit REF (a temporary worktree).

`--step-times` instead times the optimizer step alone in one process, each way of skipping
in turn (CPU: the host's read; `copy`; fused Adam's `found_inf`; `sync` is the host's read
plus, on a GPU, a wait this CPU run cannot show), so that the machine's load hits all alike.

Reported: the peak resident set size (`ru_maxrss`) at update 30, read inside the process
(train-sl: a validation callback at update 30, before the run's final save; the hand loop:
after its 30th update), the whole process's peak (train-sl's final save included), and the
median seconds per update. The goal is train-sl's peak at update 30 <= 1.1x the hand loop's.

    python benchmarks/memory.py
    python benchmarks/memory.py --baseline-ref 1781237 --rounds 2
    python benchmarks/memory.py --step-times 20
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import (
    BENCH,
    baseline_tree,
    bench_env,
    seconds_per_update,
    wide_mlp,
    wide_mlp_schema,
)

WIDTH, DEPTH, BATCH, UPDATES, CORPUS = 2048, 12, 64, 30, 65536
KINDS = ("hand loop", "train-sl", "train-sl, copy guard", "train-sl, fused found_inf",
         "hand loop, fused")


# -- the hand-written loop -------------------------------------------------------------------


def hand_loop(out: Path, fused: bool) -> None:
    """30 Adam updates of the MLP on sl_ddp's corpus, the way a user writes them; the peak
    RSS after the last one (no save)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(CORPUS, 4, generator=g)
    y = torch.stack([x @ torch.tensor([0.5, -1.0, 0.25, 2.0]) + 0.1,
                     x @ torch.tensor([1.0, 0.5, -0.5, 0.0]) + torch.sin(2.0 * x[:, 1])], 1)
    mask = torch.stack([torch.ones(CORPUS), (x[:, 0] > 0).float()], dim=1)
    layers: list[nn.Module] = [nn.Linear(4, WIDTH), nn.Tanh()]
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if fused
                                                                  else {}))
    times = []
    for _ in range(UPDATES):
        start = time.perf_counter()
        i = torch.randint(0, CORPUS, (BATCH,))
        error = (model(x[i]) - y[i]).square() * mask[i]
        loss = error.sum() / mask[i].sum()
        if torch.isfinite(loss):  # what a careful hand loop skips
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    out.write_text(json.dumps({"peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                               "s_per_update": statistics.median(times[5:])}))


# -- train-sl's factory and the callback that reads its peak at update 30 ----------------------


class PeakAtValidation:
    """Writes the process's peak RSS when update 30 is validated (before the final save)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_validation(self, trainer, metrics) -> None:
        import embodichain

        self.out.write_text(json.dumps({
            "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "step": trainer.step, "embodichain": str(Path(embodichain.__file__).parent)}))


def build_supervised_trainer(config, device):
    from embodichain.learning.sl import SupervisedTrainer, TensorSource
    from embodichain.plugins import sl_ddp

    if os.environ.get("MEMORY_BENCH_AS_GPU") == "1":
        from embodichain.core.training import guarded_step

        guarded_step.HOST_DEVICES = ()  # the CPU treated as a GPU: no host read of the skip
    return SupervisedTrainer(
        config, model=wide_mlp(config.model.width, config.model.depth),
        source=TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed)),
        objective=sl_ddp.masked_mse, device=device,
        evaluate=lambda model, device: {"validation/mse": 0.0},
        callbacks=[PeakAtValidation(Path(os.environ["MEMORY_BENCH_OUT"]))])


build_supervised_trainer.config_schema = wide_mlp_schema()


# -- the step alone, each guard in turn ----------------------------------------------------------


def step_times(rounds: int) -> None:
    """Median seconds of `GuardedStep.step` + `settle` (an applied update) per guard."""
    import torch

    from embodichain.core.recipe.schema import OptimizerConfig
    from embodichain.core.training import guarded_step
    from embodichain.core.training.param_groups import build_optimizer, build_param_groups

    torch.manual_seed(0)
    model = wide_mlp(WIDTH, DEPTH)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    guards = {}
    for name, kind, fused in (("host read (CPU; sync)", guarded_step.HostDecidedStep, False),
                              ("copy", guarded_step.CopiedStep, False),
                              ("fused found_inf", guarded_step.FoundInfStep, True)):
        config = OptimizerConfig(name="adam", lr=1e-3, fused=fused)
        optimizer = build_optimizer(build_param_groups(model, config), config)
        guards[name] = kind(list(model.parameters()), optimizer, scaler, None)
    skip = torch.tensor(False)
    times: dict[str, list[float]] = {name: [] for name in guards}
    for _ in range(rounds + 2):  # two rounds to warm up (state, copy buffers)
        for name, guard in guards.items():
            start = time.perf_counter()
            no_step = guard.step(skip, None)
            guard.settle(skipped=False, stepped=not bool(no_step))
            times[name].append(time.perf_counter() - start)
    print(f"optimizer step with each guard, {rounds} rounds in turn after 2 to warm up "
          f"(median ms; one CPU thread):")
    for name, values in times.items():
        print(f"  {name:<24} {statistics.median(values[2:]) * 1e3:7.1f} ms "
              f"(range {min(values[2:]) * 1e3:.1f}-{max(values[2:]) * 1e3:.1f})")


# -- the runs ----------------------------------------------------------------------------------


def run(kind: str, work: Path, tree: Path | None = None) -> dict[str, float]:
    """One run in a fresh process: its peak at update 30, whole-process peak, s/update."""
    out = work / "peak.json"
    if kind.startswith("hand loop"):
        cmd = [sys.executable, str(BENCH / "memory.py"), "--hand-loop", str(out)]
        cmd += ["--fused"] if "fused" in kind else []
        env = bench_env()
    else:
        recipe = {
            "factory": "memory:build_supervised_trainer", "seed": 0, "device": "cpu",
            "trainer": {"batch_size": BATCH, "max_updates": UPDATES, "log_every": 5,
                        "validate_every": UPDATES, "save_every": 0,
                        "output_dir": str(work / "run")},
            "optimizer": {"name": "adam", "lr": 1e-3, **({"fused": True} if "fused" in kind
                                                         else {})},
            "model": {"width": WIDTH, "depth": DEPTH},
            "data": {"train_size": CORPUS, "val_size": 64, "seed": 1234},
        }
        (work / "r.yaml").write_text(yaml.safe_dump(recipe))
        cmd = [sys.executable, "-m", "embodichain", "train-sl", "--config",
               str(work / "r.yaml"), "--no-progress"]
        as_gpu = "copy" in kind or "fused" in kind
        env = bench_env(*([tree] if tree else []), BENCH, MEMORY_BENCH_OUT=str(out),
                        MEMORY_BENCH_AS_GPU="1" if as_gpu else "0")
    with (work / "stderr.txt").open("w") as stderr:
        # cwd: not the repository, which `python -m` would put first on sys.path
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                stderr=stderr)
        # the peak of this child alone (wait4's rusage), not of every child so far
        _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{kind} failed ({code}):\n{(work / 'stderr.txt').read_text()[-3000:]}")
    figures = json.loads(out.read_text())
    if tree is not None:
        assert figures["embodichain"].startswith(str(tree)), figures  # the baseline's code
    if not kind.startswith("hand loop"):
        figures["s_per_update"] = seconds_per_update(work / "run" / "metrics.jsonl")
    figures["process_peak_kb"] = usage.ru_maxrss
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline-ref", help="also run train-sl as of this git commit")
    parser.add_argument("--hand-loop", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fused", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step-times", type=int, metavar="ROUNDS",
                        help="time the optimizer step with each guard instead")
    args = parser.parse_args()
    if args.step_times:
        torch_threads = os.environ.get("OMP_NUM_THREADS")
        assert torch_threads == "1", "run with OMP_NUM_THREADS=1 (as the other runs are)"
        step_times(args.step_times)
        return
    if args.hand_loop is not None:
        hand_loop(args.hand_loop, args.fused)
        return
    with baseline_tree(args.baseline_ref) as baseline:
        measure(args.rounds, baseline, args.baseline_ref)


def measure(rounds: int, baseline: Path | None, ref: str | None) -> None:
    kinds = list(KINDS) + ([f"train-sl at {ref}"] if baseline is not None else [])
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for round_ in range(rounds):
        for kind in kinds:
            with tempfile.TemporaryDirectory(prefix="memory_run_") as work:
                tree = baseline if kind.startswith("train-sl at") else None
                results[kind].append(run(kind.split(" at ")[0] if tree else kind,
                                         Path(work), tree))
            f = results[kind][-1]
            print(f"round {round_ + 1} {kind}: peak at update {UPDATES} "
                  f"{f['peak_kb'] / 1e6:.2f} GB, process {f['process_peak_kb'] / 1e6:.2f} GB, "
                  f"{f['s_per_update'] * 1e3:.0f} ms/update", flush=True)
    hand = statistics.median(f["peak_kb"] for f in results["hand loop"])
    hand_fused = statistics.median(f["peak_kb"] for f in results["hand loop, fused"])
    print(f"\nmedians, {sum(p.numel() for p in wide_mlp(WIDTH, DEPTH).parameters()) / 1e6:.1f} "
          f"M parameters, Adam, batch {BATCH}, one CPU process (peak RSS in GB at update "
          f"{UPDATES}; ratio to the hand loop of the same optimizer):")
    for kind in kinds:
        peak = statistics.median(f["peak_kb"] for f in results[kind])
        whole = statistics.median(f["process_peak_kb"] for f in results[kind])
        step = statistics.median(f["s_per_update"] for f in results[kind])
        ratio = peak / (hand_fused if "fused" in kind else hand)
        print(f"  {kind:<28} {peak / 1e6:5.2f} GB ({ratio:.2f}x)  process {whole / 1e6:5.2f} "
              f"GB  {step * 1e3:6.0f} ms/update")


if __name__ == "__main__":
    main()
