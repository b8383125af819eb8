"""`python -m t5lite.train`: the Gin runner for training (wiring only).

    python -m t5lite.train --gin_file=configs/models/t5_1_1/tiny.gin \
      --gin_file=configs/synthetic_pretrain.gin --gin.MODEL_DIR=\"/tmp/run\" \
      --gin.TRAIN_STEPS=20 --gin.BATCH_SIZE=8

With no --gin_file it runs the embedded demo, configs/demo_pretrain.gin.

Multi-process: `--multiprocess` (or SLURM with several tasks) calls
`jax.distributed.initialize()`; `--coordinator_address=127.0.0.1:1234 --process_count=2
--process_index=0` starts one process of a run by hand.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import jax

from t5lite import checkpoints, flops, gin_utils, metrics, partitioning, train_eval, trainer
from t5lite.models.configs import T5Config

log = logging.getLogger("t5lite.train")
SYNTHETIC_TASK = "synthetic"
DEMO_GIN_FILE = "configs/demo_pretrain.gin"


class TrainingError(RuntimeError):
    """A run that must stop (NaN loss, bad data); the message is one line."""


def _make_iterator(task_name: str, model, feature_lengths: Mapping[str, int], batch_size: int,
                   seed: int, partitioner: partitioning.Partitioner, pack: bool = False,
                   data_settings: Optional[Mapping[str, Optional[str]]] = None):
    """This process's batch iterator for the named task: the random-batch task
    `synthetic` (no TensorFlow), else a SeqIO task or mixture (t5lite.data.pipeline)."""
    kind = "encoder_decoder" if isinstance(model.config, T5Config) else "decoder_only"
    start, stop = partitioner.host_rows(batch_size)
    rows = stop - start
    process_index, process_count = start // rows, batch_size // rows
    if task_name == SYNTHETIC_TASK:
        from t5lite.data import synthetic
        task = synthetic.SyntheticTask(_lengths(model, feature_lengths),
                                       model.config.vocab_size, kind, seed)
        return synthetic.SyntheticIterator(task, batch_size, process_index=process_index,
                                           process_count=process_count)
    import gin
    with gin.unlock_config():  # the t5 package registers gin configurables on import
        from t5lite.data import pipeline, tasks  # the data edge: TensorFlow and SeqIO
    tasks.configure(**dict(data_settings or {}))
    it = pipeline.make_iterator(task_name, split="train",
                                feature_lengths=_lengths(model, feature_lengths),
                                batch_size=batch_size, model_kind=kind, pack=pack,
                                shuffle=True, seed=seed, process_index=process_index,
                                process_count=process_count)
    if it.vocabulary.vocab_size > model.config.vocab_size:
        raise gin_utils.ConfigError(
            f"the task's vocabulary has {it.vocabulary.vocab_size} ids (pieces + extra ids) "
            f"but the model's embedding only {model.config.vocab_size}; use a smaller "
            f"vocabulary or set the model's vocab_size (e.g. --gin.T5Config.vocab_size=...)")
    return it


def _lengths(model, feature_lengths: Mapping[str, int]) -> Dict[str, int]:
    if isinstance(model.config, T5Config):
        return {"inputs": feature_lengths["inputs"], "targets": feature_lengths["targets"]}
    return {"targets": feature_lengths["targets"]}


def _flops_per_example(model, feature_lengths) -> float:
    cfg = model.config
    if isinstance(cfg, T5Config):
        return flops.encoder_decoder_train_flops_per_example(
            cfg, feature_lengths["inputs"], feature_lengths["targets"])
    return flops.decoder_only_train_flops_per_example(cfg, feature_lengths["targets"])


class _Preemption:
    """Turns SIGTERM into a flag the loop checks between steps."""

    def __init__(self):
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def restore(self):
        signal.signal(signal.SIGTERM, self._previous)


def _write_config(model_dir: Path) -> None:
    import gin
    if jax.process_index() == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.gin").write_text(gin.config_str())


def _finite(values: Mapping[str, Any]) -> bool:
    return all(math.isfinite(float(values[k])) for k in ("loss", "grad_norm") if k in values)


@dataclasses.dataclass
class Run:
    """Everything a training (or benchmark) loop needs, built from the `train` bindings."""

    model: Any
    partitioner: partitioning.Partitioner
    fns: trainer.StepFunctions
    iterator: Any
    batch_size: int
    target_tokens: int
    flops_per_example: float

    def next_batch(self):
        return self.partitioner.host_to_global(next(self.iterator), self.batch_size)


def build_run(*, model, batch_size: int, task_feature_lengths: Mapping[str, int],
              mixture_or_task_name: str, optimizer, num_microbatches: int = 1,
              random_seed: int = 0, ici_mesh_shape: Sequence[int] = (-1, 1, 1),
              dcn_mesh_shape: Sequence[int] = (1, 1, 1), partition_rules: Sequence = (),
              pack: bool = False, data_settings: Optional[Mapping[str, Any]] = None,
              **_unused) -> Run:
    """Mesh, sharded train step and this process's data iterator."""
    part = partitioning.Partitioner(partitioning.make_mesh(ici_mesh_shape, dcn_mesh_shape),
                                    partition_rules)
    part.check_batch_size(batch_size, num_microbatches)
    fns = trainer.make_train_step(model, optimizer.tx, part,
                                  learning_rate_fn=optimizer.learning_rate_fn,
                                  num_microbatches=num_microbatches,
                                  lengths=_lengths(model, task_feature_lengths))
    it = _make_iterator(mixture_or_task_name, model, task_feature_lengths, batch_size,
                        random_seed, part, pack, data_settings)
    return Run(model, part, fns, it, batch_size, task_feature_lengths["targets"],
               _flops_per_example(model, task_feature_lengths))


