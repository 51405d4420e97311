#!/usr/bin/env bash
# The GPU path in one command (under 4 minutes on one GPU): every CUDA-marked test (among
# them the steady state under torch.cuda.set_sync_debug_mode("error")), short CUDA trainings
# of sl_ddp and NeRD (1 process, and torchrun with 1 worker — 2 workers on NCCL when 2 GPUs
# are visible), bf16 and fp16 with the scaler, EMA and accumulation, an exact resume, FSDP2
# (trainer.strategy: fsdp, bf16, world size 1: resume and export) and NeRD compiled. With
# trainer.deterministic: true, two identical runs and a resume against the uninterrupted run
# must be bitwise equal (sl_ddp; NeRD's pair too; over NCCL when 2 GPUs are visible).
# Checks run side by side (GPU_CHECK_JOBS at a time, default 4; they are small). One line
# per check, then one summary line; exit 1 if any failed. Without CUDA: says so, exits 0.
#
# Needs only torch, pydantic, typer, rich, pyyaml and numpy (and pytest for the CUDA tests):
# this checkout is put first on PYTHONPATH, installed or not; the CUDA tests are collected
# from the files that hold them (no optional extra is imported).
#
#   bash benchmarks/gpu_check.sh            # from any directory
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
export PYTHONPATH="$REPO:$REPO/plugins/embodichain-models${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing checked"
  exit 0
fi
export OMP_NUM_THREADS=1
# The product sets the cuBLAS workspace itself under trainer.deterministic (every worker,
# before CUDA starts): a value inherited from the shell would hide a worker that does not.
# Without it torch refuses the first matmul of a deterministic run, so those checks fail.
unset CUBLAS_WORKSPACE_CONFIG
TMP=$(mktemp -d /tmp/gpu_check.XXXXXX)
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
BF16=$("$PY" -c "import torch; print(int(torch.cuda.is_bf16_supported()))")
JOBS=${GPU_CHECK_JOBS:-4}
BEGAN=$SECONDS
N=0

check() {  # check NAME COMMAND...: in the background, JOBS at a time; reported by `report`
  N=$((N + 1))
  local i=$N
  printf '%s\n' "$1" > "$TMP/check.$i.name"
  shift
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  ( start=$SECONDS
    if "$@" > "$TMP/check.$i.log" 2>&1; then status=PASS; else status=FAIL; fi
    echo "$status $((SECONDS - start))" > "$TMP/check.$i.status" ) &
}
report() {  # one line per check, in order, the output's tail on failure; the summary line
  wait
  local i failed=0 status took
  for i in $(seq 1 "$N"); do
    read -r status took < "$TMP/check.$i.status" || { status=FAIL; took=0; }
    printf '%s  %-56s %4ds\n' "$status" "$(cat "$TMP/check.$i.name")" "$took"
    if [ "$status" != PASS ]; then
      tail -15 "$TMP/check.$i.log" | sed 's/^/      | /'
      failed=$((failed + 1))
    fi
  done
  if [ $failed = 0 ]; then
    echo "gpu_check: all $N passed in $((SECONDS - BEGAN)) s ($NGPU GPU; $TMP)"
  else
    echo "gpu_check: $failed of $N FAILED in $((SECONDS - BEGAN)) s ($NGPU GPU; $TMP)"
  fi
  [ $failed = 0 ]
}
train() { "$PY" -m embodichain train-sl --no-progress "$@"; }
trun() { local n=$1; shift; "$PY" -m torch.distributed.run --standalone --nnodes=1 \
  --nproc-per-node="$n" -m embodichain train-sl --no-progress "$@"; }
