"""The training loop: `train` restores or initializes the state, then runs the jitted step
until TRAIN_STEPS, logging, checkpointing and (optionally) evaluating on the way. The
library behind `python -m t5lite.train` (configs/runs/pretrain.gin binds it).

    for each step:  state, metrics = train_step(state, next batch)
      every LOG_PERIOD steps and the last   metrics to TensorBoard and the log line
                                            (a non-finite loss stops the run, unsaved)
      every CHECKPOINT_PERIOD, the last,    save state + data position (async)
      and on SIGTERM, SIGHUP or a first   (a second Ctrl-C stops at once, unsaved;
      Ctrl-C                                with several processes, a signal to any
                                            stops all after one agreed step)
      every EVAL_PERIOD and the last        the inference evaluator's metrics

Evaluation during training is injected, so that this layer knows nothing of inference:
`inference_evaluator(model, partitioner, task_name=..., feature_lengths=...,
batch_size=..., output_dir=..., settings=InferenceEvalSettings)` builds a callable
`(step, variables) -> {"<task>/<metric>": value}` with a `close()`
(`t5lite.inference.train_eval.InferenceEvaluation`; gin binds it).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

import jax

from t5lite.data.settings import DataSettings
from t5lite.errors import (ConfigError, OutputWriteError, TrainingError, check_bool,
                           check_feature_lengths, check_positive_int, check_text)
from t5lite.runtime.checkpointing import checkpoints
from t5lite.runtime.process import disk_space, distributed
from t5lite.runtime import metrics, periods, run_seed
from t5lite.formats.checkpoint_files import CHECKPOINTS_DIR, complete_steps
from t5lite.runtime.process.watchdog import StepWatchdog, WatchdogSettings
from t5lite.runtime.partitioning import MeshSettings
from t5lite.runtime.run import SYNTHETIC_TASK, TrainData, build_run
from t5lite.runtime.process.preemption import Preemption
from t5lite.runtime.process.run_lock import hold

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InferenceEvalSettings:
    """Evaluation during training (T5X's infer_eval): EVAL_PERIOD (None or 0: never),
    EVAL_SPLIT, EVAL_BATCH_SIZE (None: BATCH_SIZE) and EVAL_NUM_EXAMPLES (None: all)."""

    split: str
    period: Optional[int] = None
    batch_size: Optional[int] = None
    num_examples: Optional[int] = None

    def __post_init__(self):
        check_text("EVAL_SPLIT", self.split)
        check_positive_int("EVAL_BATCH_SIZE", self.batch_size, optional=True)
        check_positive_int("EVAL_NUM_EXAMPLES", self.num_examples, optional=True)
        if self.period == 0:
            object.__setattr__(self, "period", None)
        if self.period is not None and (isinstance(self.period, bool) or
                                        not isinstance(self.period, int) or self.period < 0):
            raise ConfigError(f"EVAL_PERIOD must be a positive integer (or None for no "
                              f"evaluation during training), got {self.period!r}")


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


def _finite(values: Mapping[str, Any]) -> bool:
    """Loss, gradient norm and the updated parameters' norm all finite."""
    return all(math.isfinite(float(values[k])) for k in ("loss", "grad_norm", "param_norm")
               if k in values)


INITIAL_CHECKPOINT_STATES = ("params", "train_state")


def train(*, model, model_dir: str, train_steps: int, batch_size: int,
          task_feature_lengths: Mapping[str, int], mixture_or_task_name: str, optimizer,
          num_microbatches: int, initial_checkpoint_path: Optional[str],
          initial_checkpoint_state: str, random_seed: Optional[int],
          pack: bool, log_period: int, mesh: MeshSettings,
          checkpointing: checkpoints.CheckpointSettings, data_settings: DataSettings,
          inference_eval: InferenceEvalSettings, inference_evaluator: Optional[Callable],
          allow_changed_inputs: bool, watchdog: WatchdogSettings) -> Dict[str, float]:
    """Train `model` for `train_steps` optimizer steps; resume from MODEL_DIR if it holds
    a checkpoint. With `inference_eval.period`, decode its split of the task every that
    many steps and after the last. A resume whose vocabulary or data files differ from
    the checkpoint's refuses (DataError) unless `allow_changed_inputs`. Returns the last
    logged metrics (and the last inference-evaluation metrics, `<task>/<metric>`). Every
    keyword is bound by configs/runs/pretrain.gin, the one home of their defaults."""
    check_positive_int("TRAIN_STEPS", train_steps)
    check_feature_lengths(task_feature_lengths)
    check_text("MODEL_DIR", model_dir)
    check_text("MIXTURE_OR_TASK_NAME", mixture_or_task_name)
    check_text("INITIAL_CHECKPOINT_PATH", initial_checkpoint_path, optional=True)
    check_bool("PACK", pack)
    check_bool("ALLOW_CHANGED_INPUTS", allow_changed_inputs)
    check_positive_int("LOG_PERIOD", log_period)
    run_seed.check(random_seed)
    if initial_checkpoint_state not in INITIAL_CHECKPOINT_STATES:
        raise ConfigError(f"INITIAL_CHECKPOINT_STATE={initial_checkpoint_state!r}: use 'params' "
                          f"(the parameters only, step 0) or 'train_state' (a T5X run's step and "
                          f"Adafactor state too)")
    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    distributed.on_loss_say(lambda: _resume_from(model_dir))
    # with several processes the signals are agreed on from here: one that reaches some
    # of them while they start up must stop them all (after their first step) too
    preempt = Preemption() if jax.process_count() > 1 else None
    lock = None
    try:
        lock = hold(model_dir)
        random_seed = run_seed.resolve(random_seed, model_dir)  # None: drawn once, kept
        eval_period = inference_eval.period
        if eval_period and mixture_or_task_name == SYNTHETIC_TASK:
            raise ConfigError("EVAL_PERIOD: the 'synthetic' task has no metrics to evaluate; set "
                              "EVAL_PERIOD=None")
        if eval_period and inference_evaluator is None:
            raise ConfigError("EVAL_PERIOD is set but no inference evaluator is bound: set "
                              "train.inference_evaluator = @InferenceEvaluation (runs/pretrain.gin "
                              "does)")
        data = TrainData(mixture_or_task_name, task_feature_lengths, batch_size,
                         seed=random_seed, pack=pack, data_settings=data_settings)
        run = build_run(model=model, data=data, optimizer=optimizer,
                        num_microbatches=num_microbatches, mesh=mesh)
        step_fns = run.step_fns
        abstract = jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            step_fns.abstract_state, step_fns.state_shardings)
        ckpt = checkpoints.Checkpointer(model_dir, keep=checkpointing.keep,
                                        period=checkpointing.period,
                                        async_save=checkpointing.async_save)
        evaluator = None
        try:
            state, data_state, source = checkpoints.restore_or_init(
                ckpt, abstract, lambda: step_fns.init(jax.random.PRNGKey(random_seed)),
                initial_checkpoint_path=initial_checkpoint_path, model=model,
                initial_checkpoint_state=initial_checkpoint_state,
                factoring=getattr(optimizer, "factoring", None))
            if eval_period:
                evaluator = inference_evaluator(
                    model, run.partitioner, task_name=data.mixture_or_task_name,
                    feature_lengths=data.task_feature_lengths, batch_size=data.batch_size,
                    output_dir=str(model_dir), settings=inference_eval)
            if data_state:
                run.iterator.set_state(data_state, allow_changed_inputs=allow_changed_inputs)
        except BaseException:
            _close_all(ckpt.close, evaluator.close if evaluator is not None else None)
            raise
        step = int(jax.device_get(state.step))
        if step >= train_steps:
            ckpt.close()
            if evaluator is not None:
                evaluator.close()
            log.info("already complete: %s holds step %d and TRAIN_STEPS=%d; nothing to train "
                     "(raise TRAIN_STEPS to continue)", model_dir, step, train_steps)
            return {}
        # config.gin records how the saved state was trained: a new run writes it now, a
        # resumed one replaces it only when it saves (a restart that fails keeps the record)
        config_written = not (model_dir / "config.gin").exists()
        if config_written:
            _write_config(model_dir)
        log.info("start: %s at step %d; mesh %s; %d process(es)", source, step,
                 dict(run.partitioner.mesh.shape), jax.process_count())

        writer = metrics.MetricWriter(str(model_dir), jax.process_index(), log_every=log_period,
                                      total_steps=train_steps, subdir="train")
        progress = metrics.Progress(train_steps, initial=step, process_index=jax.process_index())
        preempt = preempt or Preemption()
        last: Dict[str, float] = {}
        t_start, start_step = time.perf_counter(), step
        dog = StepWatchdog(watchdog, model_dir, step, jax.process_index())
        reports = _Reports(run, writer, progress, lock, dog, ckpt, model_dir, step)
        length_cuts = getattr(run.iterator, "length_cuts", None)  # a task's, not synthetic's
        if length_cuts is not None and jax.process_index() == 0:
            cuts = length_cuts()  # one line: what TASK_FEATURE_LENGTHS cut, if anything
            if cuts is not None:
                writer.write_scalars(step, cuts.metrics())
        try:
            batch = run.next_batch()  # from here on each batch is fetched while a step runs
            while step < train_steps:
                state, step_metrics = step_fns.train_step(state, batch)
                step += 1
                dog.beat(step)
                stopping = preempt.after_step()  # read once: a signal from here on waits a step
                saving = ckpt.should_save(step) or step == train_steps or stopping
                evaluating = evaluator is not None and periods.due(step, eval_period, train_steps)
                if not saving:  # a save records the data position before the next batch
                    batch = run.next_batch()  # on the device while this step runs
                last = reports.read_late() or last  # the step before: its successor is queued
                if periods.due(step, log_period, train_steps):
                    if saving or evaluating:  # they wait for this step anyway
                        last = reports.log(step, reports.read(step, step_metrics))
                    else:
                        reports.later(step, step_metrics)
                elif saving:
                    reports.read(step, step_metrics)  # nothing non-finite is saved
                if saving:
                    if not config_written:
                        _write_config(model_dir)
                        config_written = True
                    with dog.during(f"the checkpoint save of step {step}", watchdog.save_seconds):
                        ckpt.save(step, state, run.iterator.get_state(), force=True)
                if evaluating:
                    with dog.during("the inference evaluation", None):
                        last = {**last, **evaluator(step, state.variables)}
                if stopping:
                    log.info("%s: saved step %d%s; exiting", stopping, step,
                             " on every process" if preempt.coordinated else "")
                    break
                if saving and step < train_steps:
                    batch = run.next_batch()
        finally:
            try:
                with dog.during("the last checkpoint save", watchdog.save_seconds):
                    _close_all(progress.close, ckpt.wait, ckpt.close, writer.close,
                               evaluator.close if evaluator is not None else None,
                               preempt.restore)  # last: a signal now only sets the flag
            finally:
                dog.stop()
        if step >= train_steps and step > start_step:
            log.info("done: steps %d-%d in %.0fs; checkpoints in %s, TensorBoard logs in %s "
                     "(tensorboard --logdir %s)", start_step + 1, step,
                     time.perf_counter() - t_start, model_dir / "checkpoints",
                     model_dir / "train", model_dir)
        return last
    except OutputWriteError as e:  # a full disk or a failed write: say what is kept
        raise type(e)(f"{e}; {_kept(model_dir)}") from None
    finally:
        if preempt is not None:
            preempt.restore()
        if lock is not None:
            lock.release()


