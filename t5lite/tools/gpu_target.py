"""Compile for an NVIDIA GPU on a machine that has none (JAX's deviceless ahead-of-time
compile): compile-only devices described by XLA's GPU target config, and the compiler
options the GPU launchers use.

    devices = gpu_devices("h200")            # compile-only; build the mesh over them
    compiled = lowered.compile(compiler_options(autotune_file))

Needs the `gpu-aot` extra (`pip install -e ".[gpu-aot]"`: jax's CUDA plugin and PJRT of
jax's own version, ptxas and libdevice from NVIDIA's wheels, cuDNN for the fused
attention's trace). The plugin embeds XLA's target configs for the H100 (SXM) and H200;
a GPU session saves its own GPU's (`scripts_gpu/gpu_session.sh`), and a path to such a
file works as a GPU name too. What a CPU-side compile cannot do: autotune. Without the
GPU's autotune results every GEMM gets XLA's default choice; `compiler_options` loads a
file a GPU session dumped (same jaxlib), so the compile picks the GPU's kernels.
"""
from __future__ import annotations

import functools
import os
import pathlib
import re
from typing import Any, Dict, List, Optional

from t5lite.errors import ConfigError
from t5lite.runtime import metrics

GPUS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200 141GB HBM3e"}
"""The GPU names `--gpu` takes, and the device description of the target config the
CUDA plugin embeds for each."""

LAUNCHER_OPTIONS: Dict[str, Any] = {
    "xla_gpu_enable_latency_hiding_scheduler": True,
    "xla_gpu_enable_triton_gemm": False,
    "xla_gpu_dot_merger_threshold_mb": 0,
}
"""The compiler flags of `scripts_gpu/xla_flags.sh` that change a one-GPU program (its
collective thresholds change none): a CPU-side compile makes the program the GPU runs
(tests/test_gpu_compile.py holds the two together)."""

ENV_FLAGS = ("--xla_gpu_unsupported_use_all_reduce_one_shot_kernel=false",)
"""Flags of `scripts_gpu/xla_flags.sh` XLA reads only from the process's XLA_FLAGS (given
as compile options they change nothing): XLA's one-shot Triton all-reduce failed to
compile (an LLVM "size mismatch") for an int32 scalar all-reduce of GLaM 64B's step on
512 GPUs. `use_cpu_platform` adds them before jax starts."""

DEVICELESS_OPTIONS: Dict[str, Any] = {
    "xla_gpu_enable_cub_radix_sort": False,
}
"""Flags a compile without a GPU needs: XLA sizes CUB's radix sort (the dropless MoE
routing's sort of token choices by expert) by asking the CUDA runtime, which fails with
`cudaErrorInvalidDevice` when there is no GPU (every `xla_gpu_deviceless_cub_mode` tried
too); XLA's own sort kernel compiles instead. A real GPU keeps CUB."""

EXTRA = 'pip install -e ".[gpu-aot]"'


def _plugin_library() -> pathlib.Path:
    try:
        import jax_plugins.xla_cuda13 as plugin
    except ImportError:
        raise ConfigError(f"compiling for a GPU here needs jax's CUDA plugin: {EXTRA} "
                          f"(jax-cuda13-plugin of jax's own version)") from None
    library = pathlib.Path(plugin.__file__).parent / "xla_cuda_plugin.so"
    if not library.exists():
        raise ConfigError(f"jax's CUDA plugin has no {library.name}: reinstall it ({EXTRA})")
    return library


@functools.lru_cache(maxsize=None)
def target_config(gpu: str) -> str:
    """XLA's GpuTargetConfigProto text for `gpu`: a name in GPUS (read from the CUDA
    plugin, which embeds XLA's specs) or the path of a .txtpb file."""
    if gpu not in GPUS:
        path = pathlib.Path(gpu)
        if not path.is_file():
            raise ConfigError(f"--gpu={gpu!r}: give one of {', '.join(sorted(GPUS))} or the "
                              f"path of a GPU target config file (.txtpb)")
        return path.read_text()
    data = _plugin_library().read_bytes()
    marker = f'device_description_str: "{GPUS[gpu]}"'.encode()
    at = data.find(marker)
    start = data.rfind(b"gpu_device_info {", 0, at) if at >= 0 else -1
    if start < 0:
        raise ConfigError(f"jax's CUDA plugin embeds no target config for {GPUS[gpu]}; "
                          f"give a target config file as --gpu")
    return data[start:data.index(b"\n", at) + 1].decode()