same_state() { "$PY" - "$1" "$2" <<'PY'
import sys
from pathlib import Path

from tests.support.state_compare import assert_training_state_equal  # cwd: the repository
assert assert_training_state_equal(Path(sys.argv[1]), Path(sys.argv[2])) > 0
PY
}
same_shards() { "$PY" - "$1" "$2" <<'PY'
# two sharded checkpoints (trainer.strategy: fsdp) hold the same training state, bitwise
import sys
from pathlib import Path

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.sharded import read_shard, shard_table
from tests.support.state_compare import assert_state_equal  # cwd: the repository


def state(path):
    data = read_checkpoint(path)
    shards = {r: read_shard(path.parent, data, r)["payload"] for r in shard_table(data)}
    for shard in shards.values():
        shard.pop("run")
    return {"learner": data["payload"]["learner"], "shards": shards}
assert assert_state_equal(state(Path(sys.argv[1])), state(Path(sys.argv[2]))) > 0
PY
}

# NeRD's data first (every NeRD check reads it), while the CUDA tests start.
NERD=examples/learning/nerd/configs/cartpole/sl.train.yaml
"$PY" -m embodichain_models.dynamics.nerd.prepare --out "$TMP/nerd" --train-trajectories 200 \
  --val-trajectories 20 --steps 60 > "$TMP/nerd_prepare.log" 2>&1 &
PREPARE=$!

# The CUDA tests, from the files that hold them (collecting all of tests/ would import the
# optional extras); pyproject's addopts (xdist) replaced, so plain pytest will do.
if "$PY" -c "import pytest" 2>/dev/null; then
  for file in $(grep -rl --include='test_*.py' 'pytest.mark.cuda' tests | sort); do
    check "CUDA tests: ${file#tests/}" "$PY" -m pytest -q -p no:cacheprovider \
      -o addopts="--import-mode=importlib" -m cuda "$file"
  done
else
  check "CUDA tests (pytest is not installed: not run)" false
fi
SL=examples/learning/sl_ddp/cuda.yaml
SHORT=(--set trainer.max_updates=60 --set trainer.validate_every=30 --set trainer.save_every=30)
if ! "$PY" -c "from embodichain.core.recipe.discovery import resolve_factory as r; r('sl_ddp', False)" \
    2>/dev/null; then  # not installed: no entry points; the same factory by its module path
  SHORT+=(--set factory=embodichain.plugins.sl_ddp:build_supervised_trainer)
fi
check "sl_ddp cuda, 1 process" train --config $SL "${SHORT[@]}" --set trainer.output_dir=$TMP/sl_1p
check "sl_ddp cuda, torchrun 1 worker" trun 1 --config $SL "${SHORT[@]}" --set trainer.output_dir=$TMP/sl_tr1
if [ "$NGPU" -ge 2 ]; then
  check "sl_ddp cuda, torchrun 2 workers (NCCL)" trun 2 --config $SL "${SHORT[@]}" \
    --set trainer.output_dir=$TMP/sl_tr2
fi
if [ "$BF16" = 1 ]; then
  check "sl_ddp bf16" train --config $SL "${SHORT[@]}" --set trainer.precision=bf16 \
    --set trainer.output_dir=$TMP/sl_bf16
fi
check "sl_ddp fp16 with grad scaler" train --config $SL "${SHORT[@]}" --set trainer.precision=fp16 \
  --set trainer.output_dir=$TMP/sl_fp16
if [ "$BF16" = 1 ]; then  # FSDP2 on one GPU: world size 1 (a one-rank NCCL mesh), bf16 policy
  FSDP=(--set trainer.strategy=fsdp --set trainer.precision=bf16)
  check "sl_ddp fsdp bf16, 1 process" train --config $SL "${SHORT[@]}" "${FSDP[@]}" \
    --set trainer.output_dir=$TMP/sl_fsdp
  check "fsdp bf16 torchrun 1 worker: exact resume, export" bash -c "
    $(declare -f trun same_shards); PY=$PY
    trun 1 --config $SL ${SHORT[*]} ${FSDP[*]} --set trainer.output_dir=$TMP/sl_fsdp_tr1 &&
    trun 1 --config $SL ${SHORT[*]} ${FSDP[*]} --set trainer.output_dir=$TMP/sl_fsdp_res \
      --resume $TMP/sl_fsdp_tr1/step_30.pt &&
    same_shards $TMP/sl_fsdp_tr1/last.pt $TMP/sl_fsdp_res/last.pt &&
    $PY -m embodichain export $TMP/sl_fsdp_tr1/last.pt $TMP/sl_fsdp_model.pt"
