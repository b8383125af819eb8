"""Per-device memory of the compiled train step, read from XLA's own buffer assignment
(`jax.jit(...).lower(...).compile().memory_analysis()`), without allocating anything.

    compiled = compile_train_step(run, abstract_batch(run))  # nothing on the devices yet
    mem = compiled_memory(compiled)                          # StepMemory, bytes per device
    print(verdict(mem.peak_bytes, 80 * 2**30))

The train step donates its state, so the state's buffers are both argument and output
(`alias`); one device holds at most arguments + outputs - aliased + temporaries (the
activations kept for the backward pass, gradients, optimizer scratch) + the program. The
number is exact for the backend that compiled it. On simulated CPU devices it estimates
a GPU's: the shardings and the saved activations are the same, but the GPU compiler
fuses and schedules differently (and may run attention as one cuDNN kernel), so compare
with a measured peak before trusting the last GiB (`docs/performance.md` states the
measured error). One known gap, measured: the CPU compiler credits a remat policy only
when the layers are scanned (SCAN_LAYERS=True); for an unrolled stack it schedules the
recomputation early and reports the memory of no remat, so there the estimate is an
upper bound.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Dict, Mapping, Optional

import jax
import numpy as np

from t5lite.data import edge
from t5lite.errors import ConfigError
from t5lite.runtime.run import TrainingRun
from t5lite.tools import gpu_target

GiB = 2 ** 30
HEADROOM = 0.9
"""Fraction of device memory a step may plan on: the rest goes to the runtime (CUDA
context, cuBLAS / cuDNN workspaces) and to fragmentation. The GPU launchers give XLA
the same fraction (`XLA_PYTHON_CLIENT_MEM_FRACTION=0.9`)."""

PACKED_FEATURES = ("segment_ids", "positions")


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes per device of one compiled program."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs not aliased to an argument + temporaries + the program."""
        return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
                + self.code_bytes)

    def as_dict(self) -> Dict[str, int]:
        return {**dataclasses.asdict(self), "peak_bytes": self.peak_bytes}


def batch_specs(model, task_feature_lengths: Mapping[str, int], batch_size: int,
                pack: bool = False) -> Dict[str, tuple]:
    """{feature: (shape, dtype)} of a global batch as the model's family reads it (packed
    batches carry segment ids and positions per sequence)."""
    lengths = model.feature_lengths(task_feature_lengths)
    task = edge.SyntheticTask(lengths, model.config.vocab_size,
                                   model.FEATURE_CONVERTER_KIND, seed=0)
    specs = task.feature_specs(batch_size)
    if pack:
        for prefix, tokens in (("encoder", "encoder_input_tokens"),
                               ("decoder", "decoder_target_tokens")):
            if tokens in specs:
                for what in PACKED_FEATURES:
                    specs[f"{prefix}_{what}"] = (specs[tokens][0], np.dtype(np.int32))
    return specs


def abstract_batch(run: TrainingRun, task_feature_lengths: Mapping[str, int],
                   pack: bool = False) -> Dict[str, jax.ShapeDtypeStruct]:
    """The run's global batch as sharded ShapeDtypeStructs (nothing allocated)."""
    specs = batch_specs(run.model, task_feature_lengths, run.batch_size, pack)
    return {k: jax.ShapeDtypeStruct(shape, dtype,
                                    sharding=run.partitioner.batch_sharding(len(shape)))
            for k, (shape, dtype) in specs.items()}


def abstract_state(run: TrainingRun):
    """The run's train state as sharded ShapeDtypeStructs (nothing allocated)."""
    return jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        run.step_fns.abstract_state, run.step_fns.state_shardings)


def state_bytes_per_device(run: TrainingRun) -> Dict[str, Any]:
    """Bytes of the run's parameters (FP8 state included) and optimizer state that one
    device holds, read off the state's shardings, and whether SHARD_OPTIMIZER_OVER_DATA
    split the optimizer state over `data`."""
    def held(tree, shardings):
        return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
                   for a, s in zip(jax.tree_util.tree_leaves(tree),
                                   jax.tree_util.tree_leaves(shardings)))

    state, shardings = run.step_fns.abstract_state, run.step_fns.state_shardings
    return {"params_bytes_per_device": held((state.params, state.fp8),
                                            (shardings.params, shardings.fp8)),
            "optimizer_state_bytes_per_device": held(state.opt_state, shardings.opt_state),
            "shard_optimizer_over_data": run.partitioner.shard_optimizer_over_data}


