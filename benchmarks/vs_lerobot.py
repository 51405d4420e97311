"""Our ALOHA camera recipe against lerobot 0.6.1's own `lerobot-train` ACT, on our dataset.

lerobot lives only in a side venv (`bash ../shared/tools/lerobot-venv.sh VENV`, then
`VENV/bin/pip install torchvision==0.28.0 opencv-python-headless accelerate`: lerobot-train
imports cv2 and accelerate, which the venv script leaves out; the real torchvision, whose
only wheel on the registry is the CUDA 13 build; `torchvision_ops_shim` below lets its
pure-Python models import on the CPU torch). It is never a dependency of the project. lerobot's own
`LeRobotDataset` reads our recorded transfer-cube camera dataset
(`python -m embodichain_models.data.aloha.prepare --task transfer_cube --episodes N
--cameras top --size 120x160 DIR`).

    python benchmarks/vs_lerobot.py speed DIR --updates 100 --pairs 2    # matched, alternated
    python benchmarks/vs_lerobot.py train-lerobot DIR --updates 8000 --out OUT  # resumable
    python benchmarks/vs_lerobot.py judge LEROBOT_RUN --ours OUR_RUN --seed 200000 --episodes 50
    python benchmarks/vs_lerobot.py as-shipped DIR --minutes 45 --judge 50   # equal wall-clock

`speed`: the matched configuration, one process each on the same cores (OMP_NUM_THREADS=1,
one data worker, niced, memory bounded), ours and theirs alternated (the order swaps every
pair; `--full-width` adds ours at the backbone width lerobot cannot halve,
`model.channels=64`, between the two). From the logs: seconds per update (ours:
`time/elapsed_s` between log lines; theirs: `updt_s + data_s`, both the median over log
windows after the first), the data-wait share (ours `time/data_wait`; theirs
`data_s / (updt_s + data_s)`), and the peak RSS of the largest process and the wall time
(`/usr/bin/time -v`).

`train-lerobot`: lerobot's matched run alone (ours is the recipe's own run, e.g. training
seed 0), snapshots every `--save-every` updates; run again with the same `--out`, it goes on
from lerobot's last checkpoint (`--resume=true`, lerobot's sample-exact resume), so a run
longer than a sitting is done in pieces. Each piece's log is kept; the wall and CPU seconds
are their sums.

`judge`: a lerobot checkpoint through `lerobot_adapter.LerobotActAdapter` (its
`select_action`, its normalisation, checked against its own preprocessor first) in our
environment (`pixels_agent_pos`, bit-identical to gym-aloha's scene), on the test seeds, the
field and strict verdicts (`AlohaJudge`) with Wilson 95% intervals; with `--ours RUN`, ours
on the same seeds through `embodichain eval`.

`as-shipped`: lerobot's ACT defaults (dim 512, 4+1 layers, feed-forward 3200, chunk 100,
n_action_steps 100, the VAE, lr 1e-5, batch 8, ImageNet statistics; only the backbone's
ImageNet weights are out of reach) against our recipe as written, each for the same
wall-clock minutes, then both judged as `judge` does.

The matched configuration (ours: examples/learning/aloha/transfer_cube_camera.yaml) and
what stays different (lerobot has no option for it):
- same: transformer width 128, 4 heads, 2 encoder layers, 1 decoder layer, feed-forward
  512, dropout 0.1, no VAE, chunk 50, examples per update 32 (one batch of 32 each), AdamW
  lr 3e-4 (backbone too) weight decay 1e-4, gradient clip 10, cosine decay to 3e-5 after
  200 warm-up updates (lerobot's `cosine_decay_with_warmup`), temporal ensembling m 0.01
  (lerobot: n_action_steps 1), the same updates, seed 0, backbone from scratch, one data
  worker, the joints and the top camera only (`--policy.input_features`).
- different: the backbone (ours: ResNet-18 layout at half width, 32 channels, GroupNorm;
  lerobot: torchvision's resnet18, 64 channels, FrozenBatchNorm2d, i.e. no normalisation
  when trained from scratch); the image input (ours: [0, 1] plus a random shift of up to 6
  pixels; lerobot: mean/std normalised by the dataset's per-channel statistics,
  `dataset.use_imagenet_stats=false` since the backbone is not ImageNet's, no augmentation);
  weight decay (ours: not on biases and norms; lerobot: on every parameter); lerobot's
  warm-up and decay are rescaled to the run's length when it is shorter than the decay
  (ours: warm-up 200 then cosine over the run); positions (ours: a learned embedding
  added once to the encoder's input, learned decoder queries; lerobot: added to queries
  and keys in every attention layer, DETR's way, sinusoidal 2-D for the image features);
  the data loader (ours: fork, prefetch 2; lerobot: spawn, prefetch 4, persistent
  workers). The loss is the same (L1 of the normalised chunk over the steps inside the
  episode).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, bench_env

RECIPE = REPO / "examples" / "learning" / "aloha" / "transfer_cube_camera.yaml"
MEMORY_LIMIT = 16 << 30  # bytes of address space per run
SHIM = '''import torch
_LIB = torch.library.Library("torchvision", "FRAGMENT")
_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
'''


def torchvision_ops_shim(where: Path) -> Path:
    """A directory with a `sitecustomize.py` to put on PYTHONPATH: torchvision 0.28.0's CUDA
    wheel cannot load its C++ ops on the CPU torch (they link libtorch_cuda.so), and its
    `_meta_registrations.py` then registers fake kernels for torchvision::nms and ::qnms
    without checking (RuntimeError: operator torchvision::nms does not exist). Declaring
    the two schemas lets the real torchvision's pure-Python models import; no kernel is
    added (detection ops stay unavailable; ACT uses none)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(SHIM)
    return where


