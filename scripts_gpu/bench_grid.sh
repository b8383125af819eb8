#!/usr/bin/env bash
# A whole benchmark grid in one process: one JSON per configuration (the format of
# `python -m t5lite.bench --json_out`), summary.json and a markdown table results.md,
# each written as soon as its configuration is measured.
#
#   scripts_gpu/bench_grid.sh GRID_FILE OUT_DIR [flags for python -m t5lite.bench]
#   scripts_gpu/bench_grid.sh scripts_gpu/grids/sizes.json /tmp/grid --only='large_*'
#   scripts_gpu/bench_grid.sh scripts_gpu/grids/sizes.json "$OUT" --time_budget_s=540
#
# Grids shipped: grids/sizes.json (small..xl, bf16 and FP8, per-GPU batch sweeps),
# grids/switches.json (large with each switch flipped), grids/cpu_smoke.json (seconds,
# any machine). Run from anywhere; needs jax, flax, optax, orbax and gin-config only (no
# TensorFlow). On a machine without gin-config, wheels in ./.whl are installed first
# (into /tmp, nothing system-wide).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 GRID_FILE OUT_DIR [python -m t5lite.bench flags]" >&2
  exit 2
fi
grid=$(realpath "$1"); out=$2; shift 2
cd "$(dirname "$0")/.."
source scripts_gpu/xla_flags.sh
source scripts_gpu/common.sh
use_local_python_env || exit 2
mkdir -p "$out"
{ command -v nvidia-smi >/dev/null && nvidia-smi; echo "XLA_FLAGS=$XLA_FLAGS"; } \
  > "$out/machine.txt" 2>&1 || true
python3 -m t5lite.bench --grid="$grid" --out_dir="$out" "$@" 2>&1 | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
