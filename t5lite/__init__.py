"""t5lite: T5X-style training of T5 v1.1, GPT and LLaMA models in JAX/Flax (the map of the
package: docs/architecture.md).

Importing it quiets one message of jax's: with jax's CUDA plugin installed (the `gpu-aot`
extra, for `info --gpu`) on a machine without an NVIDIA GPU, jax logs the plugin's failed
start as an ERROR with a traceback, then runs on the CPU. Where no GPU device exists that
record becomes one DEBUG line of t5lite's; where one does, jax's record is left as it is
(a plugin that fails beside a GPU is a real problem)."""
import glob as _glob
import logging as _logging

_PLUGIN_ERROR = "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda"


class _NoGpuPluginError(_logging.Filter):
    """Drops jax's record of a CUDA plugin that failed to start when this machine has no
    NVIDIA device (/dev/nvidia0 ...), saying so in one DEBUG line instead."""

    def filter(self, record: _logging.LogRecord) -> bool:
        if not record.getMessage().startswith(_PLUGIN_ERROR) or _glob.glob("/dev/nvidia[0-9]*"):
            return True
        why = record.exc_info[1] if record.exc_info else None
        _logging.getLogger(__name__).debug(
            "jax's CUDA plugin did not start (no NVIDIA GPU on this machine): %s; "
            "running on the CPU", str(why).splitlines()[0] if why else "no reason given")
        return False


_logging.getLogger("jax._src.xla_bridge").addFilter(_NoGpuPluginError())
