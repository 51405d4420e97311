"""Wall time of a 10-update sl_ddp run, start-up dominated: one node with 2 workers
(torchrun --standalone), two torchrun agents with 1 worker each (static rendezvous, each in
its own working directory) and the self-launch (`--nproc-per-node 2`), interleaved.

    python benchmarks/startup_nodes.py 5
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
base = yaml.safe_load((REPO / "examples/learning/sl_ddp/cpu.yaml").read_text())
base["trainer"].update(max_updates=10, save_every=10, validate_every=10, log_every=10, output_dir="outputs/run")
env = {**os.environ, "OMP_NUM_THREADS": "1"}
py = sys.executable
def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]
def one_node(root):
    (root / "r.yaml").write_text(yaml.safe_dump(base))
    t = time.perf_counter()
    subprocess.run([py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "embodichain", "train-sl", "--config", "r.yaml", "--no-progress"], cwd=root, env=env, check=True, capture_output=True)
    return time.perf_counter() - t
def self_launch(root):
    (root / "r.yaml").write_text(yaml.safe_dump(base))
    t = time.perf_counter()
    subprocess.run([py, "-m", "embodichain", "train-sl", "--config", "r.yaml", "--nproc-per-node", "2", "--no-progress"], cwd=root, env=env, check=True, capture_output=True)
    return time.perf_counter() - t
def two_nodes(root):
    p = port(); procs = []
    t = time.perf_counter()
    for n in (0, 1):
        d = root / f"n{n}"; d.mkdir(); (d / "r.yaml").write_text(yaml.safe_dump(base))
        procs.append(subprocess.Popen([py, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={n}", "--master-addr=127.0.0.1", f"--master-port={p}", "-m", "embodichain", "train-sl", "--config", "r.yaml", "--no-progress"], cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for q in procs: assert q.wait() == 0
    return time.perf_counter() - t
res = {"1 node x 2 (torchrun --standalone)": [], "2 nodes x 1 (static rendezvous)": [], "1 node x 2 (--nproc-per-node 2)": []}
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for name, f in zip(res, (one_node, two_nodes, self_launch)):
        with tempfile.TemporaryDirectory() as d:
            res[name].append(f(Path(d)))
    print(i, {k: round(v[-1], 2) for k, v in res.items()}, flush=True)
for k, v in res.items(): print(f"{k}: median {statistics.median(v):.2f} s ({', '.join(f'{x:.2f}' for x in v)})")
