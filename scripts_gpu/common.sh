# Shared by the launchers: turns the positional switches into gin flags in GIN_SWITCHES.
# PREC: bf16 | fp32 ; ENABLE_FP8, TRANSPOSE_BS, FUSE_QKV: 0/1 ; PACK: 0/1 (documented:
# the data pipeline packs only when the task config enables it).
# ENABLE_FP8=1 runs Transformer Engine's FP8 when it imports, native XLA FP8 otherwise;
# the environment variable FP8_BACKEND=te|native forces one. The choice is logged.
make_switches() {
  local prec=$1 fp8=$2 transpose=$3 fuse=$4
  case "$prec" in
    bf16) GIN_SWITCHES="--gin.ACTIVATION_DTYPE=\"bfloat16\"" ;;
    # cuDNN's fused attention (the larger recipes' default) runs in bf16 / fp16 only
    fp32) GIN_SWITCHES="--gin.ACTIVATION_DTYPE=\"float32\" --gin.ATTENTION_IMPL=\"xla\" --gin.ATTENTION_MASK=\"dense\"" ;;
    *) echo "error: PREC must be bf16 or fp32, got '$prec'" >&2; return 2 ;;
  esac
  if [ "$fp8" = 1 ]; then
    local backend=${FP8_BACKEND:-auto} why
    if [ "$backend" = auto ]; then
      if why=$(python3 -c "from t5lite.models import te_backend as t; r = t.unavailable_reason(); print(r or ''); raise SystemExit(1 if r else 0)" 2>/dev/null); then
        backend=te
      else
        backend=native
        echo "FP8: native XLA FP8 (Transformer Engine not usable: ${why:-it does not import})" >&2
      fi
    fi
    case "$backend" in
      te) echo "FP8: Transformer Engine $(python3 -c 'import importlib.metadata as m; print(m.version("transformer_engine"))' 2>/dev/null || echo '(version unknown)')" >&2 ;;
      native) ;;
      *) echo "error: FP8_BACKEND must be te, native or auto, got '$backend'" >&2; return 2 ;;
    esac
    [ "$backend" = native ] && [ "${FP8_BACKEND:-auto}" = native ] && echo "FP8: native XLA FP8 (FP8_BACKEND=native)" >&2
    GIN_SWITCHES="$GIN_SWITCHES --gin.FP8=True --gin.FP8_BACKEND=\"$backend\""
  fi
  [ "$transpose" = 1 ] && GIN_SWITCHES="$GIN_SWITCHES --gin.TRANSPOSE_BS=True"
  [ "$fuse" = 1 ] && GIN_SWITCHES="$GIN_SWITCHES --gin.FUSE_QKV=True"
  return 0
}

# check_model MODEL: a pretraining recipe configs/MODEL_pile_pretrain.gin exists (a T5 v1.1
# size: tiny ... xxl; or gpt126m, gpt175b, llama2_7b, llama2_70b, glam126m_64e, glam64b_64e,
# mixtral8x7b, switch_base8).
check_model() {
  local root names
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  [ -f "$root/configs/$1_pile_pretrain.gin" ] && return 0
  names=$(cd "$root/configs" && ls *_pile_pretrain.gin | sed 's/_pile_pretrain.gin//' | sort | paste -sd, - | sed 's/,/, /g')
  echo "error: MODEL must name a recipe configs/<MODEL>_pile_pretrain.gin ($names), got '$1'" >&2
  return 2
}

# SIZE: a T5 v1.1 size; tiny is a toy for trying a launcher on a CPU (the tests use it).
check_size() {
  case "$1" in
    tiny|small|base|large|xl|xxl) return 0 ;;
    *) echo "error: SIZE must be tiny, small, base, large, xl or xxl, got '$1'" >&2; return 2 ;;
  esac
}

# check_count NAME VALUE: VALUE is a whole number >= 1.
check_count() {
  case "$2" in
    ''|*[!0-9]*|0) echo "error: $1 must be a whole number >= 1, got '$2'" >&2; return 2 ;;
  esac
}

# The calling script's usage: its header comment (after the shebang, #SBATCH lines left
# out, up to the first line that is not a comment).
usage() {
  awk 'NR == 1 { next } /^#SBATCH/ { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

# exit_with_usage [MESSAGE]: MESSAGE (if any) as an error line, the usage, exit status 2.
exit_with_usage() {
  [ $# -gt 0 ] && echo "error: $*" >&2
  usage >&2
  exit 2
}

# wants_help ARGS...: whether the first argument asks for the usage.
wants_help() {
  case "${1:-}" in -h|--help|help) return 0 ;; *) return 1 ;; esac
}

# The GPU tools' Python path from the repository root: t5lite itself, and gin-config from
# wheels in ./.whl (installed into /tmp) on a machine without it, such as the GPU image.
use_local_python_env() {
  if ! python3 -c "import gin" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/t5lite_site .whl/*.whl || return 2
      export PYTHONPATH=/tmp/t5lite_site:${PYTHONPATH:-}
    else
      echo "error: gin-config is not installed and no wheels are in ./.whl" >&2
      return 2
    fi
  fi
  export PYTHONPATH=$PWD:${PYTHONPATH:-}
}

# After srun in a SLURM batch script: requeue the job (it resumes from its last
# checkpoint) when the step ended in a way a restart mends: t5lite's hung step (3), lost
# process (4), processes that did not join (5), or a task killed by a signal (>= 128).
# At most MAX_RESTARTS (3) times; a configuration or data error (1, 2) is not retried.
# usage: requeue_on_fault STATUS   (returns STATUS)
requeue_on_fault() {
  local status=$1 restarts=${SLURM_RESTART_COUNT:-0} max=${MAX_RESTARTS:-3}
  case "$status" in
    3|4|5) ;;
    *) [ "$status" -ge 128 ] || return "$status" ;;
  esac
  if [ "$restarts" -ge "$max" ]; then
    echo "error: the training step failed with status $status after $restarts restarts (MAX_RESTARTS=$max); not requeueing: see the task logs" >&2
    return "$status"
  fi
  echo "t5lite: the training step failed with status $status (see the task logs); requeueing job $SLURM_JOB_ID (restart $((restarts + 1)) of $max): it resumes from the last checkpoint" >&2
  scontrol requeue "$SLURM_JOB_ID"
  return "$status"
}
