"""What the resumable readers (jsonl_cursor.py, parquet_cursor.py) share: a position's
shape and start, the counters the tests measure a resume's cost with, a file's
identity, and what to do when a saved position cannot be used."""
from __future__ import annotations

import collections
import hashlib
import os
from typing import Tuple

Position = Tuple[int, int, int, int, int, int]
START: Position = (0, 0, 1, 0, 0, 0)
FINGERPRINT_BYTES = 1 << 16  # hashed at each end of a file
RESUME_ANYWAY = ("to resume anyway, delete the data_iterator directory of the checkpoint "
                 "you resume from: the run then rebuilds the stream and skips the batches "
                 "already trained on")
STATS: collections.Counter = collections.Counter()


def file_identity(path: str) -> Tuple[int, int]:
    """(size in bytes, fingerprint): a hash of the file's size and its first and last
    FINGERPRINT_BYTES, as a positive int64 (a copy of the file has the same identity; an
    appended, truncated or replaced file almost surely another)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest = hashlib.blake2b(str(size).encode(), digest_size=7)
        digest.update(f.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(size - FINGERPRINT_BYTES, FINGERPRINT_BYTES))
            digest.update(f.read())
    return size, int.from_bytes(digest.digest(), "big")
