"""Run by torchrun (one process per rank): open a LeRobot dataset, read this rank's half of
its examples through 2 forked DataLoader workers, and write what each process's anonymous
memory (`Anonymous` of /proc/PID/smaps_rollup: heap and copies, not the page-cache pages of
a file mapping) was: before the dataset was opened, after, and the most any worker held
while it read. `python -m tests.models.lerobot.memory_probe ROOT OUT_DIR LIMIT_BYTES`: the
process's private writable memory is limited (RLIMIT_DATA) to what it had plus LIMIT_BYTES,
so a reader that copies the data fails fast instead of filling the machine."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from embodichain_models.data.lerobot import LeRobotFrames
from embodichain_models.data.lerobot.video import decode_png, encode_png


def anonymous_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1])
    raise RuntimeError("no Anonymous line in smaps_rollup")


class Probe(torch.utils.data.Dataset):
    """Each example read whole (images decoded), then this process's pid and memory."""

    def __init__(self, frames: LeRobotFrames) -> None:
        self.frames = frames

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int) -> torch.Tensor:
        example = self.frames[i]
        assert all(torch.is_tensor(v) for v in example.values())
        return torch.tensor([os.getpid(), anonymous_kib(), i])


def main(root: str, out: str, limit: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    decode_png(encode_png(np.zeros((8, 8, 3), np.uint8)), "warm-up")  # codec loaded
    before = anonymous_kib()
    data = int(next(line.split()[1] for line in Path("/proc/self/status").read_text()
                    .splitlines() if line.startswith("VmData:"))) * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (data + limit, data + limit))
    started = time.perf_counter()
    frames = LeRobotFrames(root)
    open_s = time.perf_counter() - started
    opened = anonymous_kib()
    loader = torch.utils.data.DataLoader(
        Probe(frames), batch_size=8, num_workers=2, multiprocessing_context="fork",
        sampler=list(range(rank, len(frames), world)))
    workers: dict[int, int] = {}
    seen = []
    for batch in loader:
        for pid, kib, i in batch.tolist():
            workers[pid] = max(workers.get(pid, 0), kib)
            seen.append(i)
    record = {"open_s": open_s, "before": before, "opened": opened, "after": anonymous_kib(),
              "workers": workers, "examples": sorted(seen)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
