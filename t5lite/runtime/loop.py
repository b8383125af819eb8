"""The training loop: `train` restores or initializes the state, then runs the jitted step
until TRAIN_STEPS, logging, checkpointing and (optionally) evaluating on the way. The
library behind `python -m t5lite.train` (configs/runs/pretrain.gin binds it).

    train(**keywords)
      TrainArgs        the keywords, checked (ConfigError names the setting)
      RunContext       one run's parts, filled in as it starts: MODEL_DIR's lock and the
                       signal handler (both given back on every exit), then
      _open            the seed, the data, the mesh and jitted step (build_run), the
                       checkpointer, the state restored or initialized, the evaluator
      _start           config.gin, the start line, the writer, the watchdog, the duties
      _run_steps       the step loop, then the duties closed (step_duties.StepDuties)

    for each step:  state, metrics = train_step(state, next batch)   (step_duties.py)
      every LOG_PERIOD steps and the last   metrics to TensorBoard and the log line, one
                                            step late (a non-finite loss stops the run,
                                            unsaved; with SKIP_BAD_STEPS the step is
                                            skipped instead: skipped_steps.py)
      every CHECKPOINT_PERIOD, the last,    save state + data position (async)
      and on SIGTERM, SIGHUP or a first   (a second Ctrl-C stops at once, unsaved;
      Ctrl-C                                with several processes, a signal to any
                                            stops all after one agreed step)
      every EVAL_PERIOD and the last        the validation loss (EVAL_STEPS batches of
                                            EVAL_SPLIT) and the task's metrics

Evaluation during training is injected, so that this layer knows nothing of inference:
`inference_evaluator(model, partitioner, task_name=..., feature_lengths=...,
batch_size=..., output_dir=..., settings=inference_eval)` builds a callable
`(step, variables) -> {"training_eval/<task>/<name>": value, "<task>/<metric>": value}`
with a `close()` (`t5lite.inference.train_eval.InferenceEvaluation`; gin binds it). The loop reads only
`inference_eval.period` (`step_duties.EvalPeriod`); the settings class,
InferenceEvalSettings, lives with the evaluator.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

import jax

from t5lite.data import edge
from t5lite.errors import (ConfigError, OutputWriteError, check_bool, check_feature_lengths,
                           check_positive_int, check_text)
from t5lite.runtime.checkpointing import checkpoints, lora_restore
from t5lite.runtime.checkpointing.start import Start
from t5lite.runtime.process import compile_record, disk_space, distributed
from t5lite.runtime import metrics, run_seed
from t5lite.formats.checkpoint_files import CHECKPOINTS_DIR, complete_steps
from t5lite.runtime.process.watchdog import StepWatchdog, WatchdogSettings
from t5lite.runtime.partitioning import MeshSettings
from t5lite.runtime.run import SYNTHETIC_TASK, TrainData, build_run
from t5lite.runtime.skipped_steps import SkipSettings, SkipWatch
from t5lite.runtime.process.preemption import Preemption
from t5lite.runtime.process.run_lock import hold
from t5lite.runtime.step_duties import (EvalPeriod, Evaluation, Reports, Saving, StepDuties,
                                        close_all)

log = logging.getLogger(__name__)

INITIAL_CHECKPOINT_STATES = ("params", "train_state", "upcycle")


def train(*, model, model_dir: str, train_steps: int, batch_size: int,
          task_feature_lengths: Mapping[str, int], mixture_or_task_name: str, optimizer,
          num_microbatches: int, initial_checkpoint_path: Optional[str],
          initial_checkpoint_state: str, random_seed: Optional[int],
          pack: bool, log_period: int, mesh: MeshSettings,
          checkpointing: checkpoints.CheckpointSettings, data_settings: edge.DataSettings,
          inference_eval: EvalPeriod, inference_evaluator: Optional[Callable],
          allow_changed_inputs: bool, watchdog: WatchdogSettings,
          skip_steps: SkipSettings, data_shards: Optional[int] = None) -> Dict[str, float]:
    """Train `model` for `train_steps` optimizer steps; resume from MODEL_DIR if it holds
    a checkpoint. With `inference_eval.period`, evaluate every that many steps and after
    the last (the validation loss; the task's metrics where it has them). A resume whose
    vocabulary or data files differ from the checkpoint's refuses (DataError) unless
    `allow_changed_inputs`. Returns the last logged metrics (and the last evaluation's,
    `training_eval/<task>/<name>` and `<task>/<metric>`). Every keyword is bound by
    configs/runs/pretrain.gin, the one home of their defaults."""
    args = TrainArgs(
        model=model, model_dir=model_dir, train_steps=train_steps, batch_size=batch_size,
        task_feature_lengths=task_feature_lengths, mixture_or_task_name=mixture_or_task_name,
        optimizer=optimizer, num_microbatches=num_microbatches,
        initial_checkpoint_path=initial_checkpoint_path,
        initial_checkpoint_state=initial_checkpoint_state, random_seed=random_seed, pack=pack,
        log_period=log_period, mesh=mesh, checkpointing=checkpointing,
        data_settings=data_settings, inference_eval=inference_eval,
        inference_evaluator=inference_evaluator, allow_changed_inputs=allow_changed_inputs,
        watchdog=watchdog, skip_steps=skip_steps, data_shards=data_shards)
    distributed.on_loss_say(lambda: _resume_from(args.model_dir))
    # with several processes the signals are agreed on from here: one that reaches some
    # of them while they start up must stop them all (after their first step) too
    ctx = RunContext(args, preempt=Preemption() if jax.process_count() > 1 else None)
    try:
        ctx.lock = hold(args.model_dir)
        if not _open(ctx):
            return {}
        _start(ctx)
        try:
            _run_steps(ctx)
        finally:
            ctx.duties.close()
        _say_done(ctx)
        return ctx.last
    except OutputWriteError as e:  # a full disk or a failed write: say what is kept
        raise type(e)(f"{e}; {_kept(args.model_dir)}") from None
    finally:
        if ctx.preempt is not None:
            ctx.preempt.restore()
        if ctx.lock is not None:
            ctx.lock.release()


@dataclasses.dataclass(frozen=True)
class TrainArgs:
    """`train`'s keywords, checked in one place (ConfigError names the setting);
    `model_dir` becomes a Path."""

    model: Any
    model_dir: Path
    train_steps: int
    batch_size: int
    task_feature_lengths: Mapping[str, int]
    mixture_or_task_name: str
    optimizer: Any
    num_microbatches: int
    initial_checkpoint_path: Optional[str]
    initial_checkpoint_state: str
    random_seed: Optional[int]
    pack: bool
    log_period: int
    mesh: MeshSettings
    checkpointing: checkpoints.CheckpointSettings
    data_settings: edge.DataSettings
    inference_eval: EvalPeriod
    inference_evaluator: Optional[Callable]
    allow_changed_inputs: bool
    watchdog: WatchdogSettings
    skip_steps: SkipSettings
    data_shards: Optional[int] = None

    def __post_init__(self):
        check_positive_int("TRAIN_STEPS", self.train_steps)
        check_feature_lengths(self.task_feature_lengths)
        check_text("MODEL_DIR", self.model_dir)
        check_text("MIXTURE_OR_TASK_NAME", self.mixture_or_task_name)
        check_text("INITIAL_CHECKPOINT_PATH", self.initial_checkpoint_path, optional=True)
        check_bool("PACK", self.pack)
        check_bool("ALLOW_CHANGED_INPUTS", self.allow_changed_inputs)
        check_positive_int("DATA_SHARDS", self.data_shards, optional=True)
        check_positive_int("LOG_PERIOD", self.log_period)
        run_seed.check(self.random_seed)
        if self.initial_checkpoint_state not in INITIAL_CHECKPOINT_STATES:
            raise ConfigError(f"INITIAL_CHECKPOINT_STATE={self.initial_checkpoint_state!r}: use "
                              f"'params' (the parameters only, step 0), 'train_state' (a T5X "
                              f"run's step and Adafactor state too) or 'upcycle' (a dense "
                              f"checkpoint into a mixture of experts)")
        if self.initial_checkpoint_state == "upcycle" and not self.initial_checkpoint_path:
            raise ConfigError("INITIAL_CHECKPOINT_STATE='upcycle' needs INITIAL_CHECKPOINT_PATH: "
                              "the dense checkpoint whose MLPs become the experts")
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        check_model_dir(self.model_dir)


@dataclasses.dataclass
class RunContext:
    """One run's parts, shared by `train`'s steps and filled in as it starts: the signal
    handler (several processes: from the start; one: from `_start`) and MODEL_DIR's lock,
    both given back on every exit; then (`_open`) the run, checkpointer, evaluator, state
    and step; then (`_start`) the step duties. `last`: the last metrics, `train`'s result."""

    args: TrainArgs
    preempt: Optional[Preemption] = None
    lock: Any = None  # run_lock.RunLock
    run: Any = None  # run.TrainingRun
    ckpt: Optional[checkpoints.Checkpointer] = None
    evaluator: Optional[Callable] = None
    state: Any = None  # the TrainState
    source: Optional[Start] = None  # where the state came from (restore_or_init)
    lora_record: Optional[dict] = None  # a LoRA run's base fingerprint and alpha (lora_restore)
    step: int = 0
    start_step: int = 0
    t_start: float = 0.0
    duties: Optional[StepDuties] = None
    last: Dict[str, float] = dataclasses.field(default_factory=dict)


def _check_evaluation(args: TrainArgs) -> None:
    if args.inference_eval.period and args.mixture_or_task_name == SYNTHETIC_TASK:
        raise ConfigError("EVAL_PERIOD: the 'synthetic' task has no validation split and no "
                          "metrics to evaluate; set EVAL_PERIOD=None")
    if args.inference_eval.period and args.inference_evaluator is None:
        raise ConfigError("EVAL_PERIOD is set but no inference evaluator is bound: set "
                          "train.inference_evaluator = @InferenceEvaluation (runs/pretrain.gin "
                          "does)")


def _open(ctx: RunContext) -> bool:
    """The run set up: the seed (None: drawn once, kept), the data, the mesh and jitted
    step, the checkpointer, the restored state, the evaluator. False (all closed again)
    when MODEL_DIR's state is already at TRAIN_STEPS."""
    args = ctx.args
    random_seed = run_seed.resolve(args.random_seed, args.model_dir)
    _check_evaluation(args)
    data = TrainData(args.mixture_or_task_name, args.task_feature_lengths, args.batch_size,
                     seed=random_seed, pack=args.pack, data_settings=args.data_settings,
                     data_shards=args.data_shards)
    ctx.run = build_run(model=args.model, data=data, optimizer=args.optimizer,
                        num_microbatches=args.num_microbatches, mesh=args.mesh,
                        skip=args.skip_steps)
    ctx.ckpt = checkpoints.Checkpointer(
        args.model_dir, keep=args.checkpointing.keep, period=args.checkpointing.period,
        async_save=args.checkpointing.async_save,
        iterator_shards=functools.partial(edge.shards_for, ctx.run.layout))
    try:
        _restore(ctx, data, random_seed)
    except BaseException:
        close_all(ctx.ckpt.close, ctx.evaluator.close if ctx.evaluator is not None else None)
        raise
    ctx.step = ctx.start_step = int(jax.device_get(ctx.state.step))
    if ctx.step < args.train_steps:
        return True
    ctx.ckpt.close()
    if ctx.evaluator is not None:
        ctx.evaluator.close()
    log.info("already complete: %s holds step %d and TRAIN_STEPS=%d; nothing to train "
             "(raise TRAIN_STEPS to continue)", args.model_dir, ctx.step, args.train_steps)
    return False


def _restore(ctx: RunContext, data: TrainData, random_seed: int) -> None:
    """MODEL_DIR's latest checkpoint, INITIAL_CHECKPOINT_PATH or a fresh init; the
    evaluator (with EVAL_PERIOD); the data position of a resumed run."""
    args, run, step_fns = ctx.args, ctx.run, ctx.run.step_fns
    abstract = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        step_fns.abstract_state, step_fns.state_shardings)
    ctx.state, data_state, ctx.source = checkpoints.restore_or_init(
        ctx.ckpt, abstract, lambda: step_fns.init(jax.random.PRNGKey(random_seed)),
        initial_checkpoint_path=args.initial_checkpoint_path, model=args.model,
        initial_checkpoint_state=args.initial_checkpoint_state,
        factoring=getattr(args.optimizer, "factoring", None))
    ctx.lora_record, data_state = lora_restore.start_fingerprint(
        args.model, ctx.state.params, data_state, ctx.source)
    if args.inference_eval.period:
        ctx.evaluator = args.inference_evaluator(
            args.model, run.partitioner, task_name=data.mixture_or_task_name,
            feature_lengths=data.task_feature_lengths, batch_size=data.batch_size,
            output_dir=str(args.model_dir), settings=args.inference_eval)
    if data_state:
        run.iterator.set_state(data_state, allow_changed_inputs=args.allow_changed_inputs)


