#!/usr/bin/env bash
# A whole GPU session in one call, ended by itself within DEADLINE_S (450 s): the
# machine's versions, the switch and checkpoint-resume proof on T5 small, the priority
# grid (grids/priority.json: large bf16 at 32 and 64, bf16 attention scores, cuDNN with
# the mask as lengths, large FP8, cuDNN attention, fused QKV, then small, base, xl), a profile of one large step (its 25 most expensive XLA ops)
# and an A/B of the initializer's compile with jax_threefry_gpu_kernel_lowering off / on.
#
#   scripts_gpu/gpu_session.sh OUT_DIR
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && PYTHONPATH=/tmp/site:$PWD bash scripts_gpu/gpu_session.sh "$OUT"
#
# Phases, in order (PHASES names and orders them): versions, proof, grid_head (the grid's
# runs matching GRID_HEAD), profile, init_ab, grid_tail (the rest of the grid). Each runs
# under `timeout` for its cap, or for what is left before the deadline less what it keeps
# for the phases after it (the proof keeps HEAD_MIN_S + PROFILE_S, the grid's head
# PROFILE_S); a phase that would get less than its minimum is skipped, and the grid starts
# no configuration it cannot finish (bench's --time_budget_s). After every phase OUT_DIR
# is rewritten, so a session cut off from outside keeps what came before. OUT_DIR holds 7
# files, none in folders:
#   summary.txt      one page: versions, phase verdicts, proof, grid table, init A/B, ops
#   versions.txt     pip list (jax, jaxlib, flax, optax, orbax-checkpoint, numpy,
#                    tensorstore), the versions imported, transformer_engine, the device
#   proof.txt, results.md, profile.txt   the proof's, the grid's, the profile's own reports
#   session.log      this script's lines (each phase's output is in its log in the archive)
#   session.tar.gz   everything else: each grid configuration's JSON, every log, the
#                    switch report, the profile and A/B JSONs, and gpu/: this GPU's XLA
#                    target config (target_config.txtpb) and the autotune results of
#                    every program each phase compiled (autotune_PHASE.textproto), which
#                    later CPU-side compiles load (`info --gpu=gpu/target_config.txtpb
#                    --autotune_results=...`, docs/performance.md)
# Every grid row has the step-time predictor's time for the program the GPU compiled
# ("pred ms", tools/step_time.py) beside the measured ones.
# The proof runs the switch check beside its training runs (gpu_proof.sh SWITCH_PARALLEL).
# Compiles are shared through JAX's persistent cache (JAX_COMPILATION_CACHE_DIR and
# T5LITE_COMPILATION_CACHE_DIR, both CACHE_DIR; emptied first unless KEEP_CACHE=1): the
# proof's second and third runs, the profile (the grid's large_bf16 step and init) and
# the A/B's step load what was compiled before. JAX caches only compiles of at least
# jax_persistent_cache_min_compile_time_secs (1 s; JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS).
# Each A/B arm runs on a copy of the cache without the initializers (jit_init-*), so both
# compile theirs. Exit status 0 when every phase that ran ended well.
#
# Overrides (environment; image_smoke.sh runs this on a CPU with the tiny T5):
#   GRID (grids/priority.json), GRID_HEAD ('large_bf16': run-name patterns), SMALL_MODEL
#   (configs/models/t5_1_1/small.gin), PROOF_BATCH (32), PROOF_STEPS (20), VARIANTS
#   (float32,cudnn,cudnn_lengths,fp8,fused_qkv), PACKED_MODEL (configs/models/gpt/126m.gin;
#   empty: none) and PACKED_VARIANTS (float32,cudnn_lengths): the same check on rows packed as
#   two sequences (the decoder-only recipes' attention), LARGE_RECIPE (configs/large_pile_pretrain.gin) and
#   LARGE_BATCH (32, global) for the profile and the A/B, INPUTS / TARGETS (512 / 128);
#   DEADLINE_S (450); caps PROOF_S (150; the switch check SWITCH_S, 15 s less), HEAD_S
#   (240), PROFILE_S (60), AB_S (150); HEAD_MIN_S (150), AB_MIN_S (60); WORK_DIR
#   (/tmp/t5lite_session), CACHE_DIR (/tmp/t5lite_compile_cache).
set -uo pipefail
if [ $# -ne 1 ] || [ "${1:-}" = --help ]; then
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" >&2
  exit 2
fi
t0=$(date +%s)
out=$(realpath -m "$1")
cd "$(dirname "$0")/.."
grid=$(realpath "${GRID:-scripts_gpu/grids/priority.json}")
head_patterns=${GRID_HEAD:-large_bf16}
small=${SMALL_MODEL:-configs/models/t5_1_1/small.gin}
large=${LARGE_RECIPE:-configs/large_pile_pretrain.gin}; large_batch=${LARGE_BATCH:-32}
inputs=${INPUTS:-512}; targets=${TARGETS:-128}
deadline=${DEADLINE_S:-450}
work=${WORK_DIR:-/tmp/t5lite_session}; cache=${CACHE_DIR:-/tmp/t5lite_compile_cache}
mkdir -p "$out"; rm -rf "$work"; mkdir -p "$work/logs" "$work/gpu"
[ "${KEEP_CACHE:-0}" = 1 ] || rm -rf "$cache"
mkdir -p "$cache"
export JAX_COMPILATION_CACHE_DIR=$cache T5LITE_COMPILATION_CACHE_DIR=$cache PYTHONUNBUFFERED=1
exec > >(tee "$out/session.log") 2>&1
source scripts_gpu/xla_flags.sh
source scripts_gpu/common.sh
use_local_python_env || exit 2
lengths="--gin.TASK_FEATURE_LENGTHS={'inputs': $inputs, 'targets': $targets}"

left() { echo $(( deadline - ($(date +%s) - t0) )); }
device=$( { nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null \
  || echo "no GPU ($(nproc) CPU cores)"; } | head -1)
{ echo "device=$device"; echo "started=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "deadline=$deadline"; echo "cache=$cache, $(ls "$cache" | wc -l) entries at start"
} > "$work/session.env"

refresh() {  # OUT_DIR from what the phases left so far (each file replaced whole)
  sed -i "/^elapsed=\|^cache_now=/d" "$work/session.env"
  { echo "elapsed=$(( $(date +%s) - t0 ))"
    echo "cache_now=$(ls "$cache" | wc -l) entries, $(du -sh "$cache" | cut -f1)"; } >> "$work/session.env"
  python3 scripts_gpu/session_summary.py "$work" > "$out/summary.txt.tmp" 2>&1
  mv "$out/summary.txt.tmp" "$out/summary.txt"
  cat "$work"/grid_*/results.md > "$out/results.md.tmp" 2>/dev/null && mv "$out/results.md.tmp" "$out/results.md"
  rm -f "$out/results.md.tmp"
  for f in logs/versions.log proof/proof.txt profile/profile.txt; do
    [ -f "$work/$f" ] && cp "$work/$f" "$out/$(basename "${f/versions.log/versions.txt}")"
  done
  tar -czf "$out/session.tar.gz.tmp" -C "$work" --exclude=./proof/run \
    --exclude=./proof/run_uninterrupted . 2>/dev/null && mv "$out/session.tar.gz.tmp" "$out/session.tar.gz"
  rm -f "$out/session.tar.gz.tmp"
}

status=0
phase() {  # NAME CAP_S RESERVE_S MIN_S COMMAND...: COMMAND under `timeout` for CAP_S, or
  # what is left but RESERVE_S (for the phases after it); skipped with less than MIN_S
  local name=$1 cap=$2 reserve=$3 min=$4 limit rc start; shift 4
  limit=$(( $(left) - 5 - reserve )); [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt "$min" ]; then
    printf '%s\tskipped (%s s left)\n' "$name" "$(left)" >> "$work/phases.tsv"
    echo "== $name skipped: $(left) s left"; return 0
  fi
  echo "== $name (limit $limit s, $(left) s left) $(date -u +%H:%M:%S)"
  start=$(date +%s)
  PHASE_LIMIT=$limit timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@" \
    > "$work/logs/$name.log" 2>&1; rc=$?
  local took=$(( $(date +%s) - start )) verdict=ok
  case $rc in
    0) ;;
    124|137) verdict="cut off at $limit s"; status=1 ;;
    *) verdict="failed (exit $rc)"; status=1 ;;
  esac
  printf '%s\t%s, %s s\n' "$name" "$verdict" "$took" >> "$work/phases.tsv"
  echo "== $name: $verdict after $took s"
  [ "$rc" -eq 0 ] || tail -5 "$work/logs/$name.log" | sed 's/^/   | /'
  refresh
}

