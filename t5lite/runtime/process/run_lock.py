"""One training run per MODEL_DIR (one `infer` per OUTPUT_DIR): a lock file that a
second run refuses to share.

    MODEL_DIR/RUN_LOCK    {"host": ..., "pid": ..., "since": "2026-11-24 20:31:05 UTC",
                           "processes": 8}

    lock = hold(model_dir)                                  # every process calls it
    lock = hold(output_dir, setting="OUTPUT_DIR", what="infer run")
    ...
    lock.release()

A run's process 0 creates the file atomically (O_EXCL) before anything is built and
removes it when the run ends; every process of a multi-process run learns the outcome
from process 0, so a run holds the lock once. A run that finds the file:
- held by a live process (same host: the pid exists; another host: the file was touched
  within STALE_AFTER_S, the holder touches it at every log line) refuses with one line
  naming host, pid and start time;
- left by a dead run (its pid is gone, or untouched for STALE_AFTER_S on another host)
  takes it over with a warning.
Cost: one small file write at the start, and a touch per log line.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Optional

from t5lite.errors import ConfigError
from t5lite.runtime.process import disk_space

log = logging.getLogger(__name__)

LOCK_NAME = "RUN_LOCK"
STALE_AFTER_S = 15 * 60


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _describe(holder: dict) -> str:
    return (f"host {holder.get('host')}, pid {holder.get('pid')}, since "
            f"{holder.get('since')}")


class RunLock:
    """The lock of `model_dir`, taken by `acquire()` (process 0) and dropped by
    `release()`; `touch()` marks it alive."""

    def __init__(self, model_dir: Path, processes: int = 1, setting: str = "MODEL_DIR",
                 what: str = "training run"):
        self.path = Path(model_dir) / LOCK_NAME
        self.processes = processes
        self.setting, self.what = setting, what
        self.held = False
        self._made: list = []  # directories acquire() created, deepest first

    def _record(self) -> dict:
        now = datetime.datetime.now(datetime.timezone.utc)
        return {"host": socket.gethostname(), "pid": os.getpid(),
                "since": now.strftime("%Y-%m-%d %H:%M:%S UTC"), "processes": self.processes}

    def _read(self) -> Optional[dict]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # half written by a run that died at its start
            return {}

    def _stale(self, holder: dict) -> bool:
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            return not _alive(holder["pid"])
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return True
        return age > STALE_AFTER_S

    def acquire(self) -> None:
        """Take the lock, or raise ConfigError naming the live run that holds it."""
        missing, parent = [], self.path.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._made = missing
        for _ in range(3):  # a race with another starting run: try again, then decide
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read()
                if holder is None:
                    continue  # released meanwhile
                if holder and not self._stale(holder):
                    raise ConfigError(
                        f"{self.setting} {self.path.parent} is in use by a running {self.what} "
                        f"({_describe(holder)}): wait for it or stop it, or use another "
                        f"{self.setting} (if that run is dead, delete {self.path})")
                log.warning("taking over the lock of a run that is no longer running (%s) "
                            "in %s", _describe(holder) if holder else "unreadable lock file",
                            self.path.parent)
                self.path.unlink(missing_ok=True)
                continue
            try:
                with disk_space.writing("the run lock", self.path.parent), \
                        os.fdopen(fd, "w") as f:
                    json.dump(self._record(), f)
            except BaseException:  # no half-written lock left for the next run to read
                self.path.unlink(missing_ok=True)
                self.release()
                raise
            self.held = True
            return
        raise ConfigError(f"could not take the lock {self.path}: another run keeps taking "
                          f"it; use another {self.setting}")

    def touch(self) -> None:
        if self.held:
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        """Remove the lock if this process holds it, and the directories acquire() made
        if nothing else was written there (a run refused at its start leaves no trace)."""
        if self.held:
            self.held = False
            try:
                holder = self._read()
                if holder and holder.get("pid") == os.getpid():
                    self.path.unlink()
            except OSError:
                pass
        for directory in self._made:
            try:
                directory.rmdir()  # only when empty
            except OSError:
                break
        self._made = []


def hold(directory: Path, setting: str = "MODEL_DIR", what: str = "training run") -> RunLock:
    """`directory`'s lock, taken by process 0 for the whole run; every process raises
    when another live run holds it (call it on every process)."""
    import jax
    from t5lite.runtime.process.agreement import process_0_decides

    lock = RunLock(directory, jax.process_count(), setting, what)
    process_0_decides(lock.acquire, lambda: ConfigError(
        f"{setting} {directory}: process 0 could not take its run lock (its error line "
        f"says why: another live run, or a failed write)"))
    return lock
