"""One training run per MODEL_DIR (t5lite/runtime/process/run_lock.py): a second run on a
MODEL_DIR that a live run uses refuses in one line naming it and changes nothing; a lock
left by a dead run is taken over with a warning; the lock goes when the run ends."""
import json
import signal
import socket
import subprocess
import sys

import pytest

import model_helpers as mh
import train_helpers as th
from t5lite.errors import ConfigError
from t5lite.runtime.process import run_lock

# the runs' model: the tiny T5 cut to one layer a side, a 512-entry vocabulary
SMALL_MODEL = tuple(mh.small_flags())


def test_a_second_run_on_a_live_model_dir_refuses_and_the_first_finishes(tmp_path):
    model_dir, log = tmp_path / "run", tmp_path / "first.log"
    steps = 30
    cmd = th.train_command(model_dir, *SMALL_MODEL, "--gin.LOG_PERIOD=1",
                           "--gin.CHECKPOINT_PERIOD=20",
                           "--gin.KEEP_CHECKPOINTS=None", steps=steps)
    first = th.start(cmd, log)
    try:
        th.wait_for(lambda: th.logged_steps(th.read_log(log)), "the first run's first step",
                    proc=first, log_path=log)
        holder = json.loads((model_dir / run_lock.LOCK_NAME).read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
        first.send_signal(signal.SIGSTOP)  # paused (alive) while the second one tries
        saved = th.complete_steps(model_dir)
        try:
            second = th.run(cmd)
        finally:
            first.send_signal(signal.SIGCONT)
        assert second.returncode == 2, th.describe(second)
        line = th.assert_one_error(second, "is in use by a running training run",
                                   f"pid {first.pid}", socket.gethostname(), holder["since"])
        assert str(model_dir) in line
        assert "Traceback" not in second.stderr
        assert set(saved) <= set(th.complete_steps(model_dir))  # nothing removed
        assert th.finish(first) == 0, th.tail(th.read_log(log))
    finally:
        th.kill(first)
    assert th.logged_steps(th.read_log(log)) == list(range(1, steps + 1))
    assert not (model_dir / run_lock.LOCK_NAME).exists()  # released at the end


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_a_lock_left_by_a_dead_run_is_taken_over_with_a_warning(tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    pid = _dead_pid()
    (model_dir / run_lock.LOCK_NAME).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": pid, "since": "2026-01-01 00:00:00 UTC",
         "processes": 1}))
    proc = th.run_train(model_dir, *SMALL_MODEL, steps=2)
    assert proc.returncode == 0, th.describe(proc)
    assert "taking over the lock of a run that is no longer running" in proc.stderr
    assert f"pid {pid}" in proc.stderr
    assert th.complete_steps(model_dir) == [2]
    assert not (model_dir / run_lock.LOCK_NAME).exists()


def test_lock_rules(tmp_path, monkeypatch):
    here = socket.gethostname()
    lock = run_lock.RunLock(tmp_path / "a")
    lock.acquire()
    assert json.loads(lock.path.read_text())["pid"] == run_lock.os.getpid()
    with pytest.raises(ConfigError, match="is in use by a running training run"):
        run_lock.RunLock(tmp_path / "a").acquire()  # this very process is alive
    lock.release()
    assert not lock.path.exists()
    # another host: alive while touched within STALE_AFTER_S, stale after
    other = run_lock.RunLock(tmp_path / "b")
    other.path.parent.mkdir()
    other.path.write_text(json.dumps({"host": here + "-elsewhere", "pid": 1, "since": "x"}))
    with pytest.raises(ConfigError, match="elsewhere"):
        other.acquire()
    old = run_lock.time.time() - run_lock.STALE_AFTER_S - 5
    run_lock.os.utime(other.path, (old, old))
    other.acquire()
    assert json.loads(other.path.read_text())["host"] == here
    other.release()
    # a lock file cut short by a crash at its start is stale
    broken = run_lock.RunLock(tmp_path / "c")
    broken.path.parent.mkdir()
    broken.path.write_text('{"host": ')
    broken.acquire()
    broken.release()
    # release never removes a lock that another process holds
    mine = run_lock.RunLock(tmp_path / "d")
    mine.acquire()
    mine.path.write_text(json.dumps({"host": here, "pid": _dead_pid() + 10**7, "since": "y"}))
    mine.release()
    assert mine.path.exists()
    # a run refused before it wrote anything leaves no directory behind
    deep = run_lock.RunLock(tmp_path / "e" / "f" / "g")
    deep.acquire()
    assert deep.path.exists()
    deep.release()
    assert not (tmp_path / "e").exists()
    kept = run_lock.RunLock(tmp_path / "h")
    kept.acquire()
    (tmp_path / "h" / "config.gin").write_text("")
    kept.release()
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["config.gin"]
