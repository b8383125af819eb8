"""Test-wide environment: CPU only, 8 fake host devices for sharding tests.

Set before anything imports jax; subprocesses inherit it. x64 stays off.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
