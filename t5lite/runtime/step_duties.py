"""What the training loop does after each step, in small parts that each own their
schedule (t5lite.runtime.loop runs them; tests/test_loop_parts.py proves each alone).

    plan = duties.plan(step)   the watchdog's beat; a stop signal read once; what is due:
                                 log       every LOG_PERIOD steps and the last
                                 save      every CHECKPOINT_PERIOD, the last, a stop signal
                                 evaluate  every EVAL_PERIOD and the last (with an evaluator)
    (the loop fetches the next batch here, unless the step is saved: a save records the
    data position first)
    duties.after_step(plan, state, metrics, last), in this order:
      log_step     the step before's put-off metrics read and logged (its successor is
                   queued); this step's put off a step (`Reports.later`), or read at once
                   when it is saved or evaluated (those wait for it anyway)
      Reports.read the one wait for the device; the watchdog's synced beat; the NaN guard
                   (`check_finite`: a non-finite loss stops the run, unsaved)
      SkipWatch    with SKIP_BAD_STEPS: the step before's skip counters, a line per skipped
                   step, a stop after MAX_SKIPPED_IN_A_ROW (runtime/skipped_steps.py)
      Saving       state + data position (async, under the watchdog's save limit);
                   config.gin first when the run has not written it
      Evaluation   the inference evaluator's metrics, added to the last logged ones
      say_stopped  a stop signal's step saved: the line, then the loop ends
    duties.close()             everything closed in order (each even after one fails),
                               the signal handlers given back last, the watchdog stopped

A plan `ends` at TRAIN_STEPS or on a stop signal: the loop's one exit, both saved.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Protocol

import jax

from t5lite.errors import TrainingError
from t5lite.runtime import metrics, periods
from t5lite.runtime.checkpointing.start import FRESH, Start

log = logging.getLogger(__name__)


class EvalPeriod(Protocol):
    """What the loop reads of the evaluation settings it is given: `period` (None: no
    evaluation). The class, InferenceEvalSettings, lives in t5lite.inference.train_eval,
    which the runtime may not import; the loop passes the object on to the evaluator."""

    period: Optional[int]


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """What a step just queued is due for, decided once (`StepDuties.plan`)."""

    step: int
    logging: bool = False
    saving: bool = False
    evaluating: bool = False
    stopping: Optional[str] = None  # a stop signal's name: this step is saved, then exit
    last: bool = False  # the step is TRAIN_STEPS

    @property
    def ends(self) -> bool:
        """The run's last step: TRAIN_STEPS or a stop signal (saved either way)."""
        return self.last or bool(self.stopping)


def finite(values: Mapping[str, Any]) -> bool:
    """Loss, gradient norm and the updated parameters' norm all finite; of a step the
    optimizer skipped (SKIP_BAD_STEPS: it changed nothing), the parameters' norm alone."""
    keys = ("param_norm",) if values.get("skipped") else ("loss", "grad_norm", "param_norm")
    return all(math.isfinite(float(values[k])) for k in keys if k in values)


def check_finite(step: int, values: Mapping[str, float], ckpt, model_dir: Path,
                 source: Start = FRESH) -> None:
    """The NaN guard: TrainingError when `step`'s loss, gradient norm or parameter norm is
    not finite, naming the last good checkpoint (a save in flight is waited for first:
    it is part of what was kept), what the run started from (`source`), and the causes:
    a checkpoint damaged on disk (with the command that checks them) among them."""
    if finite(values):
        return
    ckpt.wait()
    good = ckpt.latest_step()
    kept = (f"The last saved checkpoint is step {good} in {model_dir}"
            if good is not None else f"No checkpoint was saved in {model_dir}")
    raise TrainingError(
        f"the loss or its gradient is not finite at step {step} (loss "
        f"{values.get('loss')}, grad norm {values.get('grad_norm')}); stopped "
        f"without saving it. {kept}; this run started from {source.in_words()}. "
        f"Causes: a checkpoint damaged on disk (python -m t5lite.info --verify {model_dir} "
        f"checks them; a damaged one is skipped at the next start), a learning rate too "
        f"high, or bad data (SKIP_BAD_STEPS=True skips such steps)")


