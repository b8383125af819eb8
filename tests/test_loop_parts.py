"""The training loop's per-step parts (t5lite/runtime/step_duties.py), each proven alone
with small fakes: no model, no jit. Each part owns its schedule (log, save, evaluate), the
NaN guard names the last good checkpoint, the plan beats the watchdog and reads a stop
signal once, the duties run in order and close in order, and the step loop
(`loop._run_steps`) fetches the next batch while a step runs, after a save, and stops
where a plan ends."""
import logging
import math
from types import SimpleNamespace

import pytest

from t5lite.errors import TrainingError
from t5lite.runtime import loop
from t5lite.runtime.checkpointing.start import Start
from t5lite.runtime.step_duties import (Evaluation, Reports, Saving, StepDuties, StepPlan,
                                        check_finite, log_step)

LAST = 10


class Dog:
    """The watchdog: beats and `during` blocks, into a shared event list."""

    def __init__(self, events):
        self.events = events

    def beat(self, step, synced=False):
        self.events.append(("synced beat" if synced else "beat", step))

    def during(self, what, limit):
        events = self.events

        class During:
            def __enter__(self):
                events.append(("during", what, limit))

            def __exit__(self, *exc):
                events.append(("end", what))
        return During()

    def stop(self):
        self.events.append(("dog.stop",))


class Ckpt:
    """A checkpointer whose period is `period`; a save in flight is committed by `wait`."""

    def __init__(self, events, period=4, committed=(), in_flight=None):
        self.events, self.period = events, period
        self.committed, self.in_flight = list(committed), in_flight

    def should_save(self, step):
        return step % self.period == 0

    def save(self, step, state, data_state, force=False):
        self.events.append(("save", step, state, data_state, force))

    def wait(self):
        self.events.append(("ckpt.wait",))
        if self.in_flight is not None:
            self.committed.append(self.in_flight)
            self.in_flight = None

    def close(self):
        self.events.append(("ckpt.close",))

    def latest_step(self):
        return self.committed[-1] if self.committed else None


class Writer:
    def __init__(self, events):
        self.events = events

    def write_scalars(self, step, values):
        self.events.append(("logged", step, values["loss"]))

    def flush(self):
        pass

    def close(self):
        self.events.append(("writer.close",))


class Progress:
    def __init__(self, events):
        self.events = events

    def update(self, step, values):
        pass

    def close(self):
        self.events.append(("progress.close",))


class Preempt:
    """A stop signal arriving after `signal_at`."""

    def __init__(self, events, signal_at=None):
        self.events, self.signal_at, self.steps = events, signal_at, 0
        self.coordinated = False

    def after_step(self):
        self.steps += 1
        self.events.append(("signal read", self.steps))
        return "SIGTERM" if self.steps == self.signal_at else None

    def restore(self):
        self.events.append(("preempt.restore",))


def _reports(events, ckpt=None, tmp_path="/runs/x"):
    run = SimpleNamespace(batch_size=8, target_tokens=8, flops_per_example=1.0)
    lock = SimpleNamespace(touch=lambda: None)
    return Reports(run, Writer(events), Progress(events), lock, Dog(events),
                   ckpt or Ckpt(events), tmp_path, 0, device_kind="cpu")


def _metrics(step):
    return {"loss": 1.0 / step, "grad_norm": 1.0}


# ----------------------------------------------------------------------------- save
def test_the_save_part_saves_on_its_period_the_last_step_and_a_stop_signal_only():
    saving = Saving(Ckpt([], period=4), lambda: None, Dog([]), 30.0, LAST)
    assert [s for s in range(1, LAST + 1) if saving.due(s, None)] == [4, 8, 10]
    assert saving.due(5, "SIGTERM") and saving.due(3, "Ctrl-C")
    assert not saving.due(5, None) and not saving.due(9, None)


def test_a_save_is_forced_under_the_save_limit_with_the_data_position_of_that_moment():
    events = []
    positions = iter([{"at": 1}, {"at": 2}])
    saving = Saving(Ckpt(events), lambda: events.append(("position",)) or next(positions),
                    Dog(events), 30.0, LAST, write_config=lambda: events.append(("config",)))
    saving.save(4, "state4")
    saving.save(8, "state8")
    assert events == [("config",),  # a resumed run's config.gin, before its first save only
                      ("during", "the checkpoint save of step 4", 30.0), ("position",),
                      ("save", 4, "state4", {"at": 1}, True),
                      ("end", "the checkpoint save of step 4"),
                      ("during", "the checkpoint save of step 8", 30.0), ("position",),
                      ("save", 8, "state8", {"at": 2}, True),
                      ("end", "the checkpoint save of step 8")]


