#!/usr/bin/env bash
# The GPU path in one command (a few minutes on one GPU): every CUDA-marked test, short
# CUDA trainings of sl_ddp and NeRD (1 process, and torchrun with 1 worker — 2 workers on
# NCCL when 2 GPUs are visible), bf16 and fp16 with the scaler, EMA and accumulation, an
# exact resume, and FSDP2 (trainer.strategy: fsdp, bf16, world size 1: resume and export).
# With trainer.deterministic: true, two identical runs and a resume against the uninterrupted
# run must be bitwise equal (sl_ddp; NeRD's pair too; over NCCL when 2 GPUs are visible).
# One line per check; exit 1 if any failed. Without CUDA: says so, exits 0.
#
#   bash benchmarks/gpu_check.sh            # from the checkout, in the project's venv
set -u
cd "$(dirname "$0")/.."
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
failed=0

check() {  # check NAME COMMAND...: one line, the output's tail on failure
  local name=$1 start=$SECONDS out
  shift
  if out=$("$@" 2>&1); then
    printf 'PASS  %-52s %4ds\n' "$name" $((SECONDS - start))
  else
    printf 'FAIL  %-52s %4ds\n' "$name" $((SECONDS - start))
    printf '%s\n' "$out" | tail -15 | sed 's/^/      | /'
    failed=1
  fi
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

SL=examples/learning/sl_ddp/cuda.yaml
SHORT=(--set trainer.max_updates=60 --set trainer.validate_every=30 --set trainer.save_every=30)
check "CUDA-marked tests (pytest -m cuda)" "$PY" -m pytest -q -n0 -m cuda tests
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
check "deterministic: two identical runs bitwise (K=4, EMA)" bash -c "
  $(declare -f train same_state); PY=$PY
  train --config $SL ${SHORT[*]} ${LOOPS[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_a &&
  train --config $SL ${SHORT[*]} ${LOOPS[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_b &&
  same_state $TMP/det_a/last.pt $TMP/det_b/last.pt"
check "deterministic: resume from update 30 bitwise (K=4, EMA)" bash -c "
  $(declare -f train same_state); PY=$PY
  train --config $SL ${SHORT[*]} ${LOOPS[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_res \
    --resume $TMP/det_a/step_30.pt && same_state $TMP/det_a/last.pt $TMP/det_res/last.pt"
if [ "$NGPU" -ge 2 ]; then  # NCCL_ALGO=Ring: the order of the ranks' sums, measured here
  check "deterministic: torchrun 2 workers (NCCL), two runs bitwise" bash -c "
    $(declare -f trun same_state); PY=$PY
    trun 2 --config $SL ${SHORT[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_nccl_a &&
    trun 2 --config $SL ${SHORT[*]} ${DET[*]} --set trainer.output_dir=$TMP/det_nccl_b &&
    same_state $TMP/det_nccl_a/last.pt $TMP/det_nccl_b/last.pt"
fi

NERD=examples/learning/nerd/configs/cartpole/sl.train.yaml
check "NeRD data (prepare)" "$PY" -m embodichain_models.dynamics.nerd.prepare --out $TMP/nerd \
  --train-trajectories 200 --val-trajectories 20 --steps 60
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

if [ $failed = 0 ]; then echo "gpu_check: all passed ($TMP)"; else echo "gpu_check: FAILED ($TMP)"; fi
exit $failed
