"""`python -m t5lite.bench`: time the train step of a gin-configured run (wiring only; the
library is `t5lite.runtime.benchmark`).

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
import inspect
import json
import logging
import platform
import sys
from typing import Optional, Sequence

import gin
import jax

from t5lite.config import command, flags, parsing
from t5lite.errors import PartitioningError
from t5lite.runtime import benchmark, run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    flags.add_gin_flags(parser)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compile")
    parser.add_argument("--json_out", default="bench.json", help="where to write the result")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, force=True)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = flags.parse_flags(_parser(), argv)
    parsing.parse_gin(args.gin_file, list(parsing.RUN_PLACEHOLDERS) + list(args.gin_bindings),
                      args.gin_search_paths)
    model = parsing.resolve_macro("MODEL")
    # The run's settings are the `train` bindings that build_run takes (not the loop's).
    wanted = set(inspect.signature(run.build_run).parameters) - {"model"}
    settings = {k: v for k, v in gin.get_bindings("train").items() if k in wanted}
    try:
        the_run = run.build_run(model=model, **settings)
    except PartitioningError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result = benchmark.bench(the_run, args.steps, args.warmup,
                             fp8=bool(getattr(model.config, "fp8", False)))
    import flax
    result.update(
        device_kind=jax.devices()[0].device_kind, device_count=jax.device_count(),
        process_count=jax.process_count(), jax_version=jax.__version__,
        flax_version=flax.__version__, python=platform.python_version(),
        command=" ".join(["python -m t5lite.bench", *argv]), gin_config=gin.config_str(),
        flops_per_example=the_run.flops_per_example, batch_size=the_run.batch_size)
    print(benchmark.format_table(result))
    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"result written to {args.json_out}")
    return 0


if __name__ == "__main__":
    command.run_main(main)
