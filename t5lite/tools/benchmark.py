"""Timing the train step: compile, initialize, warm up, time steps one by one, then steps
dispatched ahead, and report the median step time, seq/s, target tokens/s, model TFLOP/s
per device, MFU, the compiled step's memory per device (`tools.step_memory`) and the
measured peak. The library behind `python -m t5lite.bench`. Needs only jax, flax, optax
and orbax (no TensorFlow: run it on the synthetic task).

The step is compiled once, ahead of time, for the first batch; the timed steps call that
executable, so the compile time is reported apart from the first step's. Two step times:

    median_step_s   each step waited for before the next is dispatched (no overlap of
                    one step's host work with the last one's device work): seq/s, MFU
    async_step_s    steps dispatched back to back, as the training loop runs them, with
                    one wait at the end of each window of `steps` steps (timed from the end
                    of a step with the next one queued): the median of `async_windows`
                    windows' time per step
    init_s          the state initializer (`step_fns.init`): compile + run, beside the
                    step's `compile_s`: together what a new run waits before its first step

    run = build_run(...)                            # t5lite.runtime.run
    result = bench(run, steps=20, warmup=2)
    print(format_table(result))
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import jax

from t5lite.runtime import metrics
from t5lite.runtime.run import TrainingRun
from t5lite.tools import gpu_target, step_memory, step_time
from t5lite.tools.hlo import gpu_program


def _device_stat(key: str) -> List[int]:
    """`key` of every local device's memory stats that reports it (none on CPU)."""
    values = []
    for d in jax.local_devices():
        try:
            stats = d.memory_stats() or {}
        except Exception:  # noqa: BLE001 - CPU devices may not report
            stats = {}
        if key in stats:
            values.append(int(stats[key]))
    return values


def peak_memory_bytes() -> Optional[int]:
    """The largest peak of bytes in use over the local devices (None where unreported)."""
    return max(_device_stat("peak_bytes_in_use"), default=None)


class StepDoesNotFit(RuntimeError):
    """The compiled step needs more memory per device than the device can give."""


def device_memory_limit() -> Optional[int]:
    """The bytes a local device lets XLA allocate (None where unreported, e.g. CPU)."""
    return min(_device_stat("bytes_limit"), default=None)


def bench(run: TrainingRun, steps: int, warmup: int, fp8: bool = False,
          memory_limit_bytes: Optional[int] = None, async_windows: int = 2) -> Dict[str, Any]:
    """Compile, initialize, warm up and time `steps` train steps of `run` one by one, then
    `async_windows` windows of `steps` steps dispatched ahead (module docstring).

    The step is compiled before any state exists; when its compiled memory per device
    exceeds `memory_limit_bytes` (default: what the device reports) it is not run and
    StepDoesNotFit says so, instead of an out-of-memory error halfway through a step.
    """
    batch = run.next_batch()
    t0 = time.perf_counter()
    step = step_memory.compile_train_step(run, batch)
    compile_s = time.perf_counter() - t0
    memory = step_memory.compiled_memory(step)
    limit = device_memory_limit() if memory_limit_bytes is None else memory_limit_bytes
    if memory is not None and limit is not None and memory.peak_bytes > limit:
        raise StepDoesNotFit(f"the compiled step needs {memory.peak_bytes / 2**30:.2f} GiB "
                             f"per device, more than the {limit / 2**30:.2f} GiB available")
    t0 = time.perf_counter()
    state = run.step_fns.init(jax.random.PRNGKey(0))
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    first_step_s = time.perf_counter() - t0
    for _ in range(warmup):
        state, m = step(state, run.next_batch())
    jax.block_until_ready((state, m))
    durations: List[float] = []
    for _ in range(steps):
        batch = run.next_batch()
        jax.block_until_ready(batch)
        t = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        durations.append(time.perf_counter() - t)
    windows: List[float] = []
    for _ in range(async_windows):
        # the clock starts when a step ends with the next one already queued behind it,
        # and stops when the window's last step ends: `steps` steps ran in between, with
        # no pipeline fill or drain counted
        state, before = step(state, run.next_batch())
        state, m = step(state, run.next_batch())
        jax.block_until_ready(before)
        t = time.perf_counter()
        for _ in range(steps - 1):
            state, m = step(state, run.next_batch())
        jax.block_until_ready((state, m))
        windows.append((time.perf_counter() - t) / steps)
    median = statistics.median(durations)
    predicted = predicted_step_s(step)
    result = metrics.throughput(median, run.batch_size, run.target_tokens,
                                run.flops_per_example, jax.device_count(),
                                jax.devices()[0].device_kind, fp8=fp8)
    result.update(median_step_s=median, compile_s=compile_s, first_step_s=first_step_s,
                  compile_and_first_step_s=compile_s + first_step_s, init_s=init_s,
                  async_step_s=statistics.median(windows) if windows else None,
                  async_window_step_s=windows, predicted_step_s=predicted,
                  step_durations_s=durations, peak_memory_bytes=peak_memory_bytes(),
                  compiled_memory=None if memory is None else memory.as_dict(),
                  final_loss=float(m["loss"]))
    del state, m
    return result


