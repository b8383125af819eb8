"""Test-wide environment: CPU only, 8 fake host devices for sharding tests.

Set before anything imports jax; subprocesses inherit it. x64 stays off.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# PyPI's torch for Python 3.12 (the `test` extra's, for the Hugging Face parity tests) is
# the CUDA build, which brings triton. Loading triton's native library after TensorFlow's
# crashes the process (TF 2.21 / triton 3.7: a segfault in triton's import, reached from
# transformers through torch._dynamo); loaded first, both work. So load it first.
try:
    import triton  # noqa: F401,E402
except ImportError:
    pass