# ----------------------------------------------------------------------------- evaluate
def test_the_evaluate_part_runs_on_eval_period_and_the_last_step():
    evaluation = Evaluation(lambda step, variables: {}, 3, LAST, Dog([]))
    assert [s for s in range(1, LAST + 1) if evaluation.due(s)] == [3, 6, 9, 10]
    assert not any(Evaluation(None, 3, LAST, Dog([])).due(s) for s in range(1, LAST + 1))
    assert not any(Evaluation(lambda *a: {}, None, LAST, Dog([])).due(s)
                   for s in range(1, LAST + 1))


def test_an_evaluation_adds_its_metrics_to_the_last_ones_with_no_watchdog_limit():
    events = []

    def evaluator(step, variables):
        events.append(("evaluate", step, variables))
        return {"mnli/accuracy": 80.0}

    evaluation = Evaluation(evaluator, 3, LAST, Dog(events))
    state = SimpleNamespace(variables="vars")
    assert evaluation.run(6, state, {"loss": 2.0}) == {"loss": 2.0, "mnli/accuracy": 80.0}
    assert events == [("during", "the evaluation", None), ("evaluate", 6, "vars"),
                      ("end", "the evaluation")]


# ----------------------------------------------------------------------------- log
def test_the_log_part_logs_one_step_late_except_a_saved_or_evaluated_step():
    events = []
    reports = _reports(events)
    done = []

    def after(step, **due):
        last = log_step(reports, StepPlan(step, **due), _metrics(step), {"kept": 1.0})
        done.append(events[:])
        events.clear()
        return last

    assert after(1) == {"kept": 1.0} and done[-1] == []  # not logged, not saved: not read
    assert after(2, logging=True) == {"kept": 1.0}
    assert done[-1] == []  # put off: read once the next step is queued
    last = after(3)  # step 2, read and logged now, at its own step
    assert done[-1] == [("synced beat", 2), ("logged", 2, 0.5)] and last["loss"] == 0.5
    last = after(4, logging=True, saving=True)  # the save waits for it: read at once
    assert done[-1] == [("synced beat", 4), ("logged", 4, 0.25)] and last["loss"] == 0.25
    assert after(5, saving=True) == {"kept": 1.0}  # read (nothing non-finite is saved)
    assert done[-1] == [("synced beat", 5)]  # but not logged
    last = after(6, logging=True, evaluating=True)
    assert done[-1] == [("synced beat", 6), ("logged", 6, 1 / 6)]
    assert reports.late is None


# ----------------------------------------------------------------------------- NaN guard
@pytest.mark.parametrize("key", ["loss", "grad_norm", "param_norm"])
def test_the_nan_guard_names_the_last_good_checkpoint_after_the_save_in_flight(key, tmp_path):
    events = []
    ckpt = Ckpt(events, committed=[2], in_flight=4)
    values = {"loss": 1.0, "grad_norm": 1.0, "param_norm": 1.0, key: math.nan}
    with pytest.raises(TrainingError) as e:
        check_finite(7, values, ckpt, tmp_path, Start("resume", step=4))
    assert str(e.value).startswith("the loss or its gradient is not finite at step 7")
    assert (f"stopped without saving it. The last saved checkpoint is step 4 in {tmp_path}; "
            f"this run started from MODEL_DIR's checkpoint 4. Causes: a checkpoint damaged on disk "
            f"(python -m t5lite.info --verify {tmp_path} checks them; a damaged one is skipped "
            f"at the next start), a learning rate too high, or bad data") in str(e.value)
    assert events == [("ckpt.wait",)]


def test_the_nan_guard_says_when_no_checkpoint_was_saved(tmp_path):
    with pytest.raises(TrainingError, match=f"No checkpoint was saved in {tmp_path}"):
        check_finite(1, {"loss": math.inf}, Ckpt([]), tmp_path)
    events = []
    check_finite(1, {"loss": 3.0, "grad_norm": 1e30}, Ckpt(events), tmp_path)  # finite: quiet
    assert events == []


def test_a_read_step_is_guarded_and_a_non_finite_one_is_never_logged(tmp_path):
    events = []
    reports = _reports(events, Ckpt(events), tmp_path)
    reports.later(5, {"loss": math.nan, "grad_norm": 1.0})
    with pytest.raises(TrainingError, match="not finite at step 5"):
        reports.read_late()
    assert events == [("synced beat", 5), ("ckpt.wait",)]


# ----------------------------------------------------------------------------- plan, order
def _duties(events, *, signal_at=None, log_period=2, eval_period=3, evaluator=True):
    dog = Dog(events)
    ckpt = Ckpt(events, period=4)

    def evaluate(step, variables):
        events.append(("evaluate", step))
        return {"task/metric": float(step)}

    return StepDuties(_reports(events, ckpt),
                      Saving(ckpt, lambda: {"position": True}, dog, 30.0, LAST),
                      Evaluation(evaluate if evaluator else None, eval_period, LAST, dog),
                      dog, Preempt(events, signal_at), Writer(events), Progress(events),
                      log_period, LAST)


