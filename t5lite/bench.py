"""`python -m t5lite.bench`: time the train step of a gin-configured run, or a whole grid
of them (wiring only; the libraries are `t5lite.tools.benchmark` and
`t5lite.tools.bench_grid`).

    python -m t5lite.bench --gin_file=configs/models/t5_1_1/large.gin \
      --gin_file=configs/synthetic_pretrain.gin \
      --gin.TASK_FEATURE_LENGTHS="{'inputs': 512, 'targets': 128}" --gin.BATCH_SIZE=64 \
      --steps=20 --json_out=docs/perf/large_bf16.json
    python -m t5lite.bench --grid=scripts_gpu/grids/sizes.json --out_dir=/tmp/grid

One configuration: compiles the step and the initializer (timed), warms up, times `--steps`
steps one by one, then steps dispatched ahead, and prints the median step time, seq/s,
tokens/s, TFLOP/s per device, MFU, the step's memory (compiled, measured) and the start-up
seconds (`--startup_only`: those alone). The JSON holds the device, versions, command,
resolved gin config and every timed step; a grid writes one per configuration plus
`results.md` under --out_dir (--fingerprint_cost: tools/fingerprint_cost.py). Needs only
jax, flax, optax, orbax and gin-config.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

import jax

from t5lite.config import command, flags
from t5lite.errors import ConfigError
from t5lite.tools import bench_grid, benchmark, benchmarking, fingerprint_cost


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=flags.summary(__doc__), allow_abbrev=False)
    flags.add_gin_flags(parser)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compile")
    parser.add_argument("--json_out", default="bench.json", help="where to write the result")
    parser.add_argument("--startup_only", action="store_true", help="time only what a new "
                        "run waits for: building it, compiling the step, compiling and "
                        "running the initializer (no step runs)")
    parser.add_argument("--fingerprint_cost", action="store_true", help="fingerprints' cost")
    parser.add_argument("--grid", help="a grid file (JSON): run every configuration in it")
    parser.add_argument("--out_dir", help="with --grid: where results are written")
    parser.add_argument("--only", action="append", help="with --grid: run names to keep "
                        "(shell patterns, repeatable)")
    parser.add_argument("--time_budget_s", type=float, help="with --grid: start no "
                        "configuration that would end past this many seconds")
    return parser


def _grid(args) -> int:
    if not args.out_dir:
        raise ConfigError("--grid needs --out_dir (where the results are written)")
    grid = bench_grid.load_grid(args.grid)
    runs = bench_grid.select(grid.runs, args.only)
    if not runs:
        raise ConfigError(f"--only {args.only} matches no run of {args.grid}")

    def measure(grid_run, per_device_batch):
        batch = per_device_batch * jax.device_count()
        t0 = time.perf_counter()
        the_run = benchmarking.build_bench_run(
            grid_run.gin_files, [*grid_run.bindings, f"BATCH_SIZE = {batch}"],
            args.gin_search_paths)
        return benchmarking.timed(the_run, grid.steps, grid.warmup, bench_grid.command_for(
            grid_run, batch), build_s=time.perf_counter() - t0)

    grid = bench_grid.Grid(tuple(runs), grid.steps, grid.warmup)
    rows = bench_grid.run_grid(grid, args.out_dir, measure, time_budget_s=args.time_budget_s,
                               log=lambda line: print(line, flush=True))
    print(f"{sum(r['status'] == 'ok' for r in rows)} of {len(rows)} configurations measured; "
          f"results in {args.out_dir}/results.md")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    command.setup_logging()  # t5lite's lines: the compilation cache's hits and misses
    argv = sys.argv[1:] if argv is None else list(argv)
    args = flags.parse_flags(_parser(), argv)
    if args.grid:
        return _grid(args)
    if args.fingerprint_cost:
        return fingerprint_cost.run(args, " ".join(["python -m t5lite.bench", *argv]))
    t0 = time.perf_counter()
    the_run = benchmarking.build_bench_run(args.gin_file, args.gin_bindings,
                                           args.gin_search_paths)
    build_s, command_line = time.perf_counter() - t0, " ".join(["python -m t5lite.bench", *argv])
    if args.startup_only:
        result = benchmarking.startup_timed(the_run, command_line, build_s)
        print(benchmark.format_startup(result))
    else:
        result = benchmarking.timed(the_run, args.steps, args.warmup, command_line, build_s)
        print(benchmark.format_table(result))
    return benchmarking.write_result(result, args.json_out)


if __name__ == "__main__":
    command.run_main(main)
