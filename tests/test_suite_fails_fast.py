"""The suite's own settings (pytest.ini) end a run that cannot finish, quickly and naming
the test, instead of hanging CI until its 90-minute time-out.

Each case is a nested pytest run, in a directory of its own holding this repository's
pytest.ini and a few small test files, with the README's options (`-n 2 --dist
loadfile`). Before pytest.ini set --max-worker-restart=0, the crash case hung: xdist
started a replacement worker, ran every other file, then waited forever on the crashed
worker's unfinished one (seen in a full run of this suite, and here: still waiting at
120 s). No jax here: a nested run takes seconds."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

CRASHES = """
import os, signal, time
def test_before(): time.sleep(1)
def test_crashes_its_worker(): os.kill(os.getpid(), signal.SIGSEGV)
def test_after_the_crash_in_the_same_file(): pass
"""
HANGS = """
import threading
def test_waits_forever(): threading.Event().wait()
"""
OTHERS = """
import time
def test_other_{n}(): time.sleep(2)
def test_other_{n}_second(): pass
"""


def _nested_run(tmp_path, files, *options, limit=120):
    shutil.copy(ROOT / "pytest.ini", tmp_path / "pytest.ini")
    (tmp_path / "tests").mkdir()
    for name, text in files.items():
        (tmp_path / "tests" / name).write_text(text)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist",
                           "loadfile", "-p", "no:cacheprovider", *options],
                          cwd=tmp_path, capture_output=True, text=True, timeout=limit)
    return proc, time.monotonic() - start


def _others(count):
    return {f"test_other_{n}.py": OTHERS.format(n=n) for n in range(count)}


def test_a_crashed_worker_ends_the_run_naming_the_test(tmp_path):
    proc, seconds = _nested_run(tmp_path, {"test_crash.py": CRASHES, **_others(3)})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert seconds < 60, out[-3000:]
    assert "crashed while running 'tests/test_crash.py::test_crashes_its_worker'" in out, \
        out[-3000:]
    assert "Segmentation fault" in out


def test_a_test_that_hangs_fails_naming_itself(tmp_path):
    # pytest.ini's limit (900 s) shortened to 5; the method (thread) is the ini's
    proc, seconds = _nested_run(tmp_path, {"test_hang.py": HANGS, **_others(2)},
                                "-o", "timeout=5")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert 5 < seconds < 60, out[-3000:]  # ended at the limit, not before
    # the thread method ends the worker (its stack dump goes to the worker's stderr,
    # which xdist does not pass on); the run names the test
    assert "crashed while running 'tests/test_hang.py::test_waits_forever'" in out, \
        out[-3000:]
