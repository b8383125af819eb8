"""What background threads print when an Orbax, TensorStore or TensorBoard operation
fails, although the operation's owner raises the same failure in the caller (and the
command turns it into one line): a traceback per abandoned array read or write
(unraisable coroutines, asyncio's "Event loop is closed"), asyncio's never-retrieved task
errors, Orbax's ERROR records, TensorBoard's writer-thread traceback.

    drop(rule)   # from now on, drop every report `rule(exc, text)` matches

One set of hooks (sys.unraisablehook, threading.excepthook, a filter on the absl, orbax
and asyncio loggers' ERROR records), installed once; each caller adds its rule
(checkpoints.py: abandoned reads of a damaged checkpoint; disk_space.py: a full disk).
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Callable, List, Optional

Rule = Callable[[Optional[BaseException], str], bool]  # (the error, its text) -> drop?
_RULES: List[Rule] = []
LOGGERS = ("absl", "orbax", "asyncio")


def _dropped(exc: Optional[BaseException], text: str) -> bool:
    return any(rule(exc, text) for rule in _RULES)


def _install() -> None:
    previous_unraisable, previous_thread = sys.unraisablehook, threading.excepthook

    def unraisable(u):
        exc = getattr(u, "exc_value", None)
        name = getattr(getattr(u, "object", None), "__qualname__", "")
        if not _dropped(exc, f"{name} {exc if exc is not None else ''}"):
            previous_unraisable(u)

    def thread(args):
        if not _dropped(args.exc_value, str(args.exc_value)):
            previous_thread(args)

    def record_kept(record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        return not _dropped(exc, f"{record.getMessage()} {exc if exc is not None else ''}")

    sys.unraisablehook, threading.excepthook = unraisable, thread
    for name in LOGGERS:
        logging.getLogger(name).addFilter(record_kept)


def drop(rule: Rule) -> None:
    """From now on, drop the background reports `rule` matches (idempotent per rule)."""
    if rule in _RULES:
        return
    if not _RULES:
        _install()
    _RULES.append(rule)