def compile_train_step(run: TrainingRun, batch: Mapping[str, Any], state: Any = None,
                       options: Optional[Mapping[str, Any]] = None,
                       timings: Optional[Dict[str, float]] = None):
    """The run's train step compiled for `batch` (arrays or ShapeDtypeStructs) and `state`
    (default: the abstract state): a `jax.stages.Compiled`, callable as
    `compiled(state, batch)`. `options`: XLA's compiler options (default: the GPU
    launchers' flags on a compile-only GPU, `gpu_target.compiler_options`, else none).
    `timings`, a dict where given, gets the seconds spent lowering (`lower_s`) and
    compiling (`compile_s`)."""
    t0 = time.perf_counter()
    state = abstract_state(run) if state is None else state
    lowered = run.step_fns.train_step.lower(state, dict(batch))
    t1 = time.perf_counter()
    if options is None and gpu_target.is_compile_only_gpu(run.partitioner.mesh.devices.flat[0]):
        options = gpu_target.compiler_options()  # the GPU launchers' flags: the GPU's program
    compiled = lowered.compile(None if options is None else dict(options))
    if timings is not None:
        timings.update(lower_s=t1 - t0, compile_s=time.perf_counter() - t1)
    return compiled


def compiled_memory(compiled) -> Optional[StepMemory]:
    """The compiled program's per-device memory, or None where the backend reports none."""
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, AttributeError, RuntimeError):
        return None
    if stats is None:
        return None
    return StepMemory(argument_bytes=int(stats.argument_size_in_bytes),
                      output_bytes=int(stats.output_size_in_bytes),
                      alias_bytes=int(stats.alias_size_in_bytes),
                      temp_bytes=int(stats.temp_size_in_bytes),
                      code_bytes=int(stats.generated_code_size_in_bytes))


def verdict(peak_bytes: int, device_bytes: int, headroom: float = HEADROOM) -> str:
    """A plain answer: does a step of `peak_bytes` per device fit a device of
    `device_bytes`, planning on `headroom` of it?"""
    usable = headroom * device_bytes
    device = f"{device_bytes / GiB:.0f} GiB"
    if peak_bytes <= usable:
        return (f"fits in {device} ({peak_bytes / GiB:.1f} GiB of the {usable / GiB:.1f} GiB "
                f"usable, {100 * peak_bytes / usable:.0f}%)")
    return (f"does not fit in {device}: needs {peak_bytes / GiB:.1f} GiB of "
            f"{usable / GiB:.1f} GiB usable; use remat (REMAT_POLICY), more "
            f"NUM_MICROBATCHES, more fsdp shards, SHARD_OPTIMIZER_OVER_DATA=True (data "
            f"parallelism) or a smaller per-device batch")


def memory_report(mesh, batch_size: int, memory: Optional[StepMemory],
                  device_bytes: int, state_bytes: Optional[Mapping[str, int]] = None
                  ) -> Dict[str, Any]:
    """`info --memory`'s entry: `memory`, a compiled train step's (`compiled_memory`), on
    `mesh` for a global batch of `batch_size`, with the plain answer for a device of
    `device_bytes`; `state_bytes` (`state_bytes_per_device`) joins it."""
    if memory is None:
        raise ConfigError("this backend reports no memory analysis for compiled programs")
    device = mesh.devices.flat[0]
    return {"devices": mesh.size, "mesh": dict(mesh.shape), "batch_size": batch_size,
            "per_device_batch": batch_size / mesh.size, "platform": device.platform,
            "device_bytes": device_bytes,
            "device_kind": (device.device_kind if gpu_target.is_compile_only_gpu(device)
                            else None),
            **memory.as_dict(), **(state_bytes or {}),
            "verdict": verdict(memory.peak_bytes, device_bytes)}


def cpu_devices(count: int):
    """`count` CPU devices to compile for. Call before jax starts (first thing in a
    command): jax then makes that many; a process that already has enough uses them."""
    if count < 1:
        raise ConfigError(f"--devices must be >= 1, got {count}")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        pass  # jax already started: use the devices it has
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise ConfigError(f"{count} simulated devices asked, but jax already started with "
                          f"{len(devices)} CPU devices; run `python -m t5lite.info` afresh")
    return devices[:count]