versions() {
  python3 -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda[0-9]+-(plugin|pjrt)|flax|optax|orbax-checkpoint|numpy|tensorstore|gin-config) "
  python3 - <<'PY'
import importlib, importlib.metadata, os, jax
found = []
for module, dist in [("jax", "jax"), ("jaxlib", "jaxlib"), ("flax", "flax"), ("optax", "optax"),
                     ("orbax.checkpoint", "orbax-checkpoint"), ("numpy", "numpy"),
                     ("tensorstore", "tensorstore"), ("gin", "gin-config")]:
    try:
        importlib.import_module(module)
        found.append(f"{dist} {importlib.metadata.version(dist)}")
    except Exception as e:  # noqa: BLE001
        found.append(f"{dist}: {type(e).__name__}")
print("imported:", ", ".join(found))
print("devices:", jax.devices(), jax.devices()[0].device_kind)
from t5lite.tools import gpu_target
spec = gpu_target.local_target_config()
if spec:
    with open(f"{os.environ['work']}/gpu/target_config.txtpb", "w") as f:
        f.write(spec)
print("target config:", "saved to gpu/target_config.txtpb" if spec else "none (not a GPU)")
# t5lite draws random bits with jax's threefry GPU kernel (partitioning.py): the same
# bits as the hash XLA unrolls, checked here on this device
import numpy as np
from jax._src import config
draws = []
for kernel in (False, True):
    with config.threefry_gpu_kernel_lowering(kernel):
        draws.append(np.asarray(jax.jit(lambda k: jax.random.normal(k, (4096,)))(
            jax.random.PRNGKey(7))))