def test_a_plan_beats_the_watchdog_then_reads_a_stop_signal_once():
    events = []
    duties = _duties(events, signal_at=5)
    plans = [duties.plan(s) for s in range(1, 7)]
    assert events == [e for s in range(1, 7) for e in (("beat", s), ("signal read", s))]
    assert [p.step for p in plans if p.logging] == [2, 4, 6]
    assert [p.step for p in plans if p.saving] == [4, 5]
    assert [p.step for p in plans if p.evaluating] == [3, 6]
    assert [p.step for p in plans if p.ends] == [5] and plans[4].stopping == "SIGTERM"
    assert duties.plan(LAST).ends and duties.plan(LAST).saving and duties.plan(LAST).last


def test_a_steps_duties_run_in_order_log_save_evaluate_then_the_stop_line(caplog):
    events = []
    duties = _duties(events)
    plan = StepPlan(6, logging=True, saving=True, evaluating=True, stopping="SIGTERM")
    state = SimpleNamespace(variables=None)
    with caplog.at_level(logging.INFO, logger="t5lite"):
        last = duties.after_step(plan, state, _metrics(6), {})
    assert [e[0] for e in events] == ["synced beat", "logged", "during", "save", "end",
                                      "during", "evaluate", "end"]
    assert last["loss"] == 1 / 6 and last["task/metric"] == 6.0
    assert "SIGTERM: saved step 6; exiting" in caplog.text


def test_closing_runs_every_closer_in_order_under_the_save_limit_then_stops_the_watchdog():
    events = []
    duties = _duties(events)
    duties.evaluation.evaluator.close = lambda: events.append(("evaluator.close",))

    def fails():
        events.append(("progress.close",))
        raise OSError("disk full")

    duties.progress.close = fails
    with pytest.raises(OSError, match="disk full"):  # the first failure, after all closed
        duties.close()
    assert events == [("during", "the last checkpoint save", 30.0), ("progress.close",),
                      ("ckpt.wait",), ("ckpt.close",), ("writer.close",), ("evaluator.close",),
                      ("preempt.restore",), ("end", "the last checkpoint save"), ("dog.stop",)]


# ----------------------------------------------------------------------------- the step loop
def _looped(signal_at=None, start=0):
    """The step loop over fake steps and batches with the real duties (LOG_PERIOD 5,
    CHECKPOINT_PERIOD 4, no evaluator), from step `start`: its steps, fetches, saves (with
    the data position) and logged steps, in order."""
    events = []
    calls = iter(range(1, 100))
    batches = iter(range(1, 100))

    def train_step(state, batch):
        events.append(("step", next(calls), batch))
        return SimpleNamespace(variables=None), _metrics(len(events))

    run = SimpleNamespace(step_fns=SimpleNamespace(train_step=train_step))
    run.next_batch = lambda: events.append(("batch",)) or next(batches)
    duties = _duties(events, signal_at=signal_at, log_period=5, evaluator=False)
    ctx = loop.RunContext(args=None, run=run, duties=duties, step=start, start_step=start)
    loop._run_steps(ctx)
    shown = {"step": lambda e: e, "batch": lambda e: e, "logged": lambda e: e[:2],
             "save": lambda e: e[:2] + e[3:4]}  # a save: its step and data position
    kept = [shown[e[0]](e) for e in events if e[0] in shown]
    return kept, ctx


def test_the_step_loop_fetches_while_a_step_runs_and_after_a_save_and_ends_at_the_last():
    events, ctx = _looped()
    assert ctx.step == LAST and "loss" in ctx.last
    expected = [("batch",)]
    for s in range(1, LAST + 1):
        expected.append(("step", s, s))  # step s runs on the s-th batch
        if s in (4, 8, LAST):  # saved: the data position recorded, then the next batch
            if s == LAST:
                expected.append(("logged", LAST))  # logged at once: it is saved
            expected.append(("save", s, {"position": True}))
            if s < LAST:
                expected.append(("batch",))
        else:
            expected.append(("batch",))  # fetched before anything waits for step s
            if s == 6:
                expected.append(("logged", 5))  # step 5, logged once step 6 is queued
    assert events == expected


def test_the_step_loop_stops_after_saving_the_step_a_signal_arrived_at(caplog):
    with caplog.at_level(logging.INFO, logger="t5lite"):
        events, ctx = _looped(signal_at=3, start=4)
    assert ctx.step == 7  # three steps from step 4: 5, 6, 7
    assert events == [("batch",), ("step", 1, 1), ("batch",), ("step", 2, 2), ("batch",),
                      ("logged", 5), ("step", 3, 3), ("save", 7, {"position": True})]
    assert "SIGTERM: saved step 7; exiting" in caplog.text
