"""Which rows of each global batch this process reads: one answer, computed by the
partitioner from the batch sharding (`Partitioner.data_layout`, T5X's
`get_data_layout`), and used by every reader (`pipeline.SeqioIterator`,
`synthetic.SyntheticIterator`, an inference `Session`).

    layout = DataLayout(batch_size=2048, shard_index=1, shard_count=4)
    layout.rows, layout.start, layout.stop      # 512, 512, 1024

A batch is split into `shard_count` data shards of `rows` rows; this process feeds shard
`shard_index`, rows [shard_index * rows, (shard_index + 1) * rows). With the batch split
over every process the shard index is the process index; processes that hold the same
rows (a model-parallel axis across hosts) share a shard.

The layout carries the batch size from where it is first split (BATCH_SIZE is checked
once, at the edge: `TrainData`, `evaluate`, `infer`; whether it divides over the data
shards and microbatches once, in `Partitioner.data_layout`) to every reader and to
`Partitioner.host_to_global`, which takes the layout rather than the size again.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from t5lite.errors import check_positive_int


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """batch_size: global rows per step; this process reads shard `shard_index` of
    `shard_count` equal shards. ValueError when they do not make one."""

    batch_size: int
    shard_index: int = 0
    shard_count: int = 1

    def __post_init__(self):
        batch_size = check_positive_int("batch_size", self.batch_size, error=ValueError)
        shard_count = check_positive_int("shard_count", self.shard_count, error=ValueError)
        if isinstance(self.shard_index, bool) or \
                not isinstance(self.shard_index, (int, np.integer)) or \
                not 0 <= self.shard_index < shard_count:
            raise ValueError(f"shard_index {self.shard_index!r} is out of range for "
                             f"shard_count {shard_count}")
        if batch_size % shard_count:
            raise ValueError(
                f"batch size {batch_size} is not divisible by the data shard count "
                f"{shard_count}: choose a global BATCH_SIZE that is a multiple of "
                f"{shard_count}")
        object.__setattr__(self, "batch_size", batch_size)
        object.__setattr__(self, "shard_index", int(self.shard_index))
        object.__setattr__(self, "shard_count", shard_count)

    @property
    def rows(self) -> int:
        """Rows of each batch this process reads."""
        return self.batch_size // self.shard_count

    @property
    def start(self) -> int:
        return self.shard_index * self.rows

    @property
    def stop(self) -> int:
        return self.start + self.rows
