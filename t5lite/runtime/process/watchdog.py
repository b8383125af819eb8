"""The step watchdog: a run whose processes are alive but make no progress (a hung
collective, a stuck host, a deadlock) ends instead of waiting forever.

    dog = StepWatchdog(settings, model_dir, step)     # a daemon thread, from here on
    dog.beat(step)                                    # after each step the loop runs
    with dog.during(f"the save of step {step}", settings.save_seconds): ckpt.save(...)
    with dog.during("inference evaluation", None): ...   # no limit
    dog.stop()

Steps are dispatched asynchronously, so the loop's beats come in bursts: a beat per
dispatched step, then a long wait where the loop reads the metrics back (every
LOG_PERIOD steps). A step's time is measured between those synchronising beats
(`beat(step, synced=True)`), after `warmup_steps` (compilation is not timed). From then on
the limit between two beats is max(factor x median step time x steps per sync,
floor_seconds); a save may take save_seconds. When a limit passes, every thread's Python
stack goes to MODEL_DIR/hang-<host>-<process>.txt, one `error:` line names the step, the
limit and that file, and the process exits with EXIT_HUNG (3) at once: the operator's
scheduler restarts the job, which resumes from the last committed checkpoint.

Fault injection (documented, for tests and drills): `stall` = "PROCESS:STEP:SECONDS"
makes process PROCESS sleep SECONDS inside the loop right after dispatching step STEP.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import os
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional

from t5lite.errors import ConfigError, check_bool
from t5lite.runtime.process import distributed

EXIT_HUNG = 3


@dataclasses.dataclass(frozen=True)
class WatchdogSettings:
    """STEP_WATCHDOG (on / off), WATCHDOG_FACTOR, WATCHDOG_FLOOR_SECONDS,
    WATCHDOG_WARMUP_STEPS, WATCHDOG_SAVE_SECONDS and the fault injection
    INJECT_STALL ("PROCESS:STEP:SECONDS" or None); defaults in configs/runs/pretrain.gin."""

    enabled: bool
    factor: float
    floor_seconds: float
    warmup_steps: int
    save_seconds: float
    stall: Optional[str] = None

    def __post_init__(self):
        check_bool("STEP_WATCHDOG", self.enabled)
        for name, value in (("WATCHDOG_FACTOR", self.factor),
                            ("WATCHDOG_FLOOR_SECONDS", self.floor_seconds),
                            ("WATCHDOG_SAVE_SECONDS", self.save_seconds)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 1:
            raise ConfigError(f"WATCHDOG_WARMUP_STEPS must be a positive integer, got "
                              f"{self.warmup_steps!r}")
        self.stall_plan()  # checks the form

    def stall_plan(self):
        """(process, step, seconds) of the injected stall, or None."""
        if self.stall is None:
            return None
        try:
            process, step, seconds = str(self.stall).split(":")
            return int(process), int(step), float(seconds)
        except ValueError:
            raise ConfigError(f"INJECT_STALL={self.stall!r}: write 'PROCESS:STEP:SECONDS', "
                              f"e.g. '1:20:600'") from None


class StepWatchdog:
    """See the module docstring. `clock` and `on_hang` are for tests."""

    def __init__(self, settings: WatchdogSettings, model_dir: Path, step: int,
                 process_index: int = 0, clock: Callable[[], float] = time.monotonic,
                 on_hang: Optional[Callable[[str], None]] = None):
        self.settings = settings
        self.model_dir = Path(model_dir)
        self.process_index = process_index
        self._clock = clock
        self._on_hang = on_hang or _exit_hung
        self._lock = threading.Condition()
        self._first_step = step
        self._last_beat = clock()
        self._last_step = step
        self._last_sync: Optional[tuple] = None  # (time, step) of the last synchronising beat
        self._step_times: List[float] = []
        self._steps_per_sync = 1
        self._during: Optional[tuple] = None  # (what, limit or None)
        self._stopped = False
        self._stall = settings.stall_plan()
        self._thread = None
        if settings.enabled:
            self._thread = threading.Thread(target=self._watch, name="t5lite-watchdog",
                                            daemon=True)
            self._thread.start()

    # -- the loop's side -------------------------------------------------------------
    def beat(self, step: int, synced: bool = False) -> None:
        now = self._clock()
        with self._lock:
            if synced:
                if self._last_sync is not None and step > self._last_sync[1] and \
                        self._last_sync[1] - self._first_step >= self.settings.warmup_steps:
                    per = (now - self._last_sync[0]) / (step - self._last_sync[1])
                    self._step_times.append(per)
                    self._steps_per_sync = max(self._steps_per_sync, step - self._last_sync[1])
                self._last_sync = (now, step)
            self._last_beat, self._last_step = now, step
            self._lock.notify_all()
        if self._stall and self._stall[0] == self.process_index and self._stall[1] == step:
            os.write(2, f"INJECT_STALL: process {self.process_index} sleeps {self._stall[2]:g}s "
                        f"after step {step}\n".encode())
            time.sleep(self._stall[2])  # INJECT_STALL: a stuck host, on purpose

    def during(self, what: str, limit: Optional[float]):
        """A context in which `limit` seconds (None: no limit) replace the step limit."""
        return _During(self, what, limit)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the watching side -------------------------------------------------------------
    def step_limit(self) -> Optional[float]:
        """Seconds allowed between two beats, None while the step time is unknown."""
        if not self._step_times:
            return None
        median = statistics.median(self._step_times)
        return max(self.settings.factor * median * self._steps_per_sync,
                   self.settings.floor_seconds)

    def overdue(self) -> Optional[str]:
        """What has taken too long (one line), or None."""
        with self._lock:
            waited = self._clock() - self._last_beat
            if self._during is not None:
                what, limit = self._during
                if limit is not None and waited > limit:
                    return f"{what} has not finished in {waited:.0f}s (limit {limit:g}s)"
                return None
            limit = self.step_limit()
            if limit is not None and waited > limit:
                return (f"no step has completed for {waited:.0f}s after step {self._last_step} "
                        f"(limit {limit:.0f}s: {self.settings.factor:g} x the median step time "
                        f"{statistics.median(self._step_times):.3g}s x {self._steps_per_sync} "
                        f"steps per log, at least WATCHDOG_FLOOR_SECONDS="
                        f"{self.settings.floor_seconds:g})")
            return None

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                self._lock.wait(timeout=1.0)
                if self._stopped:
                    return
            what = self.overdue()
            if what is not None:
                self._on_hang(self._report(what))
                return

    def _report(self, what: str) -> str:
        host = socket.gethostname()
        path = self.model_dir / f"hang-{host}-{self.process_index}.txt"
        try:
            self.model_dir.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as f:
                f.write(f"t5lite step watchdog, process {self.process_index} on {host}: "
                        f"{what}\n\n")
                f.flush()
                faulthandler.dump_traceback(f, all_threads=True)
            where = f"every thread's stack is in {path}"
        except OSError as e:
            where = f"the stacks could not be written to {path} ({e})"
        return (f"error: process {self.process_index} on {host} is hung: {what}; {where}. "
                f"Exiting with status {EXIT_HUNG}; run the same command to resume from the "
                f"last checkpoint (STEP_WATCHDOG=False turns this off)")


class _During:
    def __init__(self, dog: StepWatchdog, what: str, limit: Optional[float]):
        self.dog, self.what, self.limit = dog, what, limit

    def __enter__(self):
        with self.dog._lock:
            self.dog._during = (self.what, self.limit)
            self.dog._last_beat = self.dog._clock()

    def __exit__(self, *exc):
        with self.dog._lock:
            self.dog._during = None
            self.dog._last_beat = self.dog._clock()


def _exit_hung(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode())
    finally:
        try:
            distributed.leave(EXIT_HUNG)  # the other processes learn it now
        finally:
            os._exit(EXIT_HUNG)
