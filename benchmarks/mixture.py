"""A mixture of two LeRobot video datasets against the same datasets read separately.

Two video datasets are written with the source's writer (a 224x224 camera, libx264, a
keyframe every 2 frames; the second names its camera differently and is mixed through
`rename`). The mixture (`lerobot_mixture`, weights 3:1, actions normalised per part) and
its two parts (the very `LeRobotFrames` objects the mixture wraps, so both read through
the same open containers) are read through DataLoaders with batch 32 and 0 or 2 workers
(fork). The examples are the same in both: positions are drawn as the framework's sampler
draws them (part i with probability w_i / sum(w), then an example of it uniformly, seeded),
the mixture reads them in that order, and each part's loader reads its share in the same
order. Rates are examples per second after each loader's first batch (worker start-up left
out; the separate reading has two loaders, hence two first batches). Mixture and separate
alternate pair by pair; the ratio is the median over pairs of mixture / separate.

    python benchmarks/mixture.py --workers 0 2 --pairs 6 --batches 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lerobot_decode import FPS, KEY, write  # noqa: E402

OTHER = "observation.images.front"


def _rate(dataset, order: list[int], workers: int) -> tuple[int, float]:
    """Examples after the first batch and the seconds they took."""
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, order),
                                         batch_size=32, num_workers=workers,
                                         multiprocessing_context="fork" if workers else None)
    count, start = 0, 0.0
    for n, batch in enumerate(loader):
        if n == 0:
            start = time.perf_counter()
        else:
            count += len(batch["action"])
    return count, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--batches", type=int, default=8, help="batches of 32 per measurement")
    parser.add_argument("--size", default="224x224")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from embodichain_models.data.lerobot import lerobot_mixture, lerobot_source

    print(json.dumps({"load": os.getloadavg()}), flush=True)
    h, w = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        first = write(Path(tmp) / "a", h, w, 8, 100, "libx264")
        second = write(Path(tmp) / "b", h, w, 6, 80, "libx264", key=OTHER)
        options = {"delta_timestamps": {KEY: [-1 / FPS, 0.0]}, "normalize": {"action": "mean_std"}}
        mixture = lerobot_mixture([(first, 3.0),
                                   (lerobot_source(second, rename={OTHER: KEY}, **options), 1.0)],
                                  **options)
        frames = mixture.dataset
        parts = frames.datasets
        sizes = [len(d) for d in parts]
        weights = np.array([3.0, 1.0])
        rows: list[dict] = []
        for workers in args.workers:
            mixed, separate = [], []
            for pair in range(args.pairs):
                rng = np.random.default_rng(pair)
                n = 32 * (args.batches + 2)
                which = rng.choice(2, size=n, p=weights / weights.sum())
                local = [int(rng.integers(sizes[p])) for p in which]
                order = [int(frames._starts[p]) + i for p, i in zip(which, local, strict=True)]
                shares = [[i for p, i in zip(which, local, strict=True) if p == k]
                          for k in range(2)]

                for name in ("mixture", "separate") if pair % 2 == 0 else ("separate",
                                                                             "mixture"):
                    if name == "mixture":
                        count, seconds = _rate(frames, order, workers)
                        mixed.append(count / seconds)
                    else:
                        got = [_rate(d, s, workers) for d, s in zip(parts, shares, strict=True)]
                        separate.append(sum(c for c, _ in got) / sum(s for _, s in got))
            rows.append({"workers": workers, "mixture_ex_s": statistics.median(mixed),
                         "separate_ex_s": statistics.median(separate),
                         "ratio": statistics.median(a / b for a, b in zip(mixed, separate,
                                                                          strict=True)),
                         "pairs": [[round(a, 1), round(b, 1)] for a, b in zip(mixed, separate,
                                                                              strict=True)],
                         "load": os.getloadavg()})
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