def predicted_step_s(compiled) -> Optional[float]:
    """The step-time predictor's time (`tools.step_time`) for this very program, as the
    GPU compiled and autotuned it; None off a GPU."""
    spec = gpu_target.local_target_config()
    if spec is None:
        return None
    try:
        kernels = gpu_program.program_kernels(compiled.as_text())
        return step_time.predict(kernels, gpu_target.device_facts(spec))
    except Exception as e:  # noqa: BLE001 - a prediction never costs the measurement
        print(f"warning: no predicted step time: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def startup(run: TrainingRun) -> Dict[str, Any]:
    """What a new run waits for before its first step, phase by phase, without running a
    step: lowering and compiling the train step, then lowering, compiling and running the
    state initializer (`init_s` is the last three together, as `bench` reports it)."""
    batch = run.next_batch()
    t0 = time.perf_counter()
    lowered = run.step_fns.train_step.lower(step_memory.abstract_state(run), dict(batch))
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    rng = jax.random.PRNGKey(0)
    init_lowered = run.step_fns.init.lower(rng)
    t3 = time.perf_counter()
    init = init_lowered.compile()
    t4 = time.perf_counter()
    state = init(rng)
    jax.block_until_ready(state)
    t5 = time.perf_counter()
    del state
    return dict(step_lower_s=t1 - t0, step_compile_s=t2 - t1, compile_s=t2 - t0,
                init_lower_s=t3 - t2, init_compile_s=t4 - t3,
                init_run_s=t5 - t4, init_s=t5 - t2,
                init_program_lines=init_lowered.as_text().count("\n"))


def format_table(result: Dict[str, Any]) -> str:
    """The result as an aligned two-column table."""
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    mem = result.get("peak_memory_bytes")
    planned = (result.get("compiled_memory") or {}).get("peak_bytes")
    rows = [
        ("device", f"{result['device_count']} x {result['device_kind']}"),
        ("median step", f"{result['median_step_s'] * 1000:.1f} ms "
                        f"({len(result['step_durations_s'])} timed steps)"),
        ("seq/s", fmt(result["seq_per_s"], ".1f")),
        ("target tokens/s", fmt(result["target_tokens_per_s"], ".0f")),
        ("TFLOP/s per device", fmt(result["tflops_per_device"], ".2f")),
        ("MFU (bf16 peak)", "-" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"),
        ("peak memory (measured)", "-" if mem is None else f"{mem / 2**30:.2f} GiB"),
        ("step memory (compiled)", "-" if planned is None else f"{planned / 2**30:.2f} GiB"),
        ("step dispatched ahead", "-" if result.get("async_step_s") is None
         else f"{result['async_step_s'] * 1000:.1f} ms "
              f"({len(result['async_window_step_s'])} windows)"),
        ("compile", f"{result['compile_s']:.1f} s"),
        ("init (compile + run)", "-" if result.get("init_s") is None
         else f"{result['init_s']:.1f} s"),
    ]
    if result.get("build_s") is not None:
        rows.insert(-2, ("build", f"{result['build_s']:.1f} s"))
    if result.get("mfu_fp8") is not None:
        rows.insert(6, ("MFU (fp8 peak)", f"{100 * result['mfu_fp8']:.1f}%"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


STARTUP_ROWS = (("build", "build_s"), ("lower the step", "step_lower_s"),
                ("compile the step", "step_compile_s"), ("lower the init", "init_lower_s"),
                ("compile the init", "init_compile_s"), ("run the init", "init_run_s"),
                ("init (compile + run)", "init_s"))


def format_startup(result: Dict[str, Any]) -> str:
    """A `startup` result as an aligned table of seconds."""
    rows = [(name, f"{result[key]:.1f} s") for name, key in STARTUP_ROWS if key in result]
    rows.append(("init / step compile", f"{result['init_s'] / result['compile_s']:.0%}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
