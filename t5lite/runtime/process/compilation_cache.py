"""JAX's persistent compilation cache, for every command: a restarted run loads its
compiled programs (the train step, the initializer, decoding) instead of compiling them
again. Nothing home-made: JAX reads and writes the entries; this module picks the
directory, checks it, sets JAX's options, reports hits and misses, and turns the ways a
cache disk goes bad into one warning line each.

    directory, source = resolve(configured)   # configured: the gin macro (UNSET: not bound)
    start(directory, source)   # logs "compilation cache: DIR (...)"; None: off
    ...                        # compiles; each program that takes a second or more logs
                               #   whether it was loaded or compiled (and saved): loaded,
                               #   by the compile time JAX stored with it, in whole
                               #   seconds rounded down and without the save (a program
                               #   that compiled and saved in 1-2 s may load silently)
    finish()                   # logs "compilation cache DIR: 2 hits, 1 miss, 1 saved"

The directory: the gin macro COMPILATION_CACHE_DIR when bound, else the environment
variable T5LITE_COMPILATION_CACHE_DIR, else JAX_COMPILATION_CACHE_DIR (JAX's own), else
$XDG_CACHE_HOME/t5lite/compilation (~/.cache/t5lite/compilation). None, 'None' or ''
turns the cache off.

What JAX does (0.11 and 0.12, read from their source): every process reads; only process
0 of a run writes, one file per program (`<module>-<hash>-cache`, written in place, not
renamed into place); a program that compiled in less than
jax_persistent_cache_min_compile_time_secs (1 s unless set) is neither saved nor counted
as a miss here. A read or write that fails is a Python warning, never an error
(jax_raise_persistent_cache_errors is False). On top of that:

    the directory cannot be created, is a file, cannot be listed   one warning; cache off
    it cannot be written (read-only, full, no permission)          one warning; read only
    a write fails during the run (the disk filled)                 one warning; the partial
                                                                   entry removed, no more
                                                                   writes
    an entry cannot be read (cut short: a full disk, a killed      one warning; process 0
    process)                                                       replaces it

XLA's GPU autotuning cache, which JAX would also keep in the directory, stays off (unless
JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES is set): XLA fails the compile when it cannot write
that one, and a program loaded from the cache needs no autotuning.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import math
import os
import re
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import jax
from jax import monitoring

from t5lite.runtime.process import compile_record
from t5lite.runtime.process.disk_space import human

log = logging.getLogger(__name__)

MACRO = "COMPILATION_CACHE_DIR"
ENV = "T5LITE_COMPILATION_CACHE_DIR"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
XLA_CACHES_ENV = "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"
OFF_VALUES = ("", "None", "none")
UNSET = object()  # `resolve`'s configured value when the gin macro is not bound
LOG_SECONDS = 1.0  # a program that takes this long or longer gets its own log line

# jax.monitoring events (jax/_src/compiler.py, compilation_cache.py, dispatch.py)
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
_HIT = "/jax/compilation_cache/cache_hits"
_WRITE = "/jax/compilation_cache/cache_misses"  # JAX records it as it writes an entry
_SAVED_SECONDS = "/jax/compilation_cache/compile_time_saved_sec"
_COMPILED = "/jax/core/compile/backend_compile_duration"  # per program, kwarg fun_name
_JAX_WARNING = re.compile(r"Error (?P<op>reading|writing) persistent compilation cache "
                          r"entry for '(?P<module>[^']*)': (?P<reason>.*)", re.DOTALL)


def default_directory() -> str:
    """$XDG_CACHE_HOME/t5lite/compilation, else ~/.cache/t5lite/compilation."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "t5lite", "compilation")


def resolve(configured: Any = UNSET) -> Tuple[Optional[str], str]:
    """(directory or None for off, where the setting came from): `configured` (the gin
    macro's value, UNSET when it is not bound), else T5LITE_COMPILATION_CACHE_DIR, else
    JAX_COMPILATION_CACHE_DIR, else `default_directory()`. A directory comes back absolute,
    `~` expanded. ValueError for a value that is neither a path nor None."""
    if configured is not UNSET:
        value, source = configured, MACRO
    elif ENV in os.environ:
        value, source = os.environ[ENV], ENV
    elif os.environ.get(JAX_ENV):
        value, source = os.environ[JAX_ENV], JAX_ENV
    else:
        value, source = default_directory(), "the default"
    if value is None or (isinstance(value, str) and value.strip() in OFF_VALUES):
        return None, source
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{source} must be a directory (a string) or None, got {value!r}")
    return os.path.abspath(os.path.expanduser(os.fspath(value))), source


