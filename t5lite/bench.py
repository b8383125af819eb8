"""`python -m t5lite.bench`: time the train step of a gin-configured run.

    python -m t5lite.bench --gin_file=configs/models/t5_1_1/large.gin \
      --gin_file=configs/synthetic_pretrain.gin \
      --gin.TASK_FEATURE_LENGTHS="{'inputs': 512, 'targets': 128}" --gin.BATCH_SIZE=64 \
      --steps=20 --json_out=docs/perf/large_bf16.json

Compiles (timed), warms up, then times `--steps` steps one by one (each waits for its
result), and prints median step time, seq/s, target tokens/s, model TFLOP/s per device,
MFU and peak device memory. The JSON result holds the device, versions, the command, the
resolved gin config, every timed step and the memory, so a number quoted in the docs can
be traced to its run. Needs only jax, flax, optax, orbax and gin-config (no TensorFlow).
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax

from t5lite import gin_utils, metrics, partitioning, train



def _peak_memory() -> Optional[int]:
    peaks = []
    for d in jax.local_devices():
        try:
            stats = d.memory_stats() or {}
        except Exception:  # noqa: BLE001 - CPU devices may not report
            stats = {}
        if "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


def bench(run: train.Run, steps: int, warmup: int, fp8: bool = False) -> Dict[str, Any]:
    """Compile, warm up and time `steps` train steps of `run`."""
    state = run.fns.init(jax.random.PRNGKey(0))
    batch = run.next_batch()
    t0 = time.perf_counter()
    state, m = run.fns.train_step(state, batch)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        state, m = run.fns.train_step(state, run.next_batch())
    jax.block_until_ready((state, m))
    durations: List[float] = []
    for _ in range(steps):
        batch = run.next_batch()
        jax.block_until_ready(batch)
        t = time.perf_counter()
        state, m = run.fns.train_step(state, batch)
        jax.block_until_ready(m)
        durations.append(time.perf_counter() - t)
    median = statistics.median(durations)
    result = metrics.throughput(median, run.batch_size, run.target_tokens,
                                run.flops_per_example, jax.device_count(),
                                jax.devices()[0].device_kind, fp8=fp8)
    result.update(median_step_s=median, compile_and_first_step_s=compile_s,
                  step_durations_s=durations, peak_memory_bytes=_peak_memory(),
                  final_loss=float(m["loss"]))
    return result


def _table(result: Dict[str, Any]) -> str:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    mem = result.get("peak_memory_bytes")
    rows = [
        ("device", f"{result['device_count']} x {result['device_kind']}"),
        ("median step", f"{result['median_step_s'] * 1000:.1f} ms "
                        f"({len(result['step_durations_s'])} timed steps)"),
        ("seq/s", fmt(result["seq_per_s"], ".1f")),
        ("target tokens/s", fmt(result["target_tokens_per_s"], ".0f")),
        ("TFLOP/s per device", fmt(result["tflops_per_device"], ".2f")),
        ("MFU (bf16 peak)", "-" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"),
        ("peak memory", "-" if mem is None else f"{mem / 2**30:.2f} GiB"),
        ("compile + first step", f"{result['compile_and_first_step_s']:.1f} s"),
    ]
    if result.get("mfu_fp8") is not None:
        rows.insert(6, ("MFU (fp8 peak)", f"{100 * result['mfu_fp8']:.1f}%"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, force=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    gin_utils.add_gin_flags(parser)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compile")
    parser.add_argument("--json_out", default="bench.json", help="where to write the result")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = gin_utils.parse_flags(parser, argv)
    gin_utils.parse_gin(args.gin_file, list(gin_utils.RUN_PLACEHOLDERS) + list(args.gin_bindings),
                        args.gin_search_paths)
    import gin

    import t5lite.configurables  # noqa: F401
    model = gin_utils.resolve_macro("MODEL")
    bindings = gin.get_bindings("train")
    try:
        run = train.build_run(model=model,
                              **{k: v for k, v in bindings.items() if k != "model"})
    except partitioning.PartitioningError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result = bench(run, args.steps, args.warmup, fp8=bool(getattr(model.config, "fp8", False)))
    import flax
    result.update(
        device_kind=jax.devices()[0].device_kind, device_count=jax.device_count(),
        process_count=jax.process_count(), jax_version=jax.__version__,
        flax_version=flax.__version__, python=platform.python_version(),
        command=" ".join(["python -m t5lite.bench", *argv]), gin_config=gin.config_str(),
        flops_per_example=run.flops_per_example, batch_size=run.batch_size)
    print(_table(result))
    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"result written to {args.json_out}")
    return 0


if __name__ == "__main__":
    gin_utils.run_main(main)