def _start(ctx: RunContext) -> None:
    """What the steps need: config.gin (a new run's), the start line, the metric writer,
    the progress bar, the signal handler, the watchdog and the step duties; then the
    line on what TASK_FEATURE_LENGTHS cut, if anything, and the line before the train
    step compiles (`compile_record`)."""
    args, run, step, model_dir = ctx.args, ctx.run, ctx.step, ctx.args.model_dir
    # config.gin records how the saved state was trained: a new run writes it now, a
    # resumed one replaces it only when it saves (a restart that fails keeps the record)
    config_written = not (model_dir / "config.gin").exists()
    if config_written:
        _write_config(model_dir)
    log.info("start: %s at step %d; mesh %s%s; %d process(es)", ctx.source, step,
             dict(run.partitioner.mesh.shape),
             " (optimizer state split over data)"
             if run.partitioner.shard_optimizer_over_data else "", jax.process_count())
    writer = metrics.MetricWriter(str(model_dir), jax.process_index(),
                                  log_every=args.log_period, total_steps=args.train_steps,
                                  subdir="train")
    progress = metrics.Progress(args.train_steps, initial=step,
                                process_index=jax.process_index())
    ctx.preempt = ctx.preempt or Preemption()
    ctx.t_start = time.perf_counter()
    dog = StepWatchdog(args.watchdog, model_dir, step, jax.process_index())
    ctx.duties = StepDuties(
        Reports(run, writer, progress, ctx.lock, dog, ctx.ckpt, model_dir, step,
                source=ctx.source),
        Saving(ctx.ckpt, lora_restore.recording(run.iterator.get_state, ctx.lora_record),
               dog, args.watchdog.save_seconds, args.train_steps,
               None if config_written else lambda: _write_config(model_dir)),
        Evaluation(ctx.evaluator, args.inference_eval.period, args.train_steps, dog),
        dog, ctx.preempt, writer, progress, args.log_period, args.train_steps,
        SkipWatch(args.skip_steps, ctx.ckpt, model_dir) if args.skip_steps.enabled else None)
    length_cuts = getattr(run.iterator, "length_cuts", None)  # a task's, not synthetic's
    if length_cuts is not None and jax.process_index() == 0:
        cuts = length_cuts()  # one line: what TASK_FEATURE_LENGTHS cut, if anything
        if cuts is not None:
            writer.write_scalars(step, cuts.metrics())
    # the first step compiles the train step (or loads it from the compilation cache)
    compile_record.announce("the train step", "step_fn", str(model_dir))


