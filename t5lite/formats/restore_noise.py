"""Keeping a failed restore's noise off the terminal. A damaged checkpoint makes Orbax
and TensorStore print hundreds of lines (a traceback per array, asyncio's "Event loop is
closed" from their reader threads) besides raising; `failure_output_dropped` keeps a
restore's stderr only if it succeeds, and `short_reason` turns the raised error into the
one line the user gets.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import sys
import tempfile
import time
from typing import Optional

from t5lite.errors import background_reports


_ABANDONED_READ_MARKS = ("read_array_index", "Encountered error while reading array",
                         "Event loop is closed")


def _abandoned_read(exc: Optional[BaseException], text: str) -> bool:
    """An array read Orbax abandoned when another read of the same restore failed: its
    coroutine (or the closed event loop it reports to) complains when collected, later,
    and asyncio reports it unretrieved (background_reports rule)."""
    return any(mark in text for mark in _ABANDONED_READ_MARKS)


def _reads_of(path: str) -> background_reports.Rule:
    """Reports that name `path`: reads of a restore that failed still in flight when it
    raised; asyncio reports their futures' errors ("Future exception was never
    retrieved") when they are collected, which may be after the restore's stderr is
    back on the terminal."""
    names = {path, os.path.abspath(path)}

    def rule(exc: Optional[BaseException], text: str) -> bool:
        return any(name in text for name in names)
    return rule


@contextlib.contextmanager
def failure_output_dropped(path: Optional[str] = None):
    """A restore whose stderr is kept only if it succeeds. A damaged checkpoint makes
    Orbax and TensorStore print hundreds of lines (a traceback per array, asyncio's
    "Event loop is closed" from their reader threads) besides raising; the raised error
    is what the user gets, in one line. `path`: what is read (a step's directory); when
    the restore fails, later reports that name it are dropped too."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        quiet = logging.root.manager.disable
        logging.disable(logging.ERROR)
        failed = True
        try:
            yield
            failed = False
        finally:
            if failed:
                background_reports.drop(_abandoned_read)
                if path is not None:
                    background_reports.drop(_reads_of(str(path)))
                gc.collect()      # abandoned reads report now, into the capture
                time.sleep(0.2)
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            logging.disable(quiet)
            if not failed:
                captured.seek(0)
                sys.stderr.write(captured.read().decode(errors="replace"))


def short_reason(e: BaseException) -> str:
    """The first sentence of an error and of its cause, on one line: TensorStore appends its
    whole spec, and names the checkpoint's directory, which the caller names already."""
    def first(x):
        text = " ".join(str(x).split()).split(". See full TensorStore")[0].split(" [source")[0]
        return re.sub(r' in OCDBT database at local file "[^"]*"', "", text)
    text = first(e)
    cause = e.__cause__ or e.__context__
    if cause is not None and first(cause) and first(cause) not in text:
        text += f": {first(cause)}"
    return f"{type(e).__name__}: {text}"[:300]