def train_sl(sets: dict[str, object], *options: str) -> list[str]:
    """`embodichain train-sl` of our camera recipe with `--set` `sets`."""
    return [sys.executable, "-m", "embodichain", "train-sl", "--config", str(RECIPE),
            "--no-progress", *options,
            *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]


def ours_command(data: Path, out: Path, updates: int, log_every: int,
                 **more: object) -> list[str]:
    """Our recipe's training for `updates`, one process, one batch of 32 an update; `more`:
    further `--set` keys (dots as double underscores: model__channels=64)."""
    return train_sl({**{k.replace("__", "."): v for k, v in more.items()},
                     "data.root": data, "trainer.output_dir": out,
                     "trainer.max_updates": updates, "trainer.batch_size": 32,
                     "trainer.global_batch_size": 32, "trainer.log_every": log_every,
                     "trainer.save_every": updates, "trainer.validate_every": 0,
                     "device": "cpu"})


def lerobot_matched(updates: int) -> list[str]:
    """lerobot-train's options for the matched configuration (see the docstring)."""
    return ["--policy.dim_model=128", "--policy.n_heads=4", "--policy.n_encoder_layers=2",
            "--policy.n_decoder_layers=1", "--policy.dim_feedforward=512",
            "--policy.dropout=0.1", "--policy.use_vae=false", "--policy.chunk_size=50",
            "--policy.n_action_steps=1", "--policy.temporal_ensemble_coeff=0.01",
            "--batch_size=32", "--use_policy_training_preset=false",
            "--optimizer.type=adamw", "--optimizer.lr=0.0003",
            "--optimizer.weight_decay=0.0001", "--optimizer.grad_clip_norm=10",
            "--scheduler.type=cosine_decay_with_warmup", "--scheduler.num_warmup_steps=200",
            f"--scheduler.num_decay_steps={max(updates, 8000)}", "--scheduler.peak_lr=0.0003",
            "--scheduler.decay_lr=0.00003", "--dataset.use_imagenet_stats=false"]


CAMERA_POLICY = json.dumps({"observation.state": {"type": "STATE", "shape": [14]},
                            "observation.images.top": {"type": "VISUAL",
                                                       "shape": [3, 120, 160]}})
