"""What the commands share: logging, the single `error:` line a user error becomes, and
the body of the commands that run a registered configurable with MODEL (train, eval,
infer):

    flags -> jax.distributed (when asked) -> --gin.NAME typo check -> gin files and
    bindings -> the compilation cache (COMPILATION_CACHE_DIR) -> MODEL -> call(model)

    error type (t5lite.errors)                                   exit status
    ConfigError (and DataError)                                  2
    PartitioningError, CheckpointMismatchError, TrainingError,   1
    FileNotFoundError, OutputWriteError (DiskFullError), and any
    error that says a disk is full

and, from the threads that watch a run (each with its own one line): a hung step 3
(runtime/process/watchdog.py), another process lost 4, processes that never joined 5
(runtime/process/distributed.py).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import Any, Callable, Optional, Sequence

from t5lite.config import flags, parsing
from t5lite.errors import (CheckpointMismatchError, ConfigError, OutputWriteError,
                           PartitioningError, TrainingError)
from t5lite.runtime.process import compilation_cache, disk_space, distributed, gc_settings

log = logging.getLogger(__name__)
EXIT_CONFIG_ERROR = 2
EXIT_RUN_ERROR = 1
EXIT_INTERRUPTED = 130  # the shell's status for a process stopped by Ctrl-C
RUN_ERRORS = (PartitioningError, CheckpointMismatchError, TrainingError, FileNotFoundError,
              OutputWriteError)


def setup_logging() -> None:
    """t5lite's INFO lines on stderr; orbax, absl and the rest stay at WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)
    logging.getLogger("t5lite").setLevel(logging.INFO)


def one_line(e: BaseException) -> str:
    """The message without the `In call to configurable ...` lines gin appends to errors
    raised inside a configurable."""
    return str(e).split("\n  In call to configurable")[0].strip()


def start_compilation_cache() -> None:
    """JAX's persistent compilation cache for this command, in the directory the parsed
    gin config's COMPILATION_CACHE_DIR names (unbound: T5LITE_COMPILATION_CACHE_DIR, ...;
    None: off; runtime/process/compilation_cache.py). Call after parsing gin, before compiling;
    a command that succeeds logs the cache's hits and misses at its end (`run_main`)."""
    configured = parsing.macro_value(compilation_cache.MACRO, compilation_cache.UNSET)
    try:
        directory, source = compilation_cache.resolve(configured)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    compilation_cache.start(directory, source)


def run_model_command(argv: Optional[Sequence[str]], parser: argparse.ArgumentParser,
                      call: Callable[[Any], Any], default_gin_file: Optional[str] = None,
                      default_what: str = "") -> int:
    """The body of train / eval / infer (see the module docstring). `parser` comes from
    `flags.entry_parser`; with no --gin_file, `default_gin_file` (`default_what` says
    what it is) runs if given. Returns the exit status."""
    setup_logging()
    args = flags.parse_flags(parser, argv)
    if not args.gin_file and default_gin_file:
        log.info("no --gin_file given: running %s (%s); see README.md", default_what,
                 default_gin_file)
        args.gin_file = [default_gin_file]
    for name in ("peer_timeout_seconds", "join_timeout_seconds"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, got {getattr(args, name)}")
    distributed.join(distributed.DistributedSettings(
        args.coordinator_address, args.process_count, args.process_index, args.multiprocess,
        args.peer_timeout_seconds, args.join_timeout_seconds))
    parsing.check_command_line_macros(args.gin_file, args.gin_bindings, args.gin_search_paths)
    parsing.parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths)
    start_compilation_cache()
    model = parsing.resolve_macro("MODEL")
    try:
        call(model)
    except ConfigError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except RUN_ERRORS as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_RUN_ERROR
    except Exception as e:  # noqa: BLE001 - a full disk where no writer said so
        if not disk_space.is_disk_full(e):
            raise
        print(f"error: {disk_space.describe(e)}", file=sys.stderr)
        return EXIT_RUN_ERROR
    else:
        compilation_cache.finish()  # its hits and misses
    finally:
        compilation_cache.finish(quiet=True)  # after an error, whose line comes last
    return 0


def run_main(main: Callable[[], Optional[int]]) -> None:
    """Runs `main()`; a ConfigError becomes `error: ...` on stderr and exit status 2.
    A failed command, and every command of a multi-process run, exits at once
    (`exit_now`). In a multi-process run the process first
    leaves JAX's runtime with its status, which the other processes read
    (`runtime/process/distributed.py`). Python's cycle collector is set for a process
    that traces a model (`runtime/process/gc_settings.py`)."""
    gc_settings.for_command()
    try:
        status = main() or 0
    except ConfigError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        status = EXIT_CONFIG_ERROR
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and exits)
        print("error: interrupted (Ctrl-C) before this command finished; what it had "
              "saved before is kept", file=sys.stderr)
        status = EXIT_INTERRUPTED
    except Exception:
        if not distributed.watching():
            raise
        # a collective fails at once when a peer dies: the watcher names the lost process
        # (and ends this one) once the heartbeats tell; otherwise the error is this one's
        distributed.await_verdict()
        traceback.print_exc()
        status = EXIT_RUN_ERROR
    compilation_cache.finish(quiet=bool(status))  # bench and info: the cache's summary
    several = distributed.watching()
    distributed.leave(status)
    if status or several:  # (several: no interpreter teardown beside JAX's threads)
        exit_now(status)
    sys.exit(0)


def exit_now(status: int) -> None:
    """Flush and leave without the interpreter's teardown. After an error, TensorFlow's
    input threads may be inside Python calls (a reader's generator) that wait for the
    interpreter lock while its teardown waits for them: the process would hang, holding
    its GPUs, until killed. Whatever a run saves is closed before its error gets here
    (the training loop closes checkpoints and logs in its `finally`)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
