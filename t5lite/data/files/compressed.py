"""Decompressed bytes of a .zst or .gz file, frame by frame (gzip: member by member),
each chunk with the file offset of the frame it comes from: what a reader needs to
save a position it can seek back to (jsonl_cursor.py), and to stream a file whole
(readers.open_text). `compression(path)` says which, by the file's suffix; a plain
file's `plain_chunks` has frame offset 0 throughout.
"""
from __future__ import annotations

from typing import Iterator, Tuple

from t5lite.errors import DataFormatError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
READ_BYTES = 1 << 20  # compressed (or plain) bytes read from the file at a time
PILE_FORMAT = ('one JSON object a line with a "text" string (the Pile\'s {"text": ..., '
               '"meta": ...})')


def check_zstd_magic(path: str, raw) -> None:
    """DataFormatError unless `raw` (a binary file at its start) begins a zstd frame."""
    if raw.read(4) != ZSTD_MAGIC:
        raise DataFormatError(f"{path}: not a zstandard file (a .zst file must start with "
                              f"the zstd magic bytes); expected {PILE_FORMAT}, compressed "
                              f"with zstd")


def _frame_chunks(path: str, raw, new_frame, corrupt, name: str, frame_word: str,
                  padding_ends: bool = False) -> Iterator[Tuple[int, bytes]]:
    """(file offset of the frame it comes from, decompressed bytes) for every frame of
    `raw` from its current offset (a frame's start) on, streamed READ_BYTES of input at a
    time. `new_frame()` makes a decompressor of one frame (with .decompress, .eof,
    .unused_data); `corrupt` is its error type. With `padding_ends`, zero bytes where a
    frame would start end the file. A file that ends inside a frame, and corrupt data,
    raise DataFormatError."""
    frame, fed, at = new_frame(), False, raw.tell()
    while True:
        data_at, data = raw.tell(), raw.read(READ_BYTES)
        if not data:
            break
        while data:
            if padding_ends and not fed and not data.strip(b"\0"):
                data = b""  # padding after the last frame
                break
            try:
                out = frame.decompress(data)
            except corrupt as e:
                raise DataFormatError(f"{path}: corrupt {name} data ({e}); re-copy or "
                                      f"re-compress the file") from None
            fed = True
            if out:
                yield at, out
            if not frame.eof:
                break
            rest = frame.unused_data
            at = data_at = data_at + len(data) - len(rest)  # the next frame starts here
            data, frame, fed = rest, new_frame(), False
    if fed:
        raise DataFormatError(f"{path}: truncated {name} file (it ends inside a compressed "
                              f"{frame_word}): the file was cut short; re-copy it")


def zstd_chunks(path: str, raw) -> Iterator[Tuple[int, bytes]]:
    """`_frame_chunks` of a zstd file, frame by frame."""
    import zstandard
    # The Pile's files need a large window; 2**31 is zstd's maximum.
    dctx = zstandard.ZstdDecompressor(max_window_size=2 ** 31)
    return _frame_chunks(path, raw, dctx.decompressobj, zstandard.ZstdError, "zstandard",
                         "frame")


def gzip_chunks(path: str, raw) -> Iterator[Tuple[int, bytes]]:
    """`_frame_chunks` of a gzip file, member by member (zero bytes after the last
    member, as some writers pad, end it)."""
    import zlib
    return _frame_chunks(path, raw, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
                         zlib.error, "gzip", "member", padding_ends=True)


def check_gzip_magic(path: str, raw) -> None:
    """DataFormatError unless `raw` (a binary file at its start) begins a gzip member."""
    if raw.read(2) != GZIP_MAGIC:
        raise DataFormatError(f"{path}: not a gzip file (a .gz file must start with the "
                              f"gzip magic bytes); expected {PILE_FORMAT}, compressed "
                              f"with gzip")


# suffix -> (magic bytes, check at the file's start, chunks, what a frame is called)
COMPRESSED = {".zst": (ZSTD_MAGIC, check_zstd_magic, zstd_chunks, "zstd frame"),
              ".gz": (GZIP_MAGIC, check_gzip_magic, gzip_chunks, "gzip member")}


def compression(path: str):
    """COMPRESSED's entry for `path`, or None for a plain file."""
    return next((v for suffix, v in COMPRESSED.items() if path.endswith(suffix)), None)


def plain_chunks(raw) -> Iterator[Tuple[int, bytes]]:
    while True:
        data = raw.read(READ_BYTES)
        if not data:
            return
        yield 0, data