"""What a camera policy reads (gym-aloha's pixels_agent_pos): by default lerobot takes every
observation feature of the dataset, the objects' poses (observation.environment_state,
privileged) included."""


def lerobot_command(venv: Path, data: Path, out: Path, updates: int, log_every: int,
                    options: list[str], save_every: int | None = None) -> list[str]:
    return [str(venv / "bin" / "lerobot-train"), f"--dataset.repo_id=local/{data.name}",
            f"--policy.input_features={CAMERA_POLICY}",
            f"--dataset.root={data}", "--dataset.video_backend=pyav", "--policy.type=act",
            "--policy.device=cpu", "--policy.push_to_hub=false",
            "--policy.pretrained_backbone_weights=null", f"--output_dir={out}",
            f"--steps={updates}", f"--log_freq={log_every}",
            f"--save_freq={save_every or updates}",
            "--num_workers=1", "--seed=0", "--wandb.enable=false", *options]


def bounded(command: list[str], log: Path, env: dict[str, str], limit_s: int) -> float:
    """Run `command` niced, under `timeout` and an address-space limit, through
    `/usr/bin/time -v`, its output into `log`; returns its wall seconds."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    full = ["/usr/bin/time", "-v", "timeout", str(limit_s), "nice", "-n", "10", *command]
    start = time.perf_counter()
    with log.open("w") as sink:
        sink.write(" ".join(command) + "\n")
        sink.flush()
        code = subprocess.call(full, stdout=sink, stderr=subprocess.STDOUT, env=env,
                               preexec_fn=limit, cwd=REPO)
    if code:
        print(f"  exit {code}: see {log}", file=sys.stderr)
    return time.perf_counter() - start


def peak_rss_mib(log: Path) -> float:
    found = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", log.read_text())
    return int(found[-1]) / 1024 if found else float("nan")


def cpu_seconds(log: Path) -> float:
    """User + system CPU seconds of the run, its processes together (`/usr/bin/time -v`):
    what it cost, whatever the machine's load."""
    text = log.read_text()
    return sum(float(re.findall(rf"{kind} time \(seconds\): ([\d.]+)", text)[-1])
               for kind in ("User", "System"))


def ours_figures(out: Path) -> dict[str, float]:
    metrics = next(out.rglob("metrics.jsonl"))
    rows = [r for r in map(json.loads, metrics.open()) if "time/elapsed_s" in r]
    steps = [(r["step"], r["time/elapsed_s"]) for r in rows]
    per = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(steps, steps[1:], strict=False)]
    return {"s_per_update": statistics.median(per),
            "data_wait": statistics.median(r["time/data_wait"] for r in rows[1:]),
            "updates": str(steps[-1][0])}


LEROBOT_LINE = re.compile(r"step:(\S+) .*updt_s:([\d.]+) data_s:([\d.]+)")


def lerobot_figures(*logs: Path) -> dict[str, float]:
    lines = [line for log in logs for line in LEROBOT_LINE.findall(log.read_text())]
    windows = [(float(u), float(d)) for _, u, d in lines]
    later = windows[1:] or windows
    return {"s_per_update": statistics.median(u + d for u, d in later),
            "data_wait": statistics.median(d / (u + d) for u, d in later),
            "updates": lines[-1][0]}


def train_lerobot(args: argparse.Namespace) -> None:
    out, data = args.out.resolve(), args.data.resolve()
    shim = torchvision_ops_shim(out / "tvops")
    env = bench_env(shim, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    run = out / "lerobot"
    resumed = run / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    if resumed.exists():
        command = [str(args.venv / "bin" / "lerobot-train"), f"--config_path={resumed}",
                   "--resume=true"]
    else:
        command = lerobot_command(args.venv, data, run, args.updates, args.log_every,
                                  lerobot_matched(args.updates), save_every=args.save_every)
    bounded(command, out / f"lerobot_train_{len(list(out.glob('lerobot_train_*.log')))}.log",
            env, args.limit_s)
    pieces = sorted(out.glob("lerobot_train_*.log"), key=lambda p: int(p.stem.split("_")[-1]))
    walls = {log: WALL.findall(log.read_text()) for log in pieces}
    timed = [log for log in pieces if walls[log]]  # a killed piece has no time report
    row = {"pieces": len(pieces), "timed_pieces": len(timed),
           "wall_s": round(sum(_seconds(walls[log][-1]) for log in timed), 1),
           "cpu_s": round(sum(cpu_seconds(log) for log in timed), 1),
           "peak_rss_mib": max((peak_rss_mib(log) for log in timed), default=float("nan")),
           **lerobot_figures(*pieces),
           "last_checkpoint": str(run / "checkpoints" / "last")}
    print(json.dumps(row))
    (out / "train_lerobot.json").write_text(json.dumps(row, indent=1))


WALL = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)")