class _Reports:
    """A step's metrics read back (the loop's one wait for the device), checked and logged:
    at once, or one step late (`later`, then `read_late` after the next step is
    dispatched), so that reading a logged step never holds up the step after it (MaxText
    writes its metrics one step late too). A non-finite loss stops the run unsaved."""

    def __init__(self, run, writer, progress, lock, dog, ckpt, model_dir: Path, step: int):
        self.run, self.writer, self.progress, self.lock = run, writer, progress, lock
        self.dog, self.ckpt, self.model_dir = dog, ckpt, model_dir
        self.device_kind = jax.devices()[0].device_kind
        self.late: Optional[tuple] = None
        self.t_last, self.last_logged = time.perf_counter(), step

    def read(self, step: int, step_metrics) -> Dict[str, float]:
        values = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        self.dog.beat(step, synced=True)  # the step has run: its time is known
        if not _finite(values):
            self.ckpt.wait()  # an async save in flight is part of what was kept
            good = self.ckpt.latest_step()
            kept = (f"The last good checkpoint is step {good} in {self.model_dir}"
                    if good is not None else f"No checkpoint was saved in {self.model_dir}")
            raise TrainingError(
                f"the loss or its gradient is not finite at step {step} (loss "
                f"{values.get('loss')}, grad norm {values.get('grad_norm')}); stopped "
                f"without saving it. {kept}. Lower the learning rate or check the data")
        return values

    def log(self, step: int, values: Dict[str, float]) -> Dict[str, float]:
        """TensorBoard, the log line and the throughput since the last logged step."""
        now = time.perf_counter()
        step_time = (now - self.t_last) / max(step - self.last_logged, 1)
        self.t_last, self.last_logged = now, step
        run = self.run
        values.update(metrics.throughput(step_time, run.batch_size, run.target_tokens,
                                         run.flops_per_example, jax.device_count(),
                                         self.device_kind))
        self.writer.write_scalars(step, values)
        self.writer.flush()  # on disk now: a crash must not lose the curve so far
        self.lock.touch()
        self.progress.update(step, values)
        return values

    def later(self, step: int, step_metrics) -> None:
        self.late = (step, step_metrics)

    def read_late(self) -> Optional[Dict[str, float]]:
        """The metrics put off by `later`, read and logged now (None when there are none)."""
        if self.late is None:
            return None
        step, step_metrics = self.late
        self.late = None
        return self.log(step, self.read(step, step_metrics))


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


def _close_all(*closers: Optional[Callable[[], Any]]) -> None:
    """Call each closer, even after one fails; raise the first failure unless an error
    is already on its way out (a full disk fails several closers: the first report wins)."""
    in_flight = sys.exc_info()[1] is not None
    first = None
    for close in closers:
        if close is None:
            continue
        try:
            close()
        except Exception as e:  # noqa: BLE001
            if first is None and not in_flight:
                first = e
            else:
                log.debug("while closing after an error: %s", e)
    if first is not None:
        raise first
