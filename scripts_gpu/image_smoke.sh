#!/usr/bin/env bash
# The GPU tools under the GPU image's Python packages, on a CPU, before any GPU time is
# spent: a Python 3.12 environment with the image's versions and without what the image
# lacks (TensorFlow, SeqIO, t5, clu), then xla_flags.sh's flags and a whole GPU session
# (gpu_session.sh: versions, switch check and train / checkpoint / resume proof, grid,
# step profile, init A/B) on the tiny T5 and the CPU grid (grids/cpu_smoke.json), exactly
# as a GPU session runs them, and a check of what it leaves (at most 8 files, no folders;
# the summary's versions, verdicts, grid rows, A/B and 25-row op table).
#
#   scripts_gpu/image_smoke.sh OUT_DIR [PYTHON]
#
# PYTHON (default python3.12) makes the environment in OUT_DIR/env. The versions are
# those the image shipped when last read (IMAGE_PACKAGES below; override the variable to
# test others). Exit status: non-zero when a step fails; OUT_DIR/summary.txt says which.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [PYTHON]" >&2
  exit 2
fi
out=$(realpath -m "$1"); python=${2:-python3.12}
cd "$(dirname "$0")/.."
IMAGE_PACKAGES=${IMAGE_PACKAGES:-"jax==0.11.2 jaxlib==0.11.2 numpy==2.5.2 flax optax orbax-checkpoint chex sentencepiece tensorstore etils absl-py rich tqdm tensorboard safetensors gin-config==0.5.0"}
mkdir -p "$out"
if [ ! -x "$out/env/bin/python3" ]; then
  "$python" -m venv "$out/env"
  # shellcheck disable=SC2086
  "$out/env/bin/python3" -m pip install -q $IMAGE_PACKAGES
fi
export PATH="$out/env/bin:$PATH"
python3 -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|flax|optax|orbax-checkpoint|numpy|chex|gin-config) " \
  | tee "$out/versions.txt"
export JAX_PLATFORMS=cpu
status=0
step() {  # NAME COMMAND...
  local name=$1; shift
  if "$@" > "$out/$name.log" 2>&1; then echo "ok    $name"; else echo "FAIL  $name (see $out/$name.log)"; status=1; fi
}
{
  # nothing the image lacks may be imported by the GPU path
  step no_tensorflow python3 -c "
import importlib.util, sys
missing = [m for m in ('tensorflow', 'seqio', 't5', 'clu') if importlib.util.find_spec(m)]
sys.exit(f'the image lacks these, but this environment has them: {missing}' if missing else 0)"
  # every flag xla_flags.sh sets exists in the image's jax (an unknown one aborts at start)
  step xla_flags bash -c 'source scripts_gpu/xla_flags.sh && python3 -c "import jax; jax.devices()"'
  # the session on the tiny T5; every compile cached (on a CPU most take under 1 s)
  step gpu_session env GRID=scripts_gpu/grids/cpu_smoke.json GRID_HEAD=t5_tiny_bf16 \
    SMALL_MODEL=configs/models/t5_1_1/tiny.gin PROOF_BATCH=8 PROOF_STEPS=20 \
    VARIANTS=float32,dot_product,fused_qkv,transpose_bs,scan_layers \
    PACKED_MODEL=configs/models/gpt/tiny.gin PACKED_VARIANTS=float32,dot_product PACKED_LENGTH=32 \
    LARGE_RECIPE=configs/tiny_pile_pretrain.gin LARGE_BATCH=8 INPUTS=64 TARGETS=16 \
    WORK_DIR="$out/session_work" CACHE_DIR="$out/session_cache" \
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
    bash scripts_gpu/gpu_session.sh "$out/session"
  step session_outputs python3 - "$out/session" <<'PY'
import importlib.metadata, os, re, sys, tarfile
out = sys.argv[1]
names = sorted(os.listdir(out))
assert len(names) <= 8 and all(os.path.isfile(os.path.join(out, n)) for n in names), names
text = open(os.path.join(out, "summary.txt")).read()
print(text)
phases = re.search(r"^phases: (.*)$", text, re.M).group(1)
assert all(p.split()[1] == "ok," for p in phases.split("; ")), phases
assert len(phases.split("; ")) == 6, phases
jax = importlib.metadata.version("jax")  # the image's, as installed above
assert f"versions: jax {jax}, jaxlib {jax}" in text, jax
assert "resume: the resumed run's loss at step 20 equals" in text
assert re.search(r"^switches .*scan_layers [0-9.e+-]+ ok$", text, re.M)
assert re.search(r"^packed switches .*dot_product [0-9.e+-]+ ok$", text, re.M)
grid = re.findall(r"^(t5_tiny_bf16|t5_tiny_bf16\+fused_qkv|llama_tiny) +\d+ +ok ", text, re.M)
assert len(grid) == 5, grid
assert re.search(r"^init A/B.*\n  off: init compile .*\n  on: init compile ", text, re.M)
rows = re.findall(r"^ ?(\d+)  \S+ ", text, re.M)  # the profile's op table
assert [int(r) for r in rows] == list(range(1, 26)), rows
with tarfile.open(os.path.join(out, "session.tar.gz")) as tar:
    members = tar.getnames()
assert sum(m.endswith("_b1.json") or m.endswith("_b2.json") for m in members) == 5, members
print("ok:", len(names), "files:", ", ".join(names))
PY
} | tee "$out/summary.txt"
grep -q "^FAIL" "$out/summary.txt" && exit 1
exit 0
