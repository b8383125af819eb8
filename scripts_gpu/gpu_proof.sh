#!/usr/bin/env bash
# The whole path on a GPU, in one call: switch variants against the configured model
# (cuDNN attention, native FP8, layouts; scripts_gpu/check_switches.py), then a synthetic
# training run that checkpoints, stops, resumes and ends where an uninterrupted run ends.
#
#   scripts_gpu/gpu_proof.sh OUT_DIR [MODEL_GIN] [BATCH] [STEPS] [INPUTS TARGETS]
#   scripts_gpu/gpu_proof.sh "$OUT" configs/models/t5_1_1/large.gin 32 200
#   VARIANTS=float32,fp8,te_fp8,te_attention TRAIN_FLAGS="--gin.FP8=True --gin.FP8_BACKEND='te'" \
#     scripts_gpu/gpu_proof.sh "$OUT/te" configs/models/t5_1_1/large.gin 32 200
#
# PACKED_MODEL=GIN also checks that model's variants PACKED_VARIANTS (float32,cudnn_lengths)
# on rows packed as two sequences of PACKED_LENGTH (2048) tokens, after the first check
# (OUT_DIR/switches_packed.json): the decoder-only recipes' cuDNN attention on packed data.
# SWITCH_TIMEOUT_S=N stops the switch checks after N seconds (then the resume proof runs);
# SWITCH_PARALLEL=1 runs it beside the training runs instead of before them (the device's
# memory split: SWITCH_MEM_FRACTION 0.25, TRAIN_MEM_FRACTION 0.6), for compiles that
# overlap on the host's cores.
# Writes OUT_DIR/switches.json, OUT_DIR/{first_half,second_half,uninterrupted}.log and
# OUT_DIR/proof.txt (losses at the first, middle and last step of each run; the exit status
# is non-zero when a switch is out of tolerance or the resumed run's last loss differs from
# the uninterrupted run's). Needs jax,
# flax, optax, orbax and gin-config (wheels in ./.whl are installed into /tmp if gin is
# missing), no TensorFlow: the data is random batches.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [MODEL_GIN] [BATCH] [STEPS] [INPUTS TARGETS]" >&2
  exit 2
fi
out=$(realpath -m "$1"); model=${2:-configs/models/t5_1_1/large.gin}
batch=${3:-32}; steps=${4:-200}; inputs=${5:-512}; targets=${6:-128}
half=$((steps / 2))
cd "$(dirname "$0")/.."
source scripts_gpu/xla_flags.sh
source scripts_gpu/common.sh
use_local_python_env || exit 2
mkdir -p "$out"
variants=${VARIANTS:-float32,dot_product,cudnn,fused_qkv,transpose_bs,scan_layers,fp8}
switch_rc=0
switches() {
  local start=$SECONDS rc=0 left=""
  ${SWITCH_TIMEOUT_S:+timeout --foreground -k 10 "$SWITCH_TIMEOUT_S"} \
    python3 scripts_gpu/check_switches.py --gin_file="$model" --variants="$variants" \
    --inputs_length="$inputs" --targets_length="$targets" --seq_length="$targets" \
    --batch=4 --json_out="$out/switches.json" 2>&1 | tee "$out/switches.log" || rc=$?
  [ -n "${PACKED_MODEL:-}" ] || return $rc
  # the decoder-only recipes' attention on packed rows, in what is left of the time
  if [ -n "${SWITCH_TIMEOUT_S:-}" ]; then
    left=$(( SWITCH_TIMEOUT_S - (SECONDS - start) ))
    [ "$left" -ge 20 ] || { echo "packed switch check skipped: $left s left" \
      | tee "$out/switches_packed.log"; return $rc; }
  fi
  ${left:+timeout --foreground -k 10 "$left"} \
    python3 scripts_gpu/check_switches.py --gin_file="$PACKED_MODEL" --packed \
    --variants="${PACKED_VARIANTS:-float32,cudnn_lengths}" --seq_length="${PACKED_LENGTH:-2048}" \
    --batch=4 --json_out="$out/switches_packed.json" 2>&1 | tee "$out/switches_packed.log" \
    || rc=$?
  return $rc
}
if [ "${SWITCH_PARALLEL:-0}" = 1 ]; then
  # beside the training runs: two processes share the device's memory
  XLA_PYTHON_CLIENT_MEM_FRACTION=${SWITCH_MEM_FRACTION:-0.25} switches > /dev/null & switch_pid=$!
  trap 'wait "$switch_pid"; cat "$out/switches.log" "$out/switches_packed.log" 2>/dev/null' EXIT  # (a training run failed)
  export XLA_PYTHON_CLIENT_MEM_FRACTION=${TRAIN_MEM_FRACTION:-0.6}
else
  switches || switch_rc=$?
fi

train() {  # MODEL_DIR TRAIN_STEPS LOG
  python3 -m t5lite.train --gin_file="$model" --gin_file=configs/synthetic_pretrain.gin \
    --gin.MODEL_DIR="\"$1\"" --gin.TRAIN_STEPS="$2" --gin.BATCH_SIZE="$batch" \
    "--gin.TASK_FEATURE_LENGTHS={'inputs': $inputs, 'targets': $targets}" \
    --gin.CHECKPOINT_PERIOD="$half" --gin.LOG_PERIOD=10 ${TRAIN_FLAGS:-} 2>&1 | tee "$3"
}
rm -rf "$out/run" "$out/run_uninterrupted"
train "$out/run" "$half" "$out/first_half.log"
train "$out/run" "$steps" "$out/second_half.log"
train "$out/run_uninterrupted" "$steps" "$out/uninterrupted.log"
last_loss() {  # LOG: the loss logged at the last step
  grep -oE "step $steps/$steps \| loss [^ ]+" "$1" | tail -1 | awk '{print $NF}'
}
if [ -n "${switch_pid:-}" ]; then
  trap - EXIT
  wait "$switch_pid" || switch_rc=$?
  cat "$out/switches.log" "$out/switches_packed.log" 2>/dev/null
fi
resumed=$(last_loss "$out/second_half.log"); whole=$(last_loss "$out/uninterrupted.log")
resume_rc=0
{
  echo "switch check exit status: $switch_rc"
  for f in first_half second_half uninterrupted; do
    echo "== $f"; grep -E "step [0-9]+/[0-9]+ \| loss|resum|restor" "$out/$f.log" | sed -n '1p;$p'
  done
  if [ -n "$resumed" ] && [ "$resumed" = "$whole" ]; then
    echo "resume: the resumed run's loss at step $steps equals the uninterrupted run's ($whole)"
  else
    echo "resume: MISMATCH at step $steps: resumed '${resumed:-none}', uninterrupted '${whole:-none}'"
  fi
} | tee "$out/proof.txt"
grep -q "^resume: MISMATCH" "$out/proof.txt" && resume_rc=1
rm -rf "$out/run" "$out/run_uninterrupted"   # checkpoints are too large to bring back
# non-zero when a switch variant is out of tolerance or the resume does not match
[ "$switch_rc" -eq 0 ] && [ "$resume_rc" -eq 0 ]