print("threefry kernel bits:", "equal" if np.array_equal(*draws) else "DIFFER")
PY
  python3 -c "import transformer_engine.jax as t, importlib.metadata as m; print('transformer_engine: imports,', m.version('transformer_engine'))" 2>/dev/null \
    || echo "transformer_engine: does not import ($(python3 -c 'import transformer_engine.jax' 2>&1 | tail -1 | cut -c1-120))"
  echo "XLA_FLAGS=$XLA_FLAGS"
  nvidia-smi 2>/dev/null | head -15
}

proof() {  # the switch check beside the training runs; it ends 15 s before the phase
  local switch_s=$(( PHASE_LIMIT - 15 ))
  [ "$switch_s" -gt "${SWITCH_S:-$switch_s}" ] && switch_s=$SWITCH_S
  SWITCH_PARALLEL=1 SWITCH_TIMEOUT_S=$switch_s VARIANTS=${VARIANTS:-float32,cudnn,cudnn_lengths,fp8,fused_qkv} \
    PACKED_MODEL=${PACKED_MODEL-configs/models/gpt/126m.gin} \
    PACKED_VARIANTS=${PACKED_VARIANTS:-float32,cudnn_lengths} \
    bash scripts_gpu/gpu_proof.sh "$work/proof" "$small" "${PROOF_BATCH:-32}" \
    "${PROOF_STEPS:-20}" "$inputs" "$targets"
}