fi
LOOPS=(--set trainer.batch_size=8 --set trainer.grad_accumulation=4 --set trainer.ema.decay=0.99
       --set trainer.ema.validate=both)
check "sl_ddp accumulation K=4 + EMA, torchrun 1 worker" trun 1 --config $SL "${SHORT[@]}" \
  "${LOOPS[@]}" --set trainer.output_dir=$TMP/sl_loops
# Bitwise only with trainer.deterministic: true (docs/recovery.md, where resume is bitwise).
DET=(--set trainer.deterministic=true)
check "deterministic: two runs, and a resume from 30, bitwise (K=4, EMA)" bash -c "
  $(declare -f train same_state); PY=$PY
  train --config $SL ${SHORT[*]} ${LOOPS[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_a &&
  train --config $SL ${SHORT[*]} ${LOOPS[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_b &&
  same_state $TMP/det_a/last.pt $TMP/det_b/last.pt &&
  train --config $SL ${SHORT[*]} ${LOOPS[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_res \
    --resume $TMP/det_a/step_30.pt && same_state $TMP/det_a/last.pt $TMP/det_res/last.pt"
if [ "$NGPU" -ge 2 ]; then  # NCCL_ALGO=Ring: the order of the ranks' sums, measured here
  check "deterministic: torchrun 2 workers (NCCL), two runs bitwise" bash -c "
    $(declare -f trun same_state); PY=$PY
    trun 2 --config $SL ${SHORT[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_nccl_a &&
    trun 2 --config $SL ${SHORT[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_nccl_b &&
    same_state $TMP/det_nccl_a/last.pt $TMP/det_nccl_b/last.pt"
fi

if wait "$PREPARE"; then NERD_DATA=true; else NERD_DATA=false; fi
check "NeRD data (prepare)" bash -c "$NERD_DATA || { tail -15 $TMP/nerd_prepare.log; false; }"
NSHORT=(--set device=cuda --set data.train=$TMP/nerd/train.pt --set data.val=$TMP/nerd/val.pt
        --set trainer.max_updates=100 --set trainer.validate_every=50 --set trainer.save_every=50
        --set validation.horizons=[1,10])
check "NeRD cuda, 1 process" train --config $NERD "${NSHORT[@]}" --set trainer.output_dir=$TMP/n_1p
check "NeRD cuda, torchrun 1 worker" trun 1 --config $NERD "${NSHORT[@]}" --set trainer.output_dir=$TMP/n_tr1
if [ "$BF16" = 1 ]; then
  check "NeRD bf16 (deprecated precision: key)" train --config $NERD "${NSHORT[@]}" \
    --set precision=bf16 --set trainer.precision=fp32 --set trainer.output_dir=$TMP/n_bf16
fi
check "NeRD fp16 with grad scaler + EMA" train --config $NERD "${NSHORT[@]}" \
  --set trainer.precision=fp16 --set trainer.ema.decay=0.999 --set trainer.output_dir=$TMP/n_fp16
check "NeRD compile" train --config $NERD "${NSHORT[@]}" --set trainer.compile=true \
  --set trainer.output_dir=$TMP/n_compile
check "NeRD deterministic: two identical runs bitwise" bash -c "
  $(declare -f train same_state); PY=$PY
  train --config $NERD ${NSHORT[*]} ${DET[*]} --set trainer.output_dir=$TMP/n_det_a &&
  train --config $NERD ${NSHORT[*]} ${DET[*]} --set trainer.output_dir=$TMP/n_det_b &&
  same_state $TMP/n_det_a/last.pt $TMP/n_det_b/last.pt"

report
