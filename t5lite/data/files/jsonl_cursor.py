"""Reading a .jsonl, .jsonl.zst or .jsonl.gz / .json.gz file from a saved position: the
resumable reader of the Pile and of other JSON-lines corpora (C4 as allenai/c4 lays it
out).

    pool = CursorPool("text", shard_index=0, num_shards=1)
    texts, position = pool.read(path, START, 64)   # up to 64 texts, and where to go on
    texts, position = pool.read(path, position, 64)

A position is six integers, (frame, offset, line, record, size, fingerprint):

    frame   byte offset in the file of the zstd frame (gzip member) that holds the next
            record (0 for a .jsonl file)
    offset  bytes of decompressed data from that frame's start to the next record
            (for a .jsonl file: the byte offset of the next record)
    line    the next line's number (1-based; error messages name it)
    record  how many non-empty lines come before it (with num_shards n, a reader keeps
            record k only when k % n == shard_index, and parses nothing else)
    size, fingerprint   which file the position belongs to: its size in bytes and a
            hash of its first and last 64 KiB (0, 0 in START: filled in by the first read)

A position belongs to one file: the reader of the next file, or of the same file on the
next pass, starts from START. Reopening a file at a position (after a restore) first
checks that it is the file the position was taken in (size and fingerprint) and that the
position fits it (within the file, at a line's start): a changed file and a position
that does not fit an unchanged one are told apart in the error.

Cost of starting at a position, independent of how much was read before: a .jsonl file
seeks to the byte; a .jsonl.zst file seeks to the frame and decompresses `offset` bytes
of it without parsing them (zstd frames cannot be entered in the middle), so a file
written as many frames resumes in the time of part of one, and a file written as one
frame (a single `zstd` call) in the time of decompressing it up to the position, at
most the whole file once. A gzip file is the same with members for frames: one written
by `gzip` is one member (a resume decompresses up to the position: C4's 300 MB train
files take a few seconds), one written in blocks (`bgzip`, `pigz --independent`) resumes
within a block. Reading on from where the previous call stopped reuses the open stream
and costs nothing extra, and so does the read that finds a file's end.

`STATS` counts what was done ("records_parsed", "bytes_skipped", "reopened"): the tests
measure the cost of a resume with it.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from t5lite.data.files.compressed import PILE_FORMAT, compression, plain_chunks
from t5lite.data.files.parquet_cursor import ParquetRows
from t5lite.data.files.positions import (RESUME_ANYWAY, START, STATS, Position,  # noqa: F401
                                   file_identity)
from t5lite.errors import DataError, DataFormatError, DataNotFoundError


def parse_record(path: str, lineno: int, line: bytes, field: str) -> str:
    """The `field` string of one JSON line; DataFormatError naming the file and line."""
    try:
        obj = json.loads(line)
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte "
                              f"{e.start})") from None
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{lineno}: not JSON ({e.msg}); expected {PILE_FORMAT}") \
            from None
    if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
        got = (f"an object with keys {sorted(obj)}" if isinstance(obj, dict)
               else f"a JSON {type(obj).__name__}")
        raise DataFormatError(f"{path}:{lineno}: expected a JSON object with a {field!r} "
                              f"string ({PILE_FORMAT}), got {got}")
    return obj[field]


class _Lines:
    """The lines of one file from a position on, with the position of the next one.
    `identity` is the file's (size, fingerprint) as it is now."""

    def __init__(self, path: str, position: Position, identity: Tuple[int, int]):
        frame, offset, self.line, self.record = (int(p) for p in position[:4])
        self.path, self.identity = path, identity
        self.ended = False                 # the end of the file was read
        compressed = compression(path)
        try:
            self._raw = open(path, "rb")
        except FileNotFoundError:
            raise DataNotFoundError(f"{path}: the file is gone (it was listed when the "
                                    f"data set was built); restore it") from None
        except OSError as e:
            raise DataNotFoundError(f"{path}: cannot be read ({e.strerror})") from None
        self._buf, self._pos = b"", 0      # decompressed bytes; next unconsumed index
        self._consumed = 0                 # decompressed bytes consumed since opening
        try:
            if compressed:
                magic, check_magic, chunks, what = compressed
                if frame == 0:
                    check_magic(path, self._raw)
                else:
                    self._raw.seek(frame)
                    if self._raw.read(len(magic)) != magic:
                        raise self._misfit(position, f"no {what} starts at byte {frame}")
                self._raw.seek(frame)
                self._chunks = chunks(path, self._raw)
                # (decompressed bytes consumed when a frame starts, its file offset)
                self._frames = [(0, frame)]
                self._skip(offset, position)
            else:
                self._raw.seek(frame + offset)
                self._chunks = plain_chunks(self._raw)
                self._frames = [(-(frame + offset), 0)]
                if frame + offset > identity[0]:
                    raise self._misfit(position, f"it lies {frame + offset - identity[0]} "
                                                 f"bytes beyond the end of the file")
                if frame + offset:
                    self._check_fit(position)
        except DataError:
            self._raw.close()
            raise

    def close(self) -> None:
        self._raw.close()

    @property
    def position(self) -> Position:
        start, frame = self._frames[0]
        return (frame, self._consumed - start, self.line, self.record) + self.identity

    # -- decompressed bytes -------------------------------------------------------------
    def _more(self) -> bool:
        """Append decompressed bytes to the buffer; False at the end of the file."""
        for at, data in self._chunks:
            if at != self._frames[-1][1]:  # a new frame starts with these bytes
                self._frames.append((self._consumed + len(self._buf) - self._pos, at))
            self._append(data)
            return True
        return False

    def _append(self, data: bytes) -> None:
        self._buf = self._buf[self._pos:] + data if self._pos < len(self._buf) else data
        self._pos = 0

    def _advance(self, n: int) -> None:
        self._pos += n
        self._consumed += n
        while len(self._frames) > 1 and self._frames[1][0] <= self._consumed:
            self._frames.pop(0)

    def _skip(self, n: int, position: Position) -> None:
        """Pass over the first `n` bytes of the frame (a saved position's offset)."""
        skipping = n
        while n > 0:
            if self._pos >= len(self._buf) and not self._more():
                raise self._misfit(position, f"it lies {n} bytes beyond the end of the "
                                             f"file's data")  # (decompressed)
            k = min(n, len(self._buf) - self._pos)
            self._advance(k)
            STATS["bytes_skipped"] += k
            n -= k
        if skipping:
            self._check_fit(position, self._buf[self._pos - 1:self._pos])

    def _check_fit(self, position: Position, before: Optional[bytes] = None) -> None:
        """A position other than a frame's start must follow a newline, or be the end of
        a file whose last line has none. `before` is the byte before it (read here for a
        plain file)."""
        if before is None:
            self._raw.seek(-1, os.SEEK_CUR)
            before = self._raw.read(1)
        if before == b"\n":
            return
        if self._pos >= len(self._buf) and not self._more():
            return  # the end of a file whose last line has no newline
        raise self._misfit(position, "it is not at the start of a line")

    def _misfit(self, position: Position, why: str) -> DataError:
        frame, offset, line = (int(p) for p in position[:3])
        compressed = compression(self.path)
        where = (f"byte {offset} of the {compressed[3]} at byte {frame}, line {line}"
                 if compressed else f"byte {offset}, line {line}")
        return DataError(
            f"{self.path}: the saved data position ({where}) does not fit the file ({why}), "
            f"which is the file the position was saved in (same size, "
            f"{self.identity[0]} bytes, and fingerprint): this is a t5lite bug, please "
            f"report it; {RESUME_ANYWAY}")

    # -- lines --------------------------------------------------------------------------
    @staticmethod
    def blank(line: bytes) -> bool:
        return not line.strip()  # an empty line is no record

    def parse(self, line: bytes, field: str) -> str:
        """The `field` string of the line just read."""
        return parse_record(self.path, self.line - 1, line, field)

    def next_line(self) -> Optional[bytes]:
        """The next line (without its newline), or None at the end of the file (which
        closes it; the position stays where the end is)."""
        while not self.ended:
            end = self._buf.find(b"\n", self._pos)
            if end >= 0:
                line = self._buf[self._pos:end]
                self._advance(end + 1 - self._pos)
                self.line += 1
                return line
            if not self._more():
                if self._pos < len(self._buf):  # a last line without a newline
                    line = self._buf[self._pos:]
                    self._advance(len(line))
                    self.line += 1
                    return line
                self.ended, self._buf, self._pos = True, b"", 0
                self.close()
        return None