@dataclasses.dataclass
class Cache:
    """The cache a command uses, and what it did: `hits` (programs loaded), `misses`
    (programs compiled that took at least JAX's minimum compile time), `saved` (entries
    this process wrote), `unreadable` (entries that could not be read)."""

    directory: str
    source: str
    writable: bool
    hits: int = 0
    misses: int = 0
    saved: int = 0
    unreadable: int = 0
    write_failed: bool = False

    def summary(self) -> str:
        line = (f"compilation cache {self.directory}: {_count(self.hits, 'hit')}, "
                f"{_count(self.misses, 'miss', 'misses')}, {self.saved} saved")
        if self.unreadable:
            line += f", {self.unreadable} unreadable (compiled again)"
        return line


_active: Optional[Cache] = None
_lock = threading.Lock()
_compile = threading.local()  # the program being compiled in this thread: its outcome
_jax_defaults: Dict[str, Any] = {}
_hooks_installed = False


def start(directory: Optional[str], source: str = "") -> Optional[Cache]:
    """Check `directory` (created if missing), point JAX at it and log one line (one
    warning line instead when it cannot be used: the run goes on without it, or reading
    only). None turns the cache off. Starting the directory already in use does
    nothing. Returns the cache in use, or None."""
    global _active
    if _active is not None and directory == _active.directory:
        return _active
    finish(quiet=True)
    compile_record.use(None, writable=False)
    if directory is None:
        _configure_jax(None, writable=False)
        log.info("compilation cache: off (%s)", source or MACRO)
        return None
    problem, cannot_write = _check(directory)
    if problem:
        log.warning("compilation cache %s: %s; compiling without it", directory, problem)
        _configure_jax(None, writable=False)
        return None
    if cannot_write:
        log.warning("compilation cache %s: cannot write to it (%s); reading it only, "
                    "programs compiled now are not saved", directory, cannot_write)
    _install_hooks()
    _configure_jax(directory, writable=not cannot_write)
    _active = Cache(directory, source, writable=not cannot_write)
    compile_record.use(directory, writable=not cannot_write and jax.process_index() == 0)
    log.info("compilation cache: %s (%s; %s)", directory, source or "given",
             _contents(directory))
    return _active


def stats(since: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The cache in use as a dict (directory, writable, hits, misses, saved, unreadable),
    the counts less those of `since` (an earlier `stats()`); None when none is in use."""
    cache = _active
    if cache is None:
        return None
    counts = dict(hits=cache.hits, misses=cache.misses, saved=cache.saved,
                  unreadable=cache.unreadable)
    if since is not None and since.get("directory") == cache.directory:
        counts = {k: v - since.get(k, 0) for k, v in counts.items()}
    return dict(directory=cache.directory, writable=cache.writable, **counts)


def finish(quiet: bool = False) -> Optional[str]:
    """Log the cache's summary line (unless `quiet`) and stop counting; returns the line
    (None when no cache was in use). JAX keeps its settings."""
    global _active
    cache, _active = _active, None
    if cache is None:
        return None
    if not quiet:
        log.info("%s", cache.summary())
    return cache.summary()


# --------------------------------------------------------------------------- the directory

def _check(directory: str) -> Tuple[Optional[str], Optional[str]]:
    """(why it cannot be used, why it cannot be written): None where it can. Creates it."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "it is a file, not a directory", None
    except OSError as e:
        return f"cannot create it ({_reason(e)})", None
    if not path.is_dir():
        return "it is not a directory", None
    try:
        _contents(directory)
    except OSError as e:
        return f"cannot read it ({_reason(e)})", None
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".t5lite-write-check-")
        try:
            os.write(fd, b"\0" * 4096)  # a page: a full disk refuses it
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        return None, _reason(e)
    return None, None


def _contents(directory: str) -> str:
    """'3 programs, 41.2 MB' (the entries JAX wrote there), or 'empty'."""
    count = size = 0
    with os.scandir(directory) as it:
        for entry in it:
            if entry.name.endswith("-cache") and entry.is_file():
                count += 1
                size += entry.stat().st_size
    return f"{_count(count, 'program')}, {human(size)}" if count else "empty"


def _reason(e: OSError) -> str:
    return (e.strerror or str(e)).rstrip(".")


def _configure_jax(directory: Optional[str], writable: bool) -> None:
    """JAX's options for `directory` (None: no cache); JAX's own minimum compile time and
    XLA cache setting come back each time, so commands run one after another in a process
    do not inherit each other's."""
    from jax.experimental.compilation_cache import compilation_cache as jax_cache
    if not _jax_defaults:
        _jax_defaults["min_seconds"] = jax.config.jax_persistent_cache_min_compile_time_secs
        _jax_defaults["xla_caches"] = jax.config.jax_persistent_cache_enable_xla_caches
    if jax.config.jax_compilation_cache_dir != directory:
        jax_cache.reset_cache()  # JAX opens its directory once, at the first compile
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      _jax_defaults["min_seconds"] if writable else math.inf)
    jax.config.update("jax_persistent_cache_enable_xla_caches",
                      _jax_defaults["xla_caches"] if XLA_CACHES_ENV in os.environ else "none")


# --------------------------------------------------------------------------- JAX's reports

