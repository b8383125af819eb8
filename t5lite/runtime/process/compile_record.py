"""How long a run's train step took to compile, remembered beside the compilation cache,
so that the line before the compile can say what it will cost:

    compile_record.use(directory, writable)   # compilation_cache.start: where it lives
    compile_record.announce("the train step", "step_fn", model_dir)   # the line, before
    ...                                        # the compile; compilation_cache reports
    compile_record.note("jit(step_fn)", 4.2)   #   each program: the announced one is kept

The line, logged before the first step (which compiles the step, or loads it from the
compilation cache in about a second):

    compiling the train step (jit(step_fn)); for this MODEL_DIR it compiled in 4 s last time
    compiling the train step (jit(step_fn)); the first time for this MODEL_DIR

The record is `compile_seconds.json` in the cache directory: {"MODEL_DIR|jit(step_fn)":
seconds}, the compile time (JAX's own figure, also when the program was loaded: it
stores the time with the program), the newest RECORD_SIZE entries, replaced whole
(written to a temporary file, then renamed) by the process that compiles. Without a
cache, or one it cannot read or write, there is no record and the line says nothing of
time; nothing here ever fails a run.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Dict, Optional

log = logging.getLogger(__name__)

FILE = "compile_seconds.json"
RECORD_SIZE = 200

_where: Dict[str, object] = {"directory": None, "writable": False}
_pending: Dict[str, str] = {}  # the announced program's name -> its record key


def use(directory: Optional[str], writable: bool) -> None:
    """The cache directory the record lives in (None: no record)."""
    _where.update(directory=directory, writable=bool(directory) and writable)
    _pending.clear()


def _read() -> Dict[str, float]:
    directory = _where["directory"]
    if not directory:
        return {}
    try:
        with open(os.path.join(str(directory), FILE)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    return {k: float(v) for k, v in record.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def last_seconds(program: str, model_dir: str) -> Optional[float]:
    """The seconds `program` (the jitted function's name) took to compile last time for
    `model_dir`, or None."""
    return _read().get(f"{os.path.abspath(model_dir)}|jit({program})")


def announce(what: str, program: str, model_dir: str) -> str:
    """Log (and return) the line before `program` compiles; its compile time is then
    recorded for `model_dir` when the compilation cache reports it."""
    seconds = last_seconds(program, model_dir)
    line = f"compiling {what} (jit({program})); " + (
        "the first time for this MODEL_DIR" if seconds is None
        else f"for this MODEL_DIR it compiled in {seconds:.0f} s last time")
    log.info("%s", line)
    _pending[f"jit({program})"] = f"{os.path.abspath(model_dir)}|jit({program})"
    return line


def note(name: str, seconds: float) -> None:
    """A program compiled (or was loaded) with JAX's compile time `seconds`: kept when it
    is the one announced (name as JAX gives it: "jit(step_fn)")."""
    key = _pending.pop(name, None)
    if key is None or not _where["writable"]:
        return
    record = _read()
    record.pop(key, None)
    record[key] = round(float(seconds), 2)
    kept = dict(list(record.items())[-RECORD_SIZE:])
    directory = str(_where["directory"])
    try:
        fd, tmp = tempfile.mkstemp(prefix=".compile_seconds-", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(kept, f, indent=0, sort_keys=False)
        os.replace(tmp, os.path.join(directory, FILE))
    except OSError as e:  # a full or read-only disk: no record, the run goes on
        log.debug("compile record not written: %s", e)
        try:
            os.unlink(tmp)
        except (OSError, UnboundLocalError):
            pass