def _run_steps(ctx: RunContext) -> None:
    """The step loop: each batch fetched while the step before it runs, then the step's
    duties (step_duties); it ends where a step's plan `ends` (TRAIN_STEPS or a stop
    signal; saved either way)."""
    run, duties = ctx.run, ctx.duties
    train_step = run.step_fns.train_step
    batch = run.next_batch()  # from here on each batch is fetched while a step runs
    while True:
        ctx.state, step_metrics = train_step(ctx.state, batch)
        ctx.step += 1
        plan = duties.plan(ctx.step)
        if not plan.saving:  # a save records the data position before the next batch
            batch = run.next_batch()  # on the device while this step runs
        ctx.last = duties.after_step(plan, ctx.state, step_metrics, ctx.last)
        if plan.ends:
            return
        if plan.saving:
            batch = run.next_batch()


def _say_done(ctx: RunContext) -> None:
    model_dir = ctx.args.model_dir
    if ctx.step >= ctx.args.train_steps and ctx.step > ctx.start_step:
        log.info("done: steps %d-%d in %.0fs; checkpoints in %s, TensorBoard logs in %s "
                 "(tensorboard --logdir %s)", ctx.start_step + 1, ctx.step,
                 time.perf_counter() - ctx.t_start, model_dir / "checkpoints",
                 model_dir / "train", model_dir)


