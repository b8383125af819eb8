"""The global stream as DATA_SHARDS fixed shards, whatever the process count.

    plan = ShardPlan(batch_size=8, count=2, start=0, stop=8)   # one process, 2 shards
    plan.shards, plan.rows_per_shard, plan.offset               # range(0, 2), 4, 0
    ShardPlan(8, count=2, start=4, stop=8).shards               # process 1 of 2: range(1, 2)

A global batch of B rows is the concatenation, in shard order, of batch i of each of S
shard streams: shard s reads seqio shard s of S of the data (`seqio.ShardInfo`), B / S
rows a batch. A process that trains on rows [start, stop) of every batch (its
`DataLayout`) reads the shards those rows fall in and keeps its rows:

- S a multiple of the number of data feeds P (the default, S = P of the run that
  started the stream, is one): S / P whole shards, nothing read twice;
- fewer shards than feeds (a run grown from P = 1 to 2 without DATA_SHARDS): whole shards
  of which it keeps a part; the other rows are read and dropped, P / S times the reading.

So the stream is the same for every P that divides B, and a checkpoint's per-shard
iterator states resume it on any of them. A shard's state is saved by the process whose
rows begin it (`owns`), read back by every process that reads the shard.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, Optional, Sequence

import numpy as np

from t5lite.errors import check_positive_int


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """batch_size: global rows a step; count: S, the data shards; [start, stop): the rows
    of each global batch this process trains on. ValueError when S does not divide the
    batch or the rows fall outside it."""

    batch_size: int
    count: int
    start: int
    stop: int

    def __post_init__(self):
        batch = check_positive_int("batch_size", self.batch_size, error=ValueError)
        count = check_positive_int("DATA_SHARDS", self.count, error=ValueError)
        if batch % count:
            raise ValueError(f"DATA_SHARDS={count} does not divide the batch size {batch}: "
                             f"choose a divisor of BATCH_SIZE")
        if not 0 <= self.start < self.stop <= batch:
            raise ValueError(f"rows [{self.start}, {self.stop}) are not rows of a batch of "
                             f"{batch}")

    @property
    def rows_per_shard(self) -> int:
        return self.batch_size // self.count

    @property
    def shards(self) -> range:
        """The shards this process reads, in order."""
        r = self.rows_per_shard
        return range(self.start // r, (self.stop - 1) // r + 1)

    @property
    def offset(self) -> int:
        """Where this process's rows begin in the concatenation of its shards' rows."""
        return self.start - self.shards.start * self.rows_per_shard

    @property
    def read_factor(self) -> float:
        """Rows read per row trained on (1.0: no shard is read only in part)."""
        return len(self.shards) * self.rows_per_shard / (self.stop - self.start)

    def owns(self, shard: int) -> bool:
        """Whether this process saves `shard`'s state: its rows hold the shard's first."""
        return self.start <= shard * self.rows_per_shard < self.stop

    def rows_of(self, shard_batches: Sequence[Iterator[Dict[str, np.ndarray]]]
                ) -> Iterator[Dict[str, np.ndarray]]:
        """This process's rows of each global batch, from the batches of its `shards`
        (one iterator each, in order): concatenated in shard order, cut to [start, stop).
        Ends when a shard's batches end (a stream that ends reads one shard)."""
        begin, end = self.offset, self.offset + self.stop - self.start
        whole = len(shard_batches) == 1 and self.read_factor == 1
        while True:
            parts = []
            for batches in shard_batches:
                try:
                    parts.append(next(batches))
                except StopIteration:
                    return
            if whole:
                yield parts[0]
            else:
                yield {k: np.concatenate([p[k] for p in parts])[begin:end] for k in parts[0]}


def shards_for(layout, count: int) -> Optional[range]:
    """The data shards of `count` that the process of `layout` (a DataLayout) reads; None
    when `count` does not cut its batch (that stream cannot continue here)."""
    try:
        return ShardPlan(layout.batch_size, count, layout.start, layout.stop).shards
    except ValueError:
        return None