def _seconds(clock: str) -> float:
    """`/usr/bin/time`'s h:mm:ss or m:ss.ss, in seconds."""
    total = 0.0
    for part in clock.split(":"):
        total = total * 60 + float(part)
    return total


def speed(args: argparse.Namespace) -> None:
    out, data = args.out.resolve(), args.data.resolve()  # the runs start in the repository
    shim = torchvision_ops_shim(out / "tvops")
    ours_env = bench_env()
    theirs_env = bench_env(shim, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    rows = []
    for pair in range(args.pairs):
        runs = [("ours", ours_command(data, out / f"ours_{pair}", args.updates,
                                      args.log_every), ours_env),
                *([("ours_w64", ours_command(data, out / f"ours_w64_{pair}",
                                             args.updates, args.log_every,
                                             model__channels=64), ours_env)]
                  if args.full_width else []),
                ("lerobot", lerobot_command(args.venv, data, out / f"lerobot_{pair}",
                                            args.updates, args.log_every,
                                            lerobot_matched(args.updates)), theirs_env)]
        for name, command, env in runs if pair % 2 == 0 else runs[::-1]:
            log = out / f"{name}_{pair}.log"
            wall = bounded(command, log, env, args.limit_s)
            figures = (lerobot_figures(log) if name == "lerobot"
                       else ours_figures(out / f"{name}_{pair}"))
            row = {"pair": pair, "who": name, **figures, "wall_s": round(wall, 1),
                   "cpu_s": round(cpu_seconds(log), 1),
                   "peak_rss_mib": round(peak_rss_mib(log), 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    ratios = []
    for pair in range(args.pairs):
        ours, theirs = (next(r for r in rows if r["pair"] == pair and r["who"] == w)
                        for w in ("ours", "lerobot"))
        ratios.append(theirs["s_per_update"] / ours["s_per_update"])
    print(json.dumps({"updates_per_s_ratio_ours_over_lerobot": ratios,
                      "median": statistics.median(ratios)}))
    (out / "speed.json").write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, default=Path("/work/venvs/lerobot"),
                        help="the side venv with lerobot (and the real torchvision)")
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("speed", help="matched runs, alternated")
    s.add_argument("data", type=Path)
    s.add_argument("--updates", type=int, default=100)
    s.add_argument("--log-every", type=int, default=10)
    s.add_argument("--pairs", type=int, default=1)
    s.add_argument("--limit-s", type=int, default=3600)
    s.add_argument("--full-width", action="store_true",
                   help="also ours with lerobot's backbone width (model.channels=64)")
    s.add_argument("--out", type=Path, default=Path("/tmp/vs_lerobot"))
    t = commands.add_parser("train-lerobot", help="lerobot's matched run alone, resumable")
    t.add_argument("data", type=Path)
    t.add_argument("--updates", type=int, default=8000)
    t.add_argument("--save-every", type=int, default=500)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--limit-s", type=int, default=6 * 3600)
    t.add_argument("--out", type=Path, default=Path("/tmp/vs_lerobot_train"))
    t.set_defaults(func=train_lerobot)
    from vs_lerobot_judge import add_judge_commands

    add_judge_commands(commands)
    args = parser.parse_args(argv)
    args.func(args) if hasattr(args, "func") else speed(args)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