def _write_config(model_dir: Path) -> None:
    """MODEL_DIR/config.gin: the resolved configuration of this run (process 0), replaced
    atomically."""
    import gin
    if jax.process_index() == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        disk_space.replace_file(model_dir / "config.gin", gin.config_str())


def check_model_dir(model_dir: Path) -> None:
    """ConfigError (one line) when MODEL_DIR cannot be a run directory."""
    for path in (model_dir, *model_dir.parents):
        if path.exists():
            if not path.is_dir():
                what = "MODEL_DIR" if path == model_dir else f"MODEL_DIR's parent {path}"
                raise ConfigError(f"{what} is a file, not a directory: MODEL_DIR={model_dir} "
                                  f"must name a directory (new or an earlier run's)")
            if not os.access(path, os.W_OK | os.X_OK):
                raise ConfigError(f"MODEL_DIR={model_dir}: {path} is not writable")
            return


def _kept(model_dir: Path) -> str:
    """What a run stopped by a failed write leaves to resume from."""
    steps = complete_steps(model_dir / CHECKPOINTS_DIR)
    if not steps:
        return "no checkpoint was saved — free space (or use a MODEL_DIR on a larger disk)"
    listed = ", ".join(map(str, steps))
    return (f"checkpoint{'s' if len(steps) > 1 else ''} {listed} in {model_dir} "
            f"{'are' if len(steps) > 1 else 'is'} kept — free space (or lower "
            f"KEEP_CHECKPOINTS, or use a MODEL_DIR on a larger disk), then run the same "
            f"command to resume from step {steps[-1]}")


def _resume_from(model_dir: Path) -> str:
    """What a run that lost a process leaves to resume from."""
    steps = complete_steps(model_dir / CHECKPOINTS_DIR)
    if not steps:
        return (f"No checkpoint was committed in {model_dir}: running the same command "
                f"(every process) starts the run again")
    return (f"The last committed checkpoint is step {steps[-1]} in {model_dir}: run the same "
            f"command (every process) to resume from it")
