# XLA flags for GPU training, sourced by every launcher. The latency-hiding scheduler
# overlaps collectives with compute; Triton GEMMs are off (cuBLAS is faster for these
# shapes); XLA does not merge GEMMs that share an operand (q / k / v: merged, their outputs
# are sliced apart again for cuDNN's attention, 10 GB of copies a T5 large step at batch
# 32: docs/performance.md); small all-reduces go to NCCL, not XLA's one-shot Triton
# kernel (which failed to compile, an LLVM "size mismatch", for an int32 scalar
# all-reduce of GLaM 64B's step on 512 GPUs: docs/moe.md); collectives are combined up
# to the thresholds below. A collective whose peers
# never arrive (NCCL's rendezvous, e.g. the first step after one process died while
# compiling) ends the process after NCCL_TERMINATION_TIMEOUT_SECONDS (1200) instead of
# waiting forever; t5lite's own watchdog and peer checks cover the steps after it
# (docs/training.md, "When a multi-process run fails"). Every flag here exists in the
# jax we pin (tests/test_launchers.py starts jax with them: an unknown flag aborts).
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true
  --xla_gpu_enable_triton_gemm=false
  --xla_gpu_dot_merger_threshold_mb=0
  --xla_gpu_unsupported_use_all_reduce_one_shot_kernel=false
  --xla_gpu_all_reduce_combine_threshold_bytes=${ALL_REDUCE_COMBINE_BYTES:-134217728}
  --xla_gpu_all_gather_combine_threshold_bytes=${ALL_GATHER_COMBINE_BYTES:-134217728}
  --xla_gpu_reduce_scatter_combine_threshold_bytes=${REDUCE_SCATTER_COMBINE_BYTES:-134217728}
  --xla_gpu_nccl_termination_timeout_seconds=${NCCL_TERMINATION_TIMEOUT_SECONDS:-1200}"
export XLA_FLAGS="$(echo $XLA_FLAGS | tr '\n' ' ')"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
