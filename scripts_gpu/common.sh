# Shared by the launchers: turns the positional switches into gin flags in GIN_SWITCHES.
# PREC: bf16 | fp32 ; ENABLE_FP8, TRANSPOSE_BS, FUSE_QKV: 0/1 ; PACK: 0/1 (documented:
# the data pipeline packs only when the task config enables it).
make_switches() {
  local prec=$1 fp8=$2 transpose=$3 fuse=$4
  case "$prec" in
    bf16) GIN_SWITCHES="--gin.ACTIVATION_DTYPE=\"bfloat16\"" ;;
    fp32) GIN_SWITCHES="--gin.ACTIVATION_DTYPE=\"float32\"" ;;
    *) echo "error: PREC must be bf16 or fp32, got '$prec'" >&2; return 2 ;;
  esac
  [ "$fp8" = 1 ] && GIN_SWITCHES="$GIN_SWITCHES --gin.FP8=True"
  [ "$transpose" = 1 ] && GIN_SWITCHES="$GIN_SWITCHES --gin.TRANSPOSE_BS=True"
  [ "$fuse" = 1 ] && GIN_SWITCHES="$GIN_SWITCHES --gin.FUSE_QKV=True"
  return 0
}

check_size() {
  case "$1" in
    small|base|large|xl|xxl) return 0 ;;
    *) echo "error: SIZE must be small, base, large, xl or xxl, got '$1'" >&2; return 2 ;;
  esac
}
