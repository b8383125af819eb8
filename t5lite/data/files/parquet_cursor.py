"""Reading a .parquet file's text column from a saved position, row group by row group:
the Parquet side of the resumable reader (jsonl_cursor.CursorPool opens it for a
`.parquet` path; FineWeb, FineWeb-Edu and DCLM ship their text this way).

A position is jsonl_cursor's six integers, read as:

    frame   the row group that holds the next row
    offset  the next row's index within that row group
    line    the next row's number in the file (1-based; error messages name it)
    record  how many rows come before it (the shard rule: a reader keeps record k only
            when k % num_shards == shard_index)
    size, fingerprint   which file the position belongs to, as for a JSON-lines file

Only the text column is read, one row group at a time. Cost of starting at a position:
the file's footer, then the row group that holds it (its text column), whatever was
read before. A row whose text is null, a file without the column, or a column that is
not text is one error naming the file (and the row).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from t5lite.data.files.positions import RESUME_ANYWAY, STATS
from t5lite.errors import DataError, DataFormatError, DataNotFoundError

PARQUET_FORMAT = "a Parquet file with a string column of the texts"


class ParquetRows:
    """The rows of one .parquet file from a position on (jsonl_cursor._Lines' interface:
    next_line, parse, blank, position, line, record, close). `identity` is the file's
    (size, fingerprint) as it is now."""

    def __init__(self, path: str, position, identity: Tuple[int, int], field: str):
        try:
            import pyarrow
            import pyarrow.parquet as pq
        except ImportError:  # pragma: no cover - pyarrow is a dependency
            raise DataFormatError(f"{path}: reading Parquet files needs pyarrow "
                                  f"(pip install pyarrow)") from None
        self.path, self.identity, self.field = path, identity, field
        self.group, self.row, self.line, self.record = (int(p) for p in position[:4])
        try:
            self._file = pq.ParquetFile(path)
        except FileNotFoundError:
            raise DataNotFoundError(f"{path}: the file is gone (it was listed when the "
                                    f"data set was built); restore it") from None
        except (pyarrow.ArrowException, OSError) as e:
            raise DataFormatError(f"{path}: not a readable Parquet file "
                                  f"({str(e).splitlines()[0]}); expected {PARQUET_FORMAT}") \
                from None
        schema = self._file.schema_arrow
        if field not in schema.names:
            raise DataFormatError(f"{path}: no column {field!r} (its columns: "
                                  f"{', '.join(schema.names)}); set TEXT_FIELD to the column "
                                  f"of the texts")
        kind = schema.field(field).type
        if not (pyarrow.types.is_string(kind) or pyarrow.types.is_large_string(kind)):
            raise DataFormatError(f"{path}: column {field!r} holds {kind}, not text; "
                                  f"expected {PARQUET_FORMAT}")
        meta = self._file.metadata
        self._sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._values: Optional[List[Optional[str]]] = None
        self._check_fit(position)

    def _check_fit(self, position) -> None:
        if self.group > len(self._sizes) or (self.group == len(self._sizes) and self.row):
            raise self._misfit(position, f"the file has {len(self._sizes)} row groups")
        if self.group < len(self._sizes) and 0 < self.row >= self._sizes[self.group]:
            raise self._misfit(position, f"row group {self.group} has "
                                         f"{self._sizes[self.group]} rows")
        if self.line != sum(self._sizes[:self.group]) + self.row + 1:
            raise self._misfit(position, f"row {self.row} of row group {self.group} is row "
                                         f"{sum(self._sizes[:self.group]) + self.row + 1} "
                                         f"of the file, not {self.line}")

    def _misfit(self, position, why: str) -> DataError:
        group, row, line = (int(p) for p in position[:3])
        return DataError(
            f"{self.path}: the saved data position (row {row} of row group {group}, row "
            f"{line} of the file) does not fit the file ({why}), which is the file the "
            f"position was saved in (same size, {self.identity[0]} bytes, and "
            f"fingerprint): this is a t5lite bug, please report it; {RESUME_ANYWAY}")

    @property
    def position(self):
        return (self.group, self.row, self.line, self.record) + self.identity

    def close(self) -> None:
        self._values = None

    def next_line(self) -> Optional[Tuple[str, ...]]:
        """The next row's text (as a 1-tuple: a null is a row too), or None at the end."""
        while self.group < len(self._sizes):
            if self._values is None:
                table = self._file.read_row_group(self.group, columns=[self.field])
                self._values = table.column(0).to_pylist()
                STATS["row_groups_read"] += 1
            if self.row < len(self._values):
                value = self._values[self.row]
                self.row += 1
                self.line += 1
                if self.row == len(self._values):
                    self.group, self.row, self._values = self.group + 1, 0, None
                return (value,)
            self.group, self.row, self._values = self.group + 1, 0, None
        return None

    @staticmethod
    def blank(unit) -> bool:
        return False  # every row is a record

    def parse(self, unit, field: str) -> str:
        """The text of the row just read; DataFormatError for a null."""
        if unit[0] is None:
            raise DataFormatError(f"{self.path}: row {self.line - 1}: the {field!r} column is "
                                  f"null; expected {PARQUET_FORMAT}")
        return unit[0]
