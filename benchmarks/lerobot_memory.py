"""Peak anonymous memory per process and start-up time of the LeRobot reader on an image
dataset (PNG in the parquet rows) or, with `--video`, a video dataset (one mp4 per camera
and file, its start-up dominated by the check that every video holds its frames), 2 ranks ×
2 data workers, this tree against another checkout (`--before`, e.g. a worktree of the
commit before the node-local table cache and the once-per-machine video checks).

Each run is `tests/models/lerobot/memory_probe.py` under torchrun: every rank opens the
dataset (timed), then reads its half of the examples through 2 forked workers. Every 0.1 s
this script reads `Anonymous` (heap and copies; not page-cache pages of a mapping) of each
rank and worker from /proc/PID/smaps_rollup and keeps each process's peak. "after, cold" is
the first run on a node (the cache is built); "after, warm" maps the existing cache.

    python benchmarks/lerobot_memory.py --gib 2 --dir /tmp/lrmem [--before /path/to/tree]
    python benchmarks/lerobot_memory.py --video 400 --dir /tmp/lrmem [--before /path/to/tree]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, bench_env, child_pids, torchrun  # noqa: E402


def make_dataset(root: Path, gib: float) -> None:
    """Noise PNGs at 512 px (~0.8 MB a frame), 40 frames an episode, 2 episodes a file;
    4 distinct episodes cycled so the writer holds little in memory."""
    import numpy as np
    from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

    rng = np.random.default_rng(0)
    pool = [rng.integers(0, 256, (40, 512, 512, 3), dtype=np.uint8) for _ in range(4)]
    count = max(1, round(gib * (1 << 30) / (40 * 790_000)))
    episodes = [EpisodeData("noise", {
        "observation.image": pool[i % 4],
        "observation.state": rng.standard_normal((40, 4)).astype(np.float32)})
        for i in range(count)]
    write_dataset(root, episodes, {"observation.image": feature("image", (512, 512, 3)),
                                   "observation.state": feature("float32", (4,))}, 10,
                  episodes_per_file=2)


def make_video_dataset(root: Path, episodes: int) -> None:
    """`episodes` episodes of 40 frames of a 224 px camera (smooth noise, so the encoder has
    motion to code), 10 episodes a file."""
    import numpy as np
    from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (40, 224, 224, 3), dtype=np.uint8)
    recorded = [EpisodeData("noise", {
        "observation.images.top": np.roll(base, i, axis=2),
        "observation.state": rng.standard_normal((40, 4)).astype(np.float32)})
        for i in range(episodes)]
    write_dataset(root, recorded, {"observation.images.top": feature("video", (224, 224, 3)),
                                   "observation.state": feature("float32", (4,))}, 10,
                  episodes_per_file=10)


def anonymous_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(tree: Path, data: Path, out: Path, cache: Path) -> dict[str, object]:
    """One 2 × 2 run of the probe from `tree`: peaks (MiB) of every rank and worker."""
    out.mkdir(parents=True, exist_ok=True)
    env = bench_env(tree, tree / "plugins/embodichain-models", EMBODICHAIN_CACHE_DIR=str(cache),
                    MALLOC_MMAP_THRESHOLD_="131072")
    started = time.perf_counter()
    proc = subprocess.Popen(torchrun("-m", "tests.models.lerobot.memory_probe", str(data),
                                     str(out), str(64 << 30)), cwd=tree, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[int, int] = {}
    ranks: set[int] = set()
    while proc.poll() is None:
        for rank in child_pids(proc.pid):
            ranks.add(rank)
            for pid in [rank, *child_pids(rank)]:
                peaks[pid] = max(peaks.get(pid, 0), anonymous_kib(pid))
        time.sleep(0.1)
    wall = time.perf_counter() - started
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        return {"failed": output.strip().splitlines()[-40:], "wall_s": round(wall, 1),
                "peak_rank_mib": [round(peaks[p] / 1024) for p in sorted(ranks)]}
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {"open_s": [round(r["open_s"], 2) for r in records], "wall_s": round(wall, 1),
            "peak_rank_mib": [round(peaks[p] / 1024) for p in sorted(ranks)],
            "peak_worker_mib": sorted(round(v / 1024) for p, v in peaks.items()
                                      if p not in ranks),
            "rank_before_mib": [round(r["before"] / 1024) for r in records]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lerobot_memory"))
    parser.add_argument("--video", type=int, metavar="EPISODES",
                        help="a video dataset of this many episodes instead of images")
    parser.add_argument("--before", type=Path, help="a checkout of the reader before")
    args = parser.parse_args()
    data = args.dir / (f"video_{args.video}" if args.video else f"data_{args.gib:g}gib")
    if not data.exists():
        started = time.perf_counter()
        if args.video:
            make_video_dataset(data, args.video)
        else:
            make_dataset(data, args.gib)
        print(f"wrote {data} in {time.perf_counter() - started:.0f} s", flush=True)
    size = sum(p.stat().st_size for p in data.rglob("*") if p.suffix in (".parquet", ".mp4"))
    print(json.dumps({"dataset_mib": round(size / (1 << 20))}), flush=True)
    cache = args.dir / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    results = {}
    if args.before:
        results["before"] = run(args.before, data, args.dir / "out_before", cache)
    results["after, cold"] = run(REPO, data, args.dir / "out_cold", cache)
    results["after, warm"] = run(REPO, data, args.dir / "out_warm", cache)
    for name, result in results.items():
        print(json.dumps({"run": name, **result}), flush=True)


if __name__ == "__main__":
    main()
