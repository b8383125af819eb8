"""jax's CUDA plugin (the `gpu-aot` extra) on a machine without an NVIDIA GPU: commands
print no traceback for it (t5lite/__init__.py turns jax's record into one DEBUG line),
and beside a GPU jax's record is left as it is."""
import glob
import logging
import subprocess
import sys

import pytest

import t5lite
import train_helpers as th
from t5lite.tools import gpu_target


@pytest.mark.skipif(not gpu_target.available(), reason="needs the gpu-aot extra's plugin")
@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_a_command_prints_no_plugin_traceback_on_a_machine_without_a_gpu():
    """JAX_PLATFORMS unset (tests/conftest.py sets it for every other test), as a user
    runs: the plugin is found, fails to start, and the command says nothing of it."""
    env = th.env(devices=1)
    env.pop("JAX_PLATFORMS")
    code = ("import t5lite, jax, sys; "
            "print([d.platform for d in jax.devices()]); sys.exit(0)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "['cpu']", th.describe(proc)
    assert proc.stderr == "", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "t5lite.info",
                           "--gin_file=configs/models/t5_1_1/tiny.gin"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=th.REPO)
    assert proc.returncode == 0 and "parameters" in proc.stdout, th.describe(proc)
    assert "Traceback" not in proc.stderr and "plugin" not in proc.stderr, proc.stderr
    # without t5lite's filter the same interpreter prints jax's traceback: the test sees it
    code = "import jax; jax.devices()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert "Jax plugin configuration error" in proc.stderr and "Traceback" in proc.stderr


def _record(message_args):
    try:
        raise RuntimeError("operation cuInit(0) failed: Unknown CUDA error 303")
    except RuntimeError:
        return logging.LogRecord("jax._src.xla_bridge", logging.ERROR, __file__, 1,
                                 "Jax plugin configuration error: Exception when calling "
                                 "%s.initialize()", message_args, sys.exc_info())


def test_the_filter_drops_only_the_plugin_record_and_only_without_a_gpu(monkeypatch, caplog):
    quiet = t5lite._NoGpuPluginError()
    monkeypatch.setattr(t5lite._glob, "glob", lambda pattern: [])
    with caplog.at_level(logging.DEBUG, logger="t5lite"):
        assert quiet.filter(_record(("jax_plugins.xla_cuda13",))) is False
    assert any("did not start (no NVIDIA GPU on this machine): operation cuInit(0)" in r.message
               for r in caplog.records)
    other = logging.LogRecord("jax._src.xla_bridge", logging.WARNING, __file__, 1,
                              "Unable to initialize backend 'tpu'", (), None)
    assert quiet.filter(other) is True
    monkeypatch.setattr(t5lite._glob, "glob", lambda pattern: ["/dev/nvidia0"])  # a GPU here
    assert quiet.filter(_record(("jax_plugins.xla_cuda13",))) is True