DROPPED_SHARE_WARNING = 0.1  # the share of routed choices dropped that warns (once)


class DropWarning:
    """One warning, the first time a logged step's mixture-of-experts layers drop more
    than `share` of their tokens' expert choices (`moe/dropped_fraction`)."""

    def __init__(self, share: float = DROPPED_SHARE_WARNING):
        self.share, self.warned = share, False

    def check(self, step: int, values: Mapping[str, float]) -> None:
        dropped = values.get("moe/dropped_fraction")
        if self.warned or dropped is None or not dropped > self.share:
            return
        self.warned = True
        log.warning("step %d: the mixture-of-experts layers dropped %.1f%% of their tokens' "
                    "expert choices (more than %.0f%%; those go on through the residual "
                    "alone): raise CAPACITY_FACTOR, or use ROUTING='dropless' (warned once)",
                    step, 100 * dropped, 100 * self.share)


class Reports:
    """A step's metrics read back (the loop's one wait for the device), checked and logged:
    at once, or one step late (`later`, then `read_late` after the next step is
    dispatched), so that reading a logged step never holds up the step after it (MaxText
    writes its metrics one step late too)."""

    def __init__(self, run, writer, progress, lock, dog, ckpt, model_dir: Path, step: int,
                 device_kind: Optional[str] = None, source: Start = FRESH):
        self.run, self.writer, self.progress, self.lock = run, writer, progress, lock
        self.dog, self.ckpt, self.model_dir, self.source = dog, ckpt, model_dir, source
        self.device_kind = device_kind or jax.devices()[0].device_kind
        self.late: Optional[tuple] = None
        self.t_last, self.last_logged = time.perf_counter(), step
        self.drops = DropWarning()
        # a blend's rows of each source (t5lite/data/blend.py), from the data position:
        # the batches of steps before `step` are the iterator's `position` so far
        iterator = getattr(run, "iterator", None)
        self.source_rows = getattr(iterator, "source_rows", None)
        self.position_at_start = step - getattr(iterator, "position", step)

    def read(self, step: int, step_metrics) -> Dict[str, float]:
        values = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        self.dog.beat(step, synced=True)  # the step has run: its time is known
        check_finite(step, values, self.ckpt, self.model_dir, self.source)
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
        if self.source_rows is not None:  # TensorBoard only: not on the progress line
            rows = self.source_rows(step - self.position_at_start)
            if rows:
                self.writer.write_scalars(step, {f"data/rows/{k}": float(v)
                                                 for k, v in rows.items()})
        self.writer.flush()  # on disk now: a crash must not lose the curve so far
        self.drops.check(step, values)
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


def log_step(reports: Reports, plan: StepPlan, step_metrics,
             last: Dict[str, float]) -> Dict[str, float]:
    """The log part, once the next step is queued: the step before's put-off metrics first;
    then a logged step's put off a step, or read and logged at once when it is saved or
    evaluated; a saved step that is not logged is read all the same (nothing non-finite is
    saved). Returns the last logged metrics."""
    last = reports.read_late() or last  # the step before: its successor is queued
    if plan.logging:
        if plan.saving or plan.evaluating:  # they wait for this step anyway
            return reports.log(plan.step, reports.read(plan.step, step_metrics))
        reports.later(plan.step, step_metrics)
    elif plan.saving:
        reports.read(plan.step, step_metrics)
    return last