def device_facts(spec: str) -> Dict[str, Any]:
    """The target config's device name, memory bandwidth (bytes/s), memory (bytes), SM
    count, and the device's dense bf16 and FP8 peaks (FLOP/s; metrics' tables)."""
    def number(key: str) -> float:
        found = re.search(rf"\b{key}: ([\d.e+]+)", spec)
        return float(found.group(1)) if found else 0.0
    name = re.search(r'device_description_str: "([^"]*)"', spec)
    name = re.search(r'\bname: "([^"]*)"', spec) if name is None else name
    kind = name.group(1) if name else "?"
    bf16 = (metrics.peak_bf16_tflops(kind) or 989.4) * 1e12
    return {"device_kind": kind,
            "memory_bandwidth": number("memory_bandwidth"),
            "device_memory_size": int(number("device_memory_size")),
            "core_count": int(number("core_count")), "peak_flops": bf16,
            "peak_fp8_flops": (metrics.peak_fp8_tflops(kind) or 2 * bf16 / 1e12) * 1e12}


def local_target_config() -> Optional[str]:
    """The target config of the GPU this process runs on (what a GPU session saves for
    later CPU-side compiles), or None where jax's devices are not GPUs."""
    import jax
    devices = jax.devices()
    if devices[0].platform not in ("gpu", "cuda"):
        return None
    try:  # a private API: a jax without it loses the prediction, never the benchmark
        from jax._src.lib import xla_client
        return str(xla_client.get_topology_for_devices(devices).target_config)
    except Exception:  # noqa: BLE001
        return None


def gpu_devices(gpu: str, count: int = 1, hosts: int = 1) -> List[Any]:
    """`count` compile-only devices of `gpu` on each of `hosts` hosts (a cluster: device
    i's process_index is its host). JAX must run on the CPU (JAX_PLATFORMS=cpu, which
    `use_cpu_platform` sets before jax starts)."""
    spec = target_config(gpu)
    _plugin_library()
    from jax.experimental import topologies
    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=spec,
                                                topology=f"1x{hosts}x{count}")
    except Exception as e:  # noqa: BLE001 - the plugin's errors have no common type
        raise ConfigError(f"jax could not make a compile-only {gpu} topology: "
                          f"{str(e).splitlines()[0]} (is jax-cuda13-plugin jax's own "
                          f"version? {EXTRA})") from None
    return list(topology.devices)


def use_cpu_platform() -> None:
    """Run jax on the CPU, whatever GPUs this machine has (call before jax starts its
    backends: the compile-only devices need no GPU, and a GPU's would be made too), with
    `ENV_FLAGS` in XLA_FLAGS."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    given = os.environ.get("XLA_FLAGS", "")
    extra = [f for f in ENV_FLAGS if f.split("=")[0] + "=" not in given]
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([given, *extra]).strip()
    import jax
    try:
        jax.config.update("jax_platforms", "cpu")
    except RuntimeError:
        pass  # jax already started; its platforms stay
    # a compile-only program cannot be loaded back from JAX's persistent cache (each
    # read is a warning): compile without it
    jax.config.update("jax_enable_compilation_cache", False)


def available() -> bool:
    """Whether the gpu-aot extra's CUDA plugin is installed."""
    try:
        _plugin_library()
        return True
    except ConfigError:
        return False


def is_compile_only_gpu(device) -> bool:
    """Whether `device` is one of `gpu_devices`'s: a GPU while jax itself runs on the CPU
    (its programs get `compiler_options`; a real GPU's get the launchers' XLA_FLAGS)."""
    import jax
    return getattr(device, "platform", "") in ("gpu", "cuda") and \
        jax.default_backend() not in ("gpu", "cuda")


def compiler_options(autotune_file: Optional[str] = None) -> Dict[str, Any]:
    """The launchers' flags and `DEVICELESS_OPTIONS` (but those XLA_FLAGS sets: the
    environment's win, as on a GPU, where the launchers put theirs in XLA_FLAGS), and the
    GPU's autotune results to load, when given."""
    given = set(re.findall(r"--(\w+)=", os.environ.get("XLA_FLAGS", "")))
    options = {k: v for k, v in {**LAUNCHER_OPTIONS, **DEVICELESS_OPTIONS}.items()
               if k not in given}
    if autotune_file:
        if not pathlib.Path(autotune_file).is_file():
            raise ConfigError(f"--autotune_results={autotune_file!r}: no such file (a GPU "
                              f"session's autotune.textproto)")
        options["xla_gpu_load_autotune_results_from"] = str(autotune_file)
    return options
