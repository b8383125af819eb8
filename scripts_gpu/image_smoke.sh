#!/usr/bin/env bash
# The GPU tools under the GPU image's Python packages, on a CPU, before any GPU time is
# spent: a Python 3.12 environment with the image's versions and without what the image
# lacks (TensorFlow, SeqIO, t5, clu), then xla_flags.sh's flags, the benchmark grid, the
# switch check and the train / checkpoint / resume proof on the tiny T5, exactly as
# bench_grid.sh and gpu_proof.sh run them on the GPU.
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
  step bench_grid bash scripts_gpu/bench_grid.sh scripts_gpu/grids/cpu_smoke.json "$out/grid"
  step gpu_proof env VARIANTS=float32,dot_product,fused_qkv,transpose_bs,scan_layers \
    bash scripts_gpu/gpu_proof.sh "$out/proof" configs/models/t5_1_1/tiny.gin 8 20 64 16
} | tee "$out/summary.txt"
grep -q "^FAIL" "$out/summary.txt" && exit 1
exit 0