class Saving:
    """The save part: state + data position every CHECKPOINT_PERIOD (`ckpt.should_save`),
    at the last step and on a stop signal, forced; under the watchdog's save limit. Before
    the first save, `write_config` (None: config.gin was written at the start)."""

    def __init__(self, ckpt, data_position: Callable[[], Any], dog,
                 save_seconds: Optional[float], last_step: int,
                 write_config: Optional[Callable[[], None]] = None):
        self.ckpt, self.data_position, self.dog = ckpt, data_position, dog
        self.save_seconds, self.last_step, self.write_config = save_seconds, last_step, \
            write_config

    def due(self, step: int, stopping: Optional[str]) -> bool:
        return bool(self.ckpt.should_save(step) or step == self.last_step or stopping)

    def save(self, step: int, state) -> None:
        if self.write_config is not None:  # a resumed run's record, replaced once it saves
            self.write_config()
            self.write_config = None
        with self.dog.during(f"the checkpoint save of step {step}", self.save_seconds):
            self.ckpt.save(step, state, self.data_position(), force=True)


class Evaluation:
    """The evaluate part: `evaluator(step, variables)` every EVAL_PERIOD steps and at the
    last (never without an evaluator), under the watchdog with no limit; its metrics join
    the last logged ones."""

    def __init__(self, evaluator: Optional[Callable], period: Optional[int], last_step: int,
                 dog):
        self.evaluator, self.period, self.last_step, self.dog = evaluator, period, \
            last_step, dog

    def due(self, step: int) -> bool:
        return self.evaluator is not None and periods.due(step, self.period, self.last_step)

    def run(self, step: int, state, last: Dict[str, float]) -> Dict[str, float]:
        with self.dog.during("the evaluation", None):
            return {**last, **self.evaluator(step, state.variables)}


def say_stopped(plan: StepPlan, coordinated: bool) -> None:
    """The stop part's line: a stop signal's step is saved; the loop ends after it."""
    log.info("%s: saved step %d%s; exiting", plan.stopping, plan.step,
             " on every process" if coordinated else "")


@dataclasses.dataclass
class StepDuties:
    """The parts put together for one run: `plan` then `after_step` once a step, `close`
    at the end."""

    reports: Reports
    saving: Saving
    evaluation: Evaluation
    dog: Any  # StepWatchdog
    preempt: Any  # Preemption
    writer: Any  # metrics.MetricWriter
    progress: Any  # metrics.Progress
    log_period: int
    last_step: int
    skips: Optional[Any] = None  # skipped_steps.SkipWatch, with SKIP_BAD_STEPS

    def plan(self, step: int) -> StepPlan:
        """The watchdog's beat for a step just queued, then what the step is due for."""
        self.dog.beat(step)
        stopping = self.preempt.after_step()  # read once: a signal from here on waits a step
        return StepPlan(step, logging=periods.due(step, self.log_period, self.last_step),
                        saving=self.saving.due(step, stopping),
                        evaluating=self.evaluation.due(step), stopping=stopping,
                        last=step == self.last_step)

    def after_step(self, plan: StepPlan, state, step_metrics,
                   last: Dict[str, float]) -> Dict[str, float]:
        """The step's duties in order: log, save, evaluate, the stop line. Returns the last
        metrics (logged, and evaluated)."""
        last = log_step(self.reports, plan, step_metrics, last)
        if self.skips is not None:
            self.skips.after_step(plan.step, step_metrics, plan.ends)
        if plan.saving:
            self.saving.save(plan.step, state)
        if plan.evaluating:
            last = self.evaluation.run(plan.step, state, last)
        if plan.stopping:
            say_stopped(plan, self.preempt.coordinated)
        return last

    def close(self) -> None:
        """Progress, the checkpointer (its last async save committed), the writer, the
        evaluator, then the signal handlers (last: a signal now only sets the flag), each
        even after one fails, under the watchdog's save limit; then the watchdog stops."""
        ckpt, evaluator = self.saving.ckpt, self.evaluation.evaluator
        try:
            with self.dog.during("the last checkpoint save", self.saving.save_seconds):
                close_all(self.progress.close, ckpt.wait, ckpt.close, self.writer.close,
                          evaluator.close if evaluator is not None else None,
                          self.preempt.restore)
        finally:
            self.dog.stop()


def close_all(*closers: Optional[Callable[[], Any]]) -> None:
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