def train(*, model, model_dir: str, train_steps: int, batch_size: int,
          task_feature_lengths: Mapping[str, int], mixture_or_task_name: str, optimizer,
          num_microbatches: int = 1, checkpoint_period: int = 1000, keep_checkpoints: int = 2,
          initial_checkpoint_path: Optional[str] = None, random_seed: int = 0,
          ici_mesh_shape: Sequence[int] = (-1, 1, 1),
          dcn_mesh_shape: Sequence[int] = (1, 1, 1), partition_rules: Sequence = (),
          pack: bool = False, data_settings: Optional[Mapping[str, Any]] = None,
          log_period: int = 10, async_checkpointing: bool = True,
          eval_period: Optional[int] = None, eval_split: Optional[str] = None,
          eval_batch_size: Optional[int] = None,
          eval_num_examples: Optional[int] = None) -> Dict[str, float]:
    """Train `model` for `train_steps` optimizer steps; resume from MODEL_DIR if it holds
    a checkpoint. With `eval_period`, decode `eval_split` of the task every that many
    steps and after the last (t5lite.train_eval). Returns the last logged metrics (and
    the last inference-evaluation metrics, `<task>/<metric>`)."""
    for name, value, optional in (("CHECKPOINT_PERIOD", checkpoint_period, True),
                                  ("KEEP_CHECKPOINTS", keep_checkpoints, True),
                                  ("LOG_PERIOD", log_period, False)):
        if not (value is None and optional) and (not isinstance(value, int) or value < 1):
            raise gin_utils.ConfigError(f"{name} must be a positive integer (or None), got "
                                        f"{value!r}")
    eval_period = train_eval.check_period(eval_period)
    if eval_period and mixture_or_task_name == SYNTHETIC_TASK:
        raise gin_utils.ConfigError("EVAL_PERIOD: the 'synthetic' task has no metrics to "
                                    "evaluate; set EVAL_PERIOD=None")
    model_dir = Path(model_dir)
    run = build_run(model=model, batch_size=batch_size,
                    task_feature_lengths=task_feature_lengths,
                    mixture_or_task_name=mixture_or_task_name, optimizer=optimizer,
                    num_microbatches=num_microbatches, random_seed=random_seed,
                    ici_mesh_shape=ici_mesh_shape, dcn_mesh_shape=dcn_mesh_shape,
                    partition_rules=partition_rules, pack=pack, data_settings=data_settings)
    part, fns, it = run.partitioner, run.fns, run.iterator
    abstract = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        fns.abstract_state, fns.state_shardings)
    ckpt = checkpoints.Checkpointer(model_dir, keep=keep_checkpoints, period=checkpoint_period,
                                    async_save=async_checkpointing)
    inference_eval = None
    try:
        state, data_state, source = checkpoints.restore_or_init(
            ckpt, abstract, lambda: fns.init(jax.random.PRNGKey(random_seed)),
            initial_checkpoint_path=initial_checkpoint_path, model=model)
        if eval_period:
            inference_eval = train_eval.InferenceEvaluation.create(
                model, part, task_name=mixture_or_task_name, split=eval_split,
                batch_size=eval_batch_size or batch_size,
                feature_lengths=task_feature_lengths, output_dir=str(model_dir),
                num_examples=eval_num_examples)
    except BaseException:
        ckpt.close()
        raise
    if data_state:
        it.set_state(data_state)
    _write_config(model_dir)
    step = int(jax.device_get(state.step))
    log.info("start: %s at step %d; mesh %s; %d process(es)", source, step,
             dict(part.mesh.shape), jax.process_count())

    writer = metrics.MetricWriter(str(model_dir), jax.process_index(), log_every=log_period,
                                  total_steps=train_steps, subdir="train")
    progress = metrics.Progress(train_steps, initial=step, process_index=jax.process_index())
    device_kind = jax.devices()[0].device_kind
    preempt = _Preemption()
    last: Dict[str, float] = {}
    t_last, steps_since = time.perf_counter(), 0
    t_start, start_step = t_last, step
    try:
        while step < train_steps:
            state, step_metrics = fns.train_step(state, run.next_batch())
            step += 1
            steps_since += 1
            report = step % log_period == 0 or step == train_steps
            stopping = preempt.requested  # read once: a SIGTERM from here on waits a step
            saving = ckpt.should_save(step) or step == train_steps or stopping
            if report or saving:
                values = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
                if not _finite(values):
                    ckpt.wait()  # an async save in flight is part of what was kept
                    good = ckpt.latest_step()
                    kept = (f"The last good checkpoint is step {good} in {model_dir}"
                            if good is not None else f"No checkpoint was saved in {model_dir}")
                    raise TrainingError(
                        f"the loss or its gradient is not finite at step {step} (loss "
                        f"{values.get('loss')}, grad norm {values.get('grad_norm')}); stopped "
                        f"without saving it. {kept}. Lower the learning rate or check the data")
            if report:
                now = time.perf_counter()
                step_time = (now - t_last) / steps_since
                t_last, steps_since = now, 0
                values.update(metrics.throughput(step_time, batch_size, run.target_tokens,
                                                 run.flops_per_example, jax.device_count(),
                                                 device_kind))
                writer.write_scalars(step, values)
                writer.flush()  # on disk now: a crash must not lose the curve so far
                progress.update(step, values)
                last = values
            if saving:
                ckpt.save(step, state, it.get_state(), force=True)
            if inference_eval is not None and train_eval.due(step, eval_period, train_steps):
                last = {**last, **inference_eval(step, state.variables)}
            if stopping:
                log.info("SIGTERM: saved step %d; exiting", step)
                break
    finally:
        progress.close()
        ckpt.wait()
        ckpt.close()
        writer.close()
        if inference_eval is not None:
            inference_eval.close()
        preempt.restore()  # after the last save is committed: a SIGTERM now only sets the flag
    if step >= train_steps and step > start_step:
        log.info("done: steps %d-%d in %.0fs; checkpoints in %s, TensorBoard logs in %s "
                 "(tensorboard --logdir %s)", start_step + 1, step,
                 time.perf_counter() - t_start, model_dir / "checkpoints",
                 model_dir / "train", model_dir)
    return last


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    return gin_utils.entry_parser(__doc__.splitlines()[0])


