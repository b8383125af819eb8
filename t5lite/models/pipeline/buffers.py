"""The pipeline's data movement: a batch cut into microbatches where its rows already lie,
and the [stages, ...] slots moved between stages by collective permutes.

Outside the pipeline the batch is split over its mesh axes, the stage axes last (minor):
D data shards (data x fsdp x expert) x S stages, each device a block of B / (D S) rows.
Microbatch (s, k) of the M = S K microbatches takes, from each data shard d, sub-block k of
the block (d, s): so stage s already holds its K microbatches, each split over the data
shards as a microbatch is within a stage, and cutting the batch or joining it again moves
no row between devices.

Needs nothing of t5lite (jax only).
"""
from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def to_microbatches(a: jax.Array, axis: int, stages: int, per_stage: int,
                    shards: int) -> jax.Array:
    """[..., B, ...] (the batch at `axis`) -> [stages, per_stage, ..., B / M, ...]."""
    d, s, k = shards, stages, per_stage
    rows = a.shape[axis] // (d * s * k)
    a = a.reshape(a.shape[:axis] + (d, s, k, rows) + a.shape[axis + 1:])
    a = jnp.moveaxis(a, (axis + 1, axis + 2), (0, 1))  # [s, k, ..., d, rows, ...]
    return a.reshape(a.shape[:axis + 2] + (d * rows,) + a.shape[axis + 4:])


def from_microbatches(a: jax.Array, axis: int, shards: int) -> jax.Array:
    """Inverse of `to_microbatches` ([stages, per_stage, ..., mb, ...] -> [..., B, ...],
    `axis` the batch's axis in the result)."""
    s, k, mb = a.shape[0], a.shape[1], a.shape[axis + 2]
    a = a.reshape(a.shape[:axis + 2] + (shards, mb // shards) + a.shape[axis + 3:])
    a = jnp.moveaxis(a, (0, 1), (axis + 1, axis + 2))  # [..., d, s, k, rows, ...]
    return a.reshape(a.shape[:axis] + (s * k * mb,) + a.shape[axis + 4:])


def permute(a: jax.Array, axes: Tuple[str, ...], stages: int, offset: int) -> jax.Array:
    """[stages, ...] sharded over `axes` -> stage s's slice at stage s + offset (mod the
    stages): one collective permute."""
    offset %= stages
    if offset == 0:
        return a
    spec = P(axes if len(axes) > 1 else axes[0])
    perm = [(i, (i + offset) % stages) for i in range(stages)]
    move = jax.shard_map(lambda x: jax.lax.ppermute(x, axes, perm), in_specs=spec,
                         out_specs=spec, axis_names=set(axes))
    return move(a)


def where_stage(cond: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """a where cond [stages] holds, else b; a and b [stages, ...]."""
    return jnp.where(cond.reshape(cond.shape + (1,) * (a.ndim - 1)), a, b)


def rotate_column(buffer: jax.Array, column: jax.Array, new_last: jax.Array,
                  axes: Tuple[str, ...]) -> jax.Array:
    """buffer [stages, per_stage, ...]: its `column` moved down one stage (stage s takes
    stage s + 1's slot; stage 0's, read by now, leaves), the last stage's slot taking the
    last stage's slot of `new_last` [stages, ...]."""
    stages = buffer.shape[0]
    moved = permute(buffer[:, column], axes, stages, -1)
    last = jnp.arange(stages) == stages - 1
    return buffer.at[:, column].set(where_stage(last, new_last, moved))
