"""The LeRobot source against hand-written PyAV + pyarrow code, side by side in one run.

1. Loading: examples per second of `LeRobotFrames` (the cart-pole behaviour-cloning
   examples: two camera frames from the mp4, the state, an 8-step action chunk with its pad
   mask, normalised) in a DataLoader with 0, 1 and 2 workers, against a hand-written
   dataset that reads the parquet tables with pyarrow and decodes the same frames with
   PyAV the way lerobot does (one `av.open` per example), in the same DataLoader. The same
   seeded random indices for both; the two alternate per round.
2. Training: the policy's time per update under `train-sl` (the recipe, 2 data workers)
   against the same model, objective and optimiser in a hand-written loop over a
   DataLoader of the same dataset with the same workers.
3. Identity: the start-up cost of the source's identity for the prepared dataset, first
   (every file hashed) and then cached (the digests beside the files), per GB.

    python benchmarks/lerobot_source.py --episodes 40 --batches 20 --rounds 3 --updates 150
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

DELTAS = {"observation.image": [-1 / 30, 0.0], "action": [i / 30 for i in range(8)]}


class HandWritten(torch.utils.data.Dataset):
    """What a user writes without the source: pyarrow tables, PyAV per example."""

    def __init__(self, root: Path) -> None:
        import pyarrow.parquet as pq

        self.root = root
        episodes = pq.read_table(next((root / "meta/episodes").glob("*/*.parquet"))).to_pylist()
        tables = [pq.read_table(p) for p in sorted((root / "data").glob("*/*.parquet"))]
        self.state = np.concatenate([np.stack(t.column("observation.state").to_numpy(
            zero_copy_only=False)) for t in tables]).astype(np.float32)
        self.action = np.concatenate([t.column("action").to_numpy() for t in tables])
        self.episode = np.concatenate([t.column("episode_index").to_numpy() for t in tables])
        self.ts = np.concatenate([t.column("timestamp").to_numpy() for t in tables])
        self.eps = {e["episode_index"]: e for e in episodes}
        stats = json.loads((root / "meta/stats.json").read_text())["action"]
        self.mean, self.std = stats["mean"][0], stats["std"][0]

    def __len__(self) -> int:
        return len(self.state)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import av

        e = self.eps[int(self.episode[i])]
        lo, hi = e["dataset_from_index"], e["dataset_to_index"]
        chunk = np.arange(i, i + 8)
        pad = chunk >= hi
        action = (self.action[np.minimum(chunk, hi - 1)] - self.mean) / self.std
        rows = [max(lo, i - 1), i]
        path = self.root / ("videos/observation.image/chunk-{:03d}/file-{:03d}.mp4".format(
            e["videos/observation.image/chunk_index"], e["videos/observation.image/file_index"]))
        want = [e["videos/observation.image/from_timestamp"] + float(self.ts[r]) for r in rows]
        frames, times = [], []
        with av.open(str(path)) as c:
            s = c.streams.video[0]
            c.seek(max(0, round(want[0] / s.time_base) - 1), backward=True, stream=s)
            for f in c.decode(s):
                t = float(f.pts * s.time_base)
                frames.append(f.to_ndarray(format="rgb24"))
                times.append(t)
                if t >= want[-1]:
                    break
        picked = [frames[int(np.abs(np.array(times) - w).argmin())] for w in want]
        image = torch.from_numpy(np.stack(picked)).permute(0, 3, 1, 2).float() / 255
        return {"observation.image": image, "observation.state": torch.from_numpy(self.state[i]),
                "action": torch.from_numpy(action.astype(np.float32)),
                "action_is_pad": torch.from_numpy(pad)}


def _loader(dataset, workers: int, batches: int, seed: int):
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True, num_samples=64 * batches,
                                             generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler,
                                       num_workers=workers, prefetch_factor=2 if workers else None,
                                       multiprocessing_context="fork" if workers else None)


def _rate(dataset, workers: int, batches: int, seed: int) -> float:
    start = time.perf_counter()
    count = sum(len(b["action"]) for b in _loader(dataset, workers, batches, seed))
    return count / (time.perf_counter() - start)


def loading(root: Path, batches: int, rounds: int) -> list[dict]:
    from embodichain_models.data.lerobot.dataset import LeRobotFrames

    ours = LeRobotFrames(root, delta_timestamps=DELTAS, normalize={"action": "mean_std"})
    theirs = HandWritten(root)
    rows = []
    for workers in (0, 1, 2):
        a, b = [], []
        for r in range(rounds):
            a.append(_rate(ours, workers, batches, r))
            b.append(_rate(theirs, workers, batches, r))
        rows.append({"workers": workers, "source_ex_s": statistics.median(a),
                     "hand_ex_s": statistics.median(b),
                     "ratio": statistics.median(x / y for x, y in zip(a, b, strict=True))})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def hand_loop(root: Path, updates: int, workers: int) -> float:
    """Seconds per update of the hand-written loop: wall time after 10 warm-up updates."""
    from embodichain_models.data.lerobot.dataset import LeRobotFrames
    from embodichain_models.policies.cartpole_bc.policy import ChunkPolicy, objective

    dataset = LeRobotFrames(root, delta_timestamps=DELTAS, normalize={"action": "mean_std"})
    stats = dataset.meta.stats
    torch.manual_seed(0)
    model = ChunkPolicy(2, 64, 8, 32, 256,
                        torch.tensor(stats["observation.state"]["std"])[[0, 2, 3]].float(),
                        torch.tensor(stats["action"]["mean"]), torch.tensor(stats["action"]["std"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = 0.0
    for n, batch in enumerate(_loader(dataset, workers, updates, 0)):
        if n == 10:
            start = time.perf_counter()
        result = objective(model, batch)
        optimizer.zero_grad()
        result.loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / (updates - 10)


def framework_loop(root: Path, updates: int, workers: int, work: Path) -> float:
    """Seconds per update of `train-sl`: its logged elapsed time from update 10 to the end."""
    from importlib.resources import files

    recipe = yaml.safe_load(files("embodichain_models.recipes").joinpath("cartpole_bc.yaml")
                            .read_text())
    recipe["device"] = "cpu"
    recipe["data"]["root"] = str(root)
    recipe["trainer"].update(max_updates=updates, validate_every=0, save_every=0, log_every=10,
                             data_workers=workers, output_dir=str(work / "run"))
    (work / "r.yaml").write_text(yaml.safe_dump(recipe))
    subprocess.run([sys.executable, "-m", "embodichain", "train-sl", "--config",
                    str(work / "r.yaml"), "--no-progress"], check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = [json.loads(line) for line in (work / "run/metrics.jsonl").read_text().splitlines()]
    elapsed = {r["step"]: r["time/elapsed_s"] for r in records if "time/elapsed_s" in r}
    return (elapsed[updates] - elapsed[10]) / (updates - 10)


def identity_cost(root: Path) -> dict:
    from embodichain_models.data.lerobot.dataset import LeRobotFrames
    from embodichain_models.data.lerobot.identity import dataset_identity, source_files

    dataset = LeRobotFrames(root)
    files = source_files(dataset)
    size = sum(p.stat().st_size for p in files)
    # Digests are cached per user (core/data/digests.py): a fresh cache makes the first
    # identity a real hash of every byte.
    os.environ["EMBODICHAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="embodichain-cache-")
    start = time.perf_counter()
    dataset_identity(dataset)
    first = time.perf_counter() - start
    start = time.perf_counter()
    dataset_identity(dataset)
    cached = time.perf_counter() - start
    # Hashing throughput on a larger file, for the per-GB figure.
    big = root.parent / "big.bin"
    big.write_bytes(os.urandom(256 << 20))
    from embodichain.learning.sl import file_digest

    start = time.perf_counter()
    file_digest(big, cache=False)
    per_gb = (time.perf_counter() - start) * 4
    big.unlink()
    return {"files": len(files), "bytes": size, "first_s": first, "cached_s": cached,
            "hash_s_per_gb": per_gb, "cached_s_per_file": cached / len(files)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--batches", type=int, default=20, help="batches of 64 per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=150)
    parser.add_argument("--pairs", type=int, default=2, help="train-sl / hand-written pairs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from embodichain_models.data.cartpole.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        root = prepare(Path(tmp) / "data", args.episodes, seed=0)
        results = {"loading": loading(root, args.batches, args.rounds)}
        fw, hand = [], []
        for pair in range(args.pairs):  # alternating, so both see the same machine load
            work = Path(tmp) / f"fw{pair}"
            work.mkdir()
            fw.append(framework_loop(root, args.updates, 2, work))
            hand.append(hand_loop(root, args.updates, 2))
        results["update"] = {"train_sl_s": statistics.median(fw),
                             "hand_s": statistics.median(hand),
                             "ratio": statistics.median(a / b for a, b in zip(fw, hand,
                                                                              strict=True)),
                             "pairs": [[a, b] for a, b in zip(fw, hand, strict=True)]}
        print(json.dumps(results["update"]), flush=True)
        results["identity"] = identity_cost(root)
        print(json.dumps(results["identity"]), flush=True)


if __name__ == "__main__":
    main()