def _changed(path: str, saved: Tuple[int, int], now: Tuple[int, int]) -> DataError:
    return DataError(
        f"{path}: the file changed since the checkpoint was written (it was "
        f"{saved[0]} bytes with fingerprint {saved[1]:014x}, it is {now[0]} bytes with "
        f"fingerprint {now[1]:014x}), so the saved data position no longer points into "
        f"it: put the original file back; {RESUME_ANYWAY}")


class CursorPool:
    """Readers of shard `shard_index` of `num_shards` of the records of several files
    (JSON lines, plain or compressed, and Parquet: parquet_cursor.py), each kept open
    where its last read stopped (a file read to its end stays known as
    ended, so the read that finds the end costs nothing). Thread-safe."""

    def __init__(self, field: str = "text", shard_index: int = 0, num_shards: int = 1):
        self.field, self.shard_index, self.num_shards = field, shard_index, num_shards
        self._open: Dict[str, Any] = {}  # _Lines or ParquetRows
        self._failed: Dict[str, Tuple[Position, DataFormatError]] = {}
        self._identities: Dict[Tuple[str, int, int], Tuple[int, int]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close every open file: the next read of each reopens it at its position."""
        with self._lock:
            for lines in self._open.values():
                lines.close()
            self._open.clear()

    def _identity(self, path: str) -> Tuple[int, int]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise DataNotFoundError(f"{path}: the file is gone (it was listed when the "
                                    f"data set was built); restore it") from None
        except OSError as e:
            raise DataNotFoundError(f"{path}: cannot be read ({e.strerror})") from None
        key = (path, st.st_size, st.st_mtime_ns)
        if key not in self._identities:
            self._identities[key] = file_identity(path)
        return self._identities[key]

    def _open_at(self, path: str, position: Position):
        identity = self._identity(path)
        saved = tuple(int(p) for p in position[4:6])
        if saved != (0, 0) and saved != identity:
            raise _changed(path, saved, identity)
        if position[:4] != START[:4]:
            STATS["reopened"] += 1
        if path.endswith(".parquet"):
            return ParquetRows(path, position, identity, self.field)
        return _Lines(path, position, identity)

    def read(self, path: str, position: Position, n: int) -> Tuple[List[str], Position]:
        """Up to `n` texts of this shard's records from `position` on, and the position
        after them; no texts at the end of the file. A bad record raises DataFormatError
        (naming the file and line) after the texts before it were returned."""
        position = tuple(int(p) for p in position)
        if len(position) != len(START):
            raise ValueError(f"a position is {len(START)} integers, got {position}")
        with self._lock:
            failed = self._failed.pop(path, None)
            if failed is not None and failed[0] == position:
                raise failed[1]
            lines = self._open.pop(path, None)
            if lines is None or lines.position != position:
                if lines is not None:
                    lines.close()
                lines = self._open_at(path, position)
            texts: List[str] = []
            try:
                while len(texts) < n:
                    before = lines.position
                    line = lines.next_line()
                    if line is None:
                        break
                    if lines.blank(line):
                        continue
                    record = lines.record
                    if record % self.num_shards == self.shard_index:
                        text = lines.parse(line, self.field)
                        STATS["records_parsed"] += 1
                        texts.append(text)
                    lines.record += 1
            except DataFormatError as e:
                lines.close()
                if texts:  # what came before the bad record, then its error on the next call
                    self._failed[path] = (before, e)
                    return texts, before
                raise
            self._open[path] = lines
            return texts, lines.position


def iter_texts(path: str, field: str = "text", shard_index: int = 0,
               num_shards: int = 1, chunk: int = 256):
    """Every text of shard `shard_index` of `num_shards` of the file, in order."""
    pool, position = CursorPool(field, shard_index, num_shards), START
    while True:
        texts, position = pool.read(path, position, chunk)
        if not texts:
            return
        yield from texts
