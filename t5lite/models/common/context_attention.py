"""jax.nn's attention (ATTENTION_IMPL 'dot_product' or 'cudnn') under context parallelism.

jax's cuDNN attention is partitioned by a rule that wants the queries, keys and values
sharded alike, which a context axis breaks (its queries are split along the sequence, its
keys and values whole), and that rule cannot run inside a shard_map over some axes only.
So the attention runs inside a `shard_map` over the whole mesh, each operand split as
the logical-axis rules say (batch, heads over `tensor` where both head counts divide,
queries' length over `context`): each device all-gathers the keys and values of its
context group in their own dtype, attends with its slice of the queries over the whole
sequence (cuDNN's kernel then runs on local arrays), and keeps its slice of the output;
the all-gather's gradient is a reduce-scatter. The mask (dense, [batch, 1, q, k]) and a
bias ([batch or 1, heads, q, k]) arrive split along their queries.

    out = attend_over_context(attend, q, k, v, bias, mask)   # [batch, length, heads, kv]
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P

from t5lite.models.common.layers import splits_evenly

Array = jax.Array

AXIS = "context"


def _spec(shape: Sequence[int], names: Sequence[Optional[str]]) -> P:
    """The mesh axes of an array with logical `names` under the rules traced under, a
    dimension they do not divide left whole."""
    axes = nn.logical_to_mesh_axes(tuple(names))
    return P(*(a if n is not None and splits_evenly(size, n) else None
               for size, n, a in zip(shape, names, axes)))


def attend_over_context(attend: Callable[..., Array], q: Array, k: Array, v: Array,
                        bias: Optional[Array], mask: Optional[Array]) -> Array:
    """`attend(q, k, v, bias, mask)` on each device: q [batch, length, heads, kv] its
    slice of the queries, k / v [batch, kv_length, kv_heads, kv] the whole sequence's
    (gathered here from each device's slice), bias and mask their rows of the queries.
    Returns [batch, length, heads, kv], split as q is."""
    # query heads split only where their key heads split alike (GQA)
    heads = "heads" if splits_evenly(q.shape[2], "heads") and splits_evenly(
        k.shape[2], "heads") else None
    tokens = _spec(q.shape, ("batch", "length", heads, "kv"))
    keys = _spec(k.shape, ("batch", "length", heads, "kv"))
    operands, specs = [q, k, v], [tokens, keys, keys]
    if bias is not None:
        operands.append(bias)
        specs.append(_spec(bias.shape, ("batch" if bias.shape[0] > 1 else None, heads,
                                        "length", None)))
    if mask is not None:
        operands.append(mask)
        specs.append(_spec(mask.shape, ("batch", None, "length", None)))

    def local(q, k, v, *extras):
        k = jax.lax.all_gather(k, AXIS, axis=1, tiled=True)
        v = jax.lax.all_gather(v, AXIS, axis=1, tiled=True)
        it = iter(extras)
        b = next(it) if bias is not None else None
        m = next(it) if mask is not None else None
        return attend(q, k, v, b, m)

    return jax.shard_map(local, in_specs=tuple(specs), out_specs=tokens,
                         check_vma=False)(*operands)