autotune_to() {  # the XLA flag that dumps this process's autotune results to gpu/NAME
  echo "--xla_gpu_dump_autotune_results_to=$work/gpu/autotune_$1.textproto"
}

grid_part() {  # OUT PATTERN...: the grid's runs matching a pattern, within PHASE_LIMIT
  local dest=$1 only=() pattern; shift
  for pattern in "$@"; do only+=("--only=$pattern"); done
  XLA_FLAGS="$XLA_FLAGS $(autotune_to "$dest")" python3 -m t5lite.bench --grid="$grid" --out_dir="$work/$dest" "${only[@]}" \
    --time_budget_s=$(( PHASE_LIMIT - 10 ))
}

grid_tail() {  # the grid's runs that grid_head did not measure
  local list names
  list=$(python3 -c "
import fnmatch, os, sys
from t5lite.tools import bench_grid
head = os.environ['head_patterns'].split()
for r in bench_grid.load_grid(sys.argv[1]).runs:
    if not any(fnmatch.fnmatchcase(r.name, p) for p in head):
        print(r.name)" "$grid") || return 2
  [ -n "$list" ] || { echo "no runs left"; return 0; }
  mapfile -t names <<< "$list"
  grid_part grid_tail "${names[@]}"
}

profile() {
  mkdir -p "$work/profile"
  XLA_FLAGS="$XLA_FLAGS $(autotune_to profile)" python3 -m t5lite.tools.profile_summary --gin_file="$large" --gin.BATCH_SIZE="$large_batch" \
    "$lengths" --gin.NUM_MICROBATCHES=1 --gin.FP8=False \
    --out="$work/profile/profile.txt" --json_out="$work/profile/profile.json"
}

init_ab() {  # the initializer's compile, threefry's GPU kernel lowering off, then on
  local ab_cache=$work/ab_cache rc=0 flag
  mkdir -p "$work/init_ab"
  for flag in off on; do  # each on the cache without the initializers: both compile theirs
    rm -rf "$ab_cache"; cp -a "$cache" "$ab_cache" && rm -f "$ab_cache"/jit_init-*
    JAX_COMPILATION_CACHE_DIR=$ab_cache T5LITE_COMPILATION_CACHE_DIR=$ab_cache \
    JAX_THREEFRY_GPU_KERNEL_LOWERING=$([ $flag = on ] && echo 1 || echo 0) \
      python3 -m t5lite.bench --startup_only --gin_file="$large" \
      --gin.BATCH_SIZE="$large_batch" "$lengths" --gin.NUM_MICROBATCHES=1 --gin.FP8=False \
      --json_out="$work/init_ab/$flag.json" || rc=$?
  done
  rm -rf "$ab_cache"
  return $rc
}

# the phases run in `timeout`'s child shells
export -f versions proof grid_part grid_tail profile init_ab autotune_to
export work cache grid small large large_batch inputs targets lengths head_patterns
read -ra head_list <<< "$head_patterns"  # (split, never globbed)
proof_s=${PROOF_S:-150}; profile_s=${PROFILE_S:-60}; head_min=${HEAD_MIN_S:-150}
refresh
for name in ${PHASES:-versions proof grid_head profile init_ab grid_tail}; do
  case $name in
    versions) phase versions 45 0 10 versions ;;
    proof) phase proof "$proof_s" $(( head_min + profile_s )) 30 proof ;;
    grid_head) phase grid_head "${HEAD_S:-240}" "$profile_s" 30 grid_part grid_head "${head_list[@]}" ;;
    profile) phase profile "$profile_s" 0 20 profile ;;
    init_ab) phase init_ab "${AB_S:-150}" 0 "${AB_MIN_S:-60}" init_ab ;;
    grid_tail) phase grid_tail "$deadline" 0 30 grid_tail ;;
    *) echo "error: unknown phase '$name' in PHASES" >&2; status=2 ;;
  esac
done
refresh
echo "== done after $(( $(date +%s) - t0 )) s; OUT_DIR $out:"; ls -la "$out"
cat "$out/summary.txt"
exit $status
