"""A disk that fills while a run writes: one check before each large write, one
translation of a write that failed for want of room, so every writer (checkpoints with
their data iterator state, TensorBoard events, predictions, infer output, config.gin)
ends the same way: a DiskFullError whose one line names what was being written, the
directory, how much it needs (when known) and how much is free. What was written before
is never touched; the caller says what is kept (the loop: which checkpoints).

    check_room("checkpoint 6", ckpt_dir, needed=24_000_000)  # DiskFullError, before writing
    with writing("the TensorBoard events", logdir):           # ENOSPC -> DiskFullError
        writer.flush()
    replace_file(model_dir / "config.gin", text)              # whole or not at all
    is_disk_full(e)   # errno ENOSPC / EDQUOT anywhere in e's chain, or TensorStore's text

Cost: one statvfs per checkpoint save.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator, Optional, Union

from t5lite.errors import DiskFullError
from t5lite.errors import background_reports

PathLike = Union[str, os.PathLike]
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# TensorStore (Orbax's writer) raises ValueError("RESOURCE_EXHAUSTED: ... No space left on
# device [os_error_code='28']"); Python's own writes raise OSError with errno set.
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "os_error_code='28'",
               "os_error_code='122'")


def human(n: Optional[float]) -> str:
    """A byte count for people: 0 B, 512 B, 24.1 MB, 3.2 GB (powers of 1000)."""
    if n is None:
        return "an unknown amount"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def free_bytes(path: PathLike) -> Optional[int]:
    """Bytes free to this user on the disk that holds `path` (or its nearest existing
    parent); None where that cannot be known (a URL such as gs://)."""
    text = os.fspath(path)
    if "://" in text:
        return None
    p = Path(text).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def is_disk_full(e: BaseException) -> bool:
    """Whether `e` (or an error it came from) is a write that found no room."""
    if isinstance(e, DiskFullError):
        return True
    return any((isinstance(x, OSError) and x.errno in _FULL_ERRNOS)
               or _mentions_full_disk(str(x)) for x in _chain(e))


def _mentions_full_disk(text: str) -> bool:
    return any(t in text for t in _FULL_TEXTS)


def disk_full_error(what: str, directory: PathLike, needs: Optional[str] = None
                    ) -> DiskFullError:
    """The DiskFullError for `what` (e.g. "checkpoint 6") that found no room in
    `directory`; `needs`: how much it needs, in words ("about 24.7 MB"), when known."""
    free = human(free_bytes(directory))
    size = f"it needs {needs}; {free} is free" if needs else f"{free} free"
    return DiskFullError(f"no space left on the disk of {os.fspath(directory)} for {what} "
                         f"({size})")


def check_room(what: str, directory: PathLike, needed: int, needs: Optional[str] = None,
               margin: float = 1.0) -> None:
    """DiskFullError before writing when `directory`'s disk has less than `margin` times
    `needed` bytes free (`needs`: that size in words; nothing is raised where free space
    cannot be known)."""
    free = free_bytes(directory)
    if free is not None and free < needed * margin:
        raise disk_full_error(what, directory, needs or human(needed))


@contextlib.contextmanager
def writing(what: str, directory: PathLike, needs: Optional[str] = None):
    """A write of `what` into `directory`: an error that says the disk is full becomes
    one DiskFullError; any other error passes unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:  # noqa: BLE001 - only the disk-full ones are translated
        if is_disk_full(e):
            raise disk_full_error(what, directory, needs) from None
        raise


def replace_file(path: PathLike, data: Union[str, bytes], what: Optional[str] = None,
                 needs: Optional[str] = None) -> None:
    """Write `data` (text or bytes) to `path` whole or not at all: into a temporary file
    beside it, then renamed over it. On a full disk the old file is untouched, the
    temporary one removed, and the error is a DiskFullError naming `what` (default: the
    file's name) and what it `needs` (in words, when given)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with writing(what or path.name, path.parent, needs):
            if isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                tmp.write_text(data)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def describe(e: BaseException) -> str:
    """One line for a disk-full error raised where no writer translated it (a
    DiskFullError is an OutputWriteError, which the commands print as it is): the file
    (when the error names one) and the free space of its disk."""
    for x in _chain(e):
        filename = getattr(x, "filename", None)
        if filename:
            return str(disk_full_error(Path(filename).name, Path(filename).parent))
    return "no space left on a disk this command writes to (" + " ".join(
        str(e).split())[:200] + ")"


# ----------------------------------------------------------------------------- quiet


def _reported_by_owner(exc: Optional[BaseException], text: str) -> bool:
    """A full disk that a background writer reports while its owner (Orbax, TensorBoard's
    writer) raises it in the caller, or the closed event loop that a failed write's
    abandoned siblings report to (background_reports rule)."""
    return ((exc is not None and is_disk_full(exc)) or _mentions_full_disk(text)
            or "Event loop is closed" in text)


def quiet_background_writers() -> None:
    """From now on, a failed write's reports from background threads are dropped: the
    caller gets the error once, from the writer's owner (a DiskFullError line)."""
    background_reports.drop(_reported_by_owner)
