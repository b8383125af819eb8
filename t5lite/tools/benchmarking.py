"""From gin to a timed train step, for `python -m t5lite.bench` and its grids: build the
step a gin config describes (`step_run`: the loop's own settings, checkpointing and
evaluation, play no part in a step's speed or memory) and wrap a timing in what makes it
traceable: device, versions, command and resolved config. `info --memory` compiles the
same step.

    the_run = build_bench_run(["models/t5_1_1/large.gin", "synthetic_pretrain.gin"],
                              ["BATCH_SIZE = 64"])
    result = timed(the_run, steps=20, warmup=3, command="python -m t5lite.bench ...")
"""
from __future__ import annotations

import platform
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import gin
import jax

from t5lite.config import command, parsing
from t5lite.errors import ConfigError, PartitioningError, check_feature_lengths
from t5lite.runtime.process import compilation_cache
from t5lite.optim import optimizers
from t5lite.runtime import run
from t5lite.tools import benchmark


def build_bench_run(gin_files: Sequence[str], bindings: Sequence[str],
                    search_paths: Iterable[str] = ()) -> run.TrainingRun:
    """Parse the config (unset run macros get placeholders: a benchmark has no MODEL_DIR),
    start the compilation cache it names (a hit makes the compile times a load's: the
    result says which, `provenance`) and build its step run (`step_run`). Raises
    ConfigError / PartitioningError."""
    parsing.parse_gin(gin_files, bindings, search_paths, placeholders=parsing.RUN_PLACEHOLDERS)
    global _cache_at_build
    command.start_compilation_cache()
    _cache_at_build = compilation_cache.stats()
    return step_run(parsing.resolve_macro("MODEL", origin=", ".join(gin_files)))


def step_run(model, *, batch_size: Optional[int] = None,
             devices: Optional[Sequence[Any]] = None,
             task_feature_lengths: Optional[Mapping[str, int]] = None,
             optimizer: Any = None, platform: Optional[str] = None) -> run.TrainingRun:
    """The parsed config's train step (model, optimizer, mesh, batch size, microbatches,
    lengths: the `train` bindings that `build_run` takes; arguments given here win) fed
    random batches of the same shapes: a step's speed and memory do not depend on the
    text, and random batches need no TensorFlow, even for a recipe naming a real task.
    `platform` ("cuda"): the programs are lowered for it, not run on the devices.
    Raises ConfigError in one line (a batch that does not divide over the mesh, say)."""
    bound = gin.get_bindings("train")
    given = {"batch_size": batch_size, "task_feature_lengths": task_feature_lengths}
    settings = {k: v if v is not None else bound.get(k) for k, v in given.items()}
    missing = [k.upper() for k, v in settings.items() if v is None]
    if missing:
        raise ConfigError(f"the config sets no {' or '.join(missing)}; include a run config "
                          f"(e.g. runs/pretrain.gin) or bind it")
    check_feature_lengths(settings["task_feature_lengths"])
    data = run.TrainData(run.SYNTHETIC_TASK, settings["task_feature_lengths"],
                         settings["batch_size"], seed=bound.get("random_seed") or 0,
                         pack=bound.get("pack", False))
    try:
        return run.build_run(model=model, data=data,
                             optimizer=optimizer or bound.get("optimizer") or default_optimizer(),
                             num_microbatches=bound.get("num_microbatches", 1),
                             mesh=bound.get("mesh"), devices=devices, platform=platform)
    except PartitioningError as e:
        raise ConfigError(str(e)) from None


OPTIMIZERS = {"adafactor": lambda: optimizers.adafactor(optimizers.rsqrt_decay()),
              "adamw": lambda: optimizers.adamw(1e-4)}


def default_optimizer():
    """What the T5 recipes train with when a config binds none: Adafactor, rsqrt decay."""
    return OPTIMIZERS["adafactor"]()


def write_result(result, path: str) -> int:
    """`result` as JSON at `path`, said on stdout; 0 (a command's exit status)."""
    import json
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"result written to {path}")
    return 0


def run_optimizer(name: Optional[str] = None) -> Tuple[Any, str]:
    """The optimizer named (adafactor / adamw), else the one the parsed config binds to
    `train.optimizer`, else the default; with where it came from, in words."""
    if name is not None:
        return OPTIMIZERS[name](), "--optimizer"
    bound = gin.get_bindings("train").get("optimizer")
    if bound is not None:
        return bound, "bound by the config"
    return default_optimizer(), "the config binds none; T5's default"


def global_batch(per_device_batch: Optional[int], devices: int) -> int:
    """per_device_batch x devices, or the parsed config's BATCH_SIZE when none is given
    (which the mesh's data shards must divide, not the devices: tensor and pipeline
    parallel devices share their sequences; the run's data layout checks it)."""
    if per_device_batch is None:
        batch = gin.get_bindings("train").get("batch_size")
        if batch is None:
            raise ConfigError("the config sets no BATCH_SIZE: give --per_device_batch")
        return batch
    if per_device_batch < 1:
        raise ConfigError(f"--per_device_batch must be >= 1, got {per_device_batch}")
    return per_device_batch * devices


def provenance(the_run: run.TrainingRun, command: str) -> Dict[str, Any]:
    """What a benchmark number needs to be traced to its run (`compilation_cache`: its
    directory, hits and misses since `build_bench_run`, None when off: after a hit,
    compile_s is the time to load the step)."""
    import flax
    return dict(device_kind=jax.devices()[0].device_kind, device_count=jax.device_count(),
                process_count=jax.process_count(), jax_version=jax.__version__,
                flax_version=flax.__version__, python=platform.python_version(),
                command=command, gin_config=gin.config_str(),
                flops_per_example=the_run.flops_per_example, batch_size=the_run.batch_size,
                compilation_cache=compilation_cache.stats(since=_cache_at_build))


_cache_at_build: Optional[Dict[str, Any]] = None  # the cache's counts at build_bench_run


def timed(the_run: run.TrainingRun, steps: int, warmup: int, command: str,
          build_s: Optional[float] = None) -> Dict[str, Any]:
    """`tools.benchmark.bench` of the run, with its provenance (and `build_s`, the seconds
    `build_bench_run` took, when given)."""
    result = benchmark.bench(the_run, steps, warmup,
                             fp8=bool(getattr(the_run.model.config, "fp8", False)))
    result.update(provenance(the_run, command), build_s=build_s)
    return result


def startup_timed(the_run: run.TrainingRun, command: str, build_s: float) -> Dict[str, Any]:
    """`tools.benchmark.startup` of the run (no step runs), with `build_s` and provenance."""
    result = {"build_s": build_s, **benchmark.startup(the_run)}
    result.update(provenance(the_run, command))
    return result