def main(argv: Optional[Sequence[str]] = None) -> int:
    gin_utils.setup_logging()
    args = gin_utils.parse_flags(_parser(), argv)
    if not args.gin_file:  # the embedded default: the demo, on data it writes itself
        log.info("no --gin_file given: running the demo (%s); see README.md", DEMO_GIN_FILE)
        args.gin_file = [DEMO_GIN_FILE]
    partitioning.initialize_distributed(args.coordinator_address, args.process_count,
                                        args.process_index, args.multiprocess)
    _check_command_line_macros(args)
    gin_utils.configure(args)
    import t5lite.configurables as conf
    # Under `python -m t5lite.train` this module is `__main__`; the registered `train`
    # (and the TrainingError it raises) belong to the imported `t5lite.train`.
    from t5lite import train as train_module
    model = gin_utils.resolve_macro("MODEL")
    try:
        conf.train(model=model)
    except gin_utils.ConfigError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return gin_utils.EXIT_CONFIG_ERROR
    except (partitioning.PartitioningError, checkpoints.CheckpointMismatchError,
            train_module.TrainingError, FileNotFoundError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    return 0


def _one_line(e: BaseException) -> str:
    """The message without the `In call to configurable ...` lines gin appends to errors
    raised inside a configurable."""
    return str(e).split("\n  In call to configurable")[0].strip()


def _check_command_line_macros(args: argparse.Namespace) -> None:
    """A `--gin.NAME=` macro that no gin file defines and nothing references is a typo
    (`--gin.BATCH_SIZ=8`): gin would accept it and silently train with the default."""
    import difflib

    import gin
    names = []
    for binding in args.gin_bindings:
        name = binding.partition("=")[0].strip()
        if name and name.isidentifier() and "." not in name:
            names.append(name)
    if not names:
        return
    gin_utils.parse_gin(args.gin_file, (), args.gin_search_paths, finalize=False)
    from_files = {scope for scope, selector in gin.config._CONFIG if selector == "gin.macro"}
    gin_utils.parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths,
                        finalize=False)
    referenced = {ref.scoped_selector.rpartition("/")[0]
                  for ref in gin.config.iterate_references(gin.config._CONFIG)}
    for name in names:
        if name not in from_files and name not in referenced:
            close = difflib.get_close_matches(name, sorted(from_files), n=1)
            hint = f"did you mean {close[0]}?" if close else "check the spelling"
            raise gin_utils.ConfigError(
                f"--gin.{name}: the gin files define no macro {name} and nothing uses it "
                f"({hint})")


if __name__ == "__main__":
    gin_utils.run_main(main)
