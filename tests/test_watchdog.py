"""The step watchdog (issue 28, part 2): its limits on a hand-driven clock, the report it
leaves (every thread's stack in MODEL_DIR/hang-<host>-<process>.txt, one line), its
settings, and a real run stalled by INJECT_STALL ending with status 3 and resuming."""
from __future__ import annotations

import socket
import time

import pytest

from t5lite.errors import ConfigError
from t5lite.runtime.process.watchdog import EXIT_HUNG, StepWatchdog, WatchdogSettings

import model_helpers as mh
import train_helpers as th

# the real runs' model: the tiny T5 cut to one layer a side, a 512-entry vocabulary
SMALL_MODEL = tuple(mh.small_flags())


def _settings(**kw):
    base = dict(enabled=False, factor=4.0, floor_seconds=10.0, warmup_steps=2,
                save_seconds=30.0, stall=None)
    base.update(kw)
    return WatchdogSettings(**base)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_step_limit_is_factor_times_the_median_step_after_warmup(tmp_path):
    clock = Clock()
    dog = StepWatchdog(_settings(), tmp_path, step=0, clock=clock)
    # step 1 compiles (60 s), then a log every 5 steps of 2 s each: beats come in bursts
    for step, t, synced in [(1, 160, True), (2, 160.1, False), (5, 170, True),
                            (10, 180, True), (15, 191, True), (20, 201, True)]:
        clock.now = t
        dog.beat(step, synced=synced)
    # timed from the first sync after warmup (step 5): 2.0, 2.2, 2.0 s a step
    assert dog.step_limit() == pytest.approx(4.0 * 2.0 * 5)
    clock.now = 201 + 39
    assert dog.overdue() is None
    clock.now = 201 + 41
    line = dog.overdue()
    assert "no step has completed for 41s after step 20" in line and "limit 40s" in line
    # the floor holds for fast steps; a save and an evaluation have their own limits
    fast = StepWatchdog(_settings(), tmp_path, step=0, clock=clock)
    for step in range(1, 12):
        clock.now += 0.01
        fast.beat(step, synced=True)
    assert fast.step_limit() == 10.0
    with fast.during("the checkpoint save of step 11", 30.0):
        clock.now += 29
        assert fast.overdue() is None
        clock.now += 2
        assert "the checkpoint save of step 11 has not finished in 31s" in fast.overdue()
    clock.now += 5
    assert fast.overdue() is None  # the save ended: its end is the last sign of life
    with fast.during("the inference evaluation", None):
        clock.now += 10_000
        assert fast.overdue() is None


def test_no_limit_before_the_step_time_is_known(tmp_path):
    clock = Clock()
    dog = StepWatchdog(_settings(warmup_steps=3), tmp_path, step=100, clock=clock)
    for step, t in [(101, 200), (102, 210), (103, 220)]:  # a resumed run's first steps
        clock.now = t
        dog.beat(step, synced=True)
    clock.now += 10_000
    assert dog.step_limit() is None and dog.overdue() is None


def test_a_hang_leaves_every_stack_and_one_line(tmp_path):
    reports = []
    clock = Clock()
    dog = StepWatchdog(_settings(enabled=True, floor_seconds=1.0), tmp_path / "run", step=0,
                       process_index=1, clock=clock, on_hang=reports.append)
    for step in range(1, 6):
        clock.now += 0.1
        dog.beat(step, synced=True)
    clock.now += 100  # the thread checks once a second
    deadline = time.monotonic() + 10
    while not reports and time.monotonic() < deadline:
        time.sleep(0.1)
    dog.stop()
    assert len(reports) == 1
    line = reports[0]
    path = tmp_path / "run" / f"hang-{socket.gethostname()}-1.txt"
    assert line.startswith("error: process 1 on") and str(path) in line and "\n" not in line
    assert f"status {EXIT_HUNG}" in line and "after step 5" in line
    text = path.read_text()
    assert "after step 5" in text and "t5lite-watchdog" not in text.split("\n")[0]
    assert "Thread 0x" in text or "Current thread" in text  # faulthandler's dump
    assert "test_watchdog.py" in text  # the main thread's stack: where it waited


def test_the_injected_stall_sleeps_in_its_process_and_step(tmp_path):
    dog = StepWatchdog(_settings(stall="1:3:0.5"), tmp_path, step=0, process_index=1)
    t = time.monotonic()
    dog.beat(2)
    assert time.monotonic() - t < 0.3
    dog.beat(3)
    assert time.monotonic() - t >= 0.5
    other = StepWatchdog(_settings(stall="1:3:0.5"), tmp_path, step=0, process_index=0)
    t = time.monotonic()
    other.beat(3)
    assert time.monotonic() - t < 0.3


@pytest.mark.parametrize("field,value,needle", [
    ("factor", 0, "WATCHDOG_FACTOR"), ("floor_seconds", -1, "WATCHDOG_FLOOR_SECONDS"),
    ("save_seconds", "x", "WATCHDOG_SAVE_SECONDS"), ("warmup_steps", 0, "WATCHDOG_WARMUP_STEPS"),
    ("stall", "1:2", "INJECT_STALL"),
])
def test_bad_settings_are_one_line(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        _settings(**{field: value})


def test_a_stalled_run_ends_with_status_3_and_resumes(tmp_path):
    """One process stalled (INJECT_STALL) past the floor: status 3, the hang file, the
    checkpoint before it kept; the same command without the stall resumes and finishes
    with the parameters of an uninterrupted run."""
    stall = [*SMALL_MODEL, "--gin.CHECKPOINT_PERIOD=4", "--gin.LOG_PERIOD=1",
             "--gin.WATCHDOG_FLOOR_SECONDS=3",
             "--gin.WATCHDOG_WARMUP_STEPS=1", "--gin.INJECT_STALL='0:6:600'"]
    t = time.monotonic()
    proc = th.run_train(tmp_path / "run", *stall, steps=8)
    took = time.monotonic() - t
    line = th.assert_one_error(proc, "is hung", "after step 6", "hang-")
    assert proc.returncode == EXIT_HUNG, line
    assert took < 120, took
    assert th.complete_steps(tmp_path / "run") == [4]
    assert (tmp_path / "run" / f"hang-{socket.gethostname()}-0.txt").exists()
    # the resume and the uninterrupted run one after the other in one interpreter
    resumed, whole = th.run_mains([
        th.train_command(tmp_path / name, *SMALL_MODEL, "--gin.CHECKPOINT_PERIOD=4",
                         "--gin.LOG_PERIOD=1", steps=8)[3:] for name in ("run", "whole")])
    assert resumed.returncode == 0, th.describe(resumed)
    assert "start: resume:4 at step 4" in resumed.stderr, resumed.stderr[-3000:]
    assert whole.returncode == 0, th.describe(whole)
    th.assert_trees_equal(th.load_state(tmp_path / "run", 8)["params"],
                          th.load_state(tmp_path / "whole", 8)["params"], "params")