def _install_hooks() -> None:
    """Listeners for JAX's cache events (once per process), and a hook that takes JAX's
    cache warnings (shown every time, never turned into errors) while a cache is active
    (again at each start: `warnings.catch_warnings` puts the previous ones back)."""
    global _hooks_installed
    if not _hooks_installed:
        _hooks_installed = True
        monitoring.register_event_listener(_on_event)
        monitoring.register_event_duration_secs_listener(_on_duration)
    warnings.filterwarnings("always", message=r"Error (reading|writing) persistent "
                            r"compilation cache entry")
    if warnings.showwarning is not _showwarning:
        _showwarning.previous = warnings.showwarning
        warnings.showwarning = _showwarning


def _showwarning(message, category, filename, lineno, file=None, line=None):
    cache, found = _active, _JAX_WARNING.match(str(message))
    if cache is None or found is None:
        return _showwarning.previous(message, category, filename, lineno, file, line)
    _quietly(_cache_error, cache, found["op"], found["module"], found["reason"])
    return None


_showwarning.previous = warnings.showwarning


def _quietly(fn, *args) -> None:
    """JAX calls the listeners inside its compile: a listener's bug must not fail it."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        log.debug("compilation cache report failed: %r", e)


def _on_event(event: str, **_: Any) -> None:
    if _active is None:
        return
    if event == _REQUEST:
        _compile.outcome, _compile.saved, _compile.started = "miss", False, time.time()
    elif event == _HIT:
        _compile.outcome = "hit"
    elif event == _WRITE:
        _compile.saved = True


def _on_duration(event: str, seconds: float, **kwargs: Any) -> None:
    cache = _active
    if cache is None:
        return
    if event == _SAVED_SECONDS:
        _compile.compiled_s = seconds
    elif event == _COMPILED and getattr(_compile, "outcome", None):
        _quietly(_program, cache, str(kwargs.get("fun_name", "a program")), seconds)


def _program(cache: Cache, name: str, seconds: float) -> None:
    """One program done: count it, and give it a line when it took a second or more."""
    outcome, saved = _compile.outcome, getattr(_compile, "saved", False)
    _compile.outcome = None
    with _lock:
        if outcome == "hit":
            cache.hits += 1
        elif seconds >= _jax_defaults["min_seconds"]:
            cache.misses += 1
        cache.saved += int(saved)
    compiled = getattr(_compile, "compiled_s", 0.0) + seconds if outcome == "hit" else seconds
    compile_record.note(name, compiled)
    if outcome == "hit":
        if compiled >= LOG_SECONDS:
            log.info("compilation cache: %s loaded in %.1f s (compiling it took %.0f s)",
                     name, seconds, compiled)
    elif seconds >= LOG_SECONDS:
        why = ("" if saved else "; not saved: process 0 saves" if jax.process_index()
               else "; not saved")
        log.info("compilation cache: %s compiled in %.1f s%s", name, seconds,
                 ", saved" if saved else why)


def _cache_error(cache: Cache, op: str, module: str, reason: str) -> None:
    """A read or write JAX could not do: one warning line for the first of each kind;
    the broken or partial entry removed so the next write replaces it."""
    reason = reason.strip().splitlines()[0] if reason.strip() else "unknown error"
    if op == "writing":
        first, _compile.saved = not cache.write_failed, False
        cache.write_failed = True
        jax.config.update("jax_persistent_cache_min_compile_time_secs", math.inf)
        _remove_partial(cache.directory, module, getattr(_compile, "started", time.time()))
        if first:
            log.warning("compilation cache %s: cannot save %s (%s); the run goes on, "
                        "programs compiled from now on are not saved", cache.directory,
                        module, reason)
        return
    with _lock:
        cache.unreadable += 1
        first = cache.unreadable == 1
    removed = _remove_unreadable(cache.directory, module) if (
        cache.writable and not cache.write_failed and jax.process_index() == 0) else 0
    if first:
        log.warning("compilation cache %s: a saved %s could not be read (%s); compiling "
                    "it again%s", cache.directory, module, reason,
                    " and replacing the entry" if removed else "")


def _entries(directory: str, module: str):
    return Path(directory).glob(f"{glob.escape(module)}-*-cache")


def _remove_partial(directory: str, module: str, since: float) -> None:
    """The entry of `module` that this process was writing when the write failed."""
    for path in _entries(directory, module):
        try:
            if path.stat().st_mtime >= since - 1:
                path.unlink()
        except OSError:
            pass


def _remove_unreadable(directory: str, module: str) -> int:
    """Removes the entries of `module` that do not decompress (JAX's own reader); the
    write after the compile then saves a whole one. Returns how many were removed."""
    try:
        from jax._src.compilation_cache import decompress_executable
    except ImportError:  # another JAX: leave the entry
        return 0
    removed = 0
    for path in _entries(directory, module):
        try:
            decompress_executable(path.read_bytes())
        except Exception:  # noqa: BLE001 - what JAX could not read
            try:
                path.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def _count(n: int, one: str, many: Optional[str] = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"
