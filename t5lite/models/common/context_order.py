"""The order a causal sequence is kept in under context parallelism: load-balanced.

Context parallelism (the mesh's `context` axis) gives each of its S devices a contiguous
slice of every sequence. Under a causal mask the first slice's queries see few keys and
the last slice's see them all, so a kernel that skips masked blocks (cuDNN's, a flash
attention) would keep the last device busy while the first waits. As Megatron and
MaxText do, the sequence is cut into 2S chunks and device i holds chunks i and 2S-1-i,
one from the front and one from the back: every device then has the same share of the
triangle.

The training loss is a sum over tokens, so the batch's [batch, length] features are
reordered once before the network (`reorder`) and never put back; the network masks by
the tokens' own positions (`decoder_positions`, reordered with them), not their places.

    order = balanced_order(8, 2)    # [0, 1, 6, 7 | 2, 3, 4, 5]: device 0, device 1
"""
from __future__ import annotations

from typing import Dict, Mapping

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def context_size() -> int:
    """Devices on the `context` axis of the mesh being traced under (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else int(dict(mesh.shape).get("context", 1))


def balanced_order(length: int, shards: int) -> np.ndarray:
    """int32 [length]: the token indices in the order that gives shard i chunks i and
    2 * shards - 1 - i of 2 * shards equal chunks (`length` must divide into them)."""
    if length % (2 * shards):
        raise ValueError(f"a sequence of {length} tokens does not cut into {2 * shards} "
                         f"equal chunks")
    chunks = np.arange(length, dtype=np.int32).reshape(2 * shards, -1)
    return np.concatenate([np.concatenate([chunks[i], chunks[2 * shards - 1 - i]])
                           for i in range(shards)])


def reorder(batch: Mapping[str, Array], order: np.ndarray) -> Dict[str, Array]:
    """Every [batch, length] feature of `batch` taken in `order` along its length; the
    positions made explicit first (0..length-1) where the batch has none."""
    length = len(order)
    out = dict(batch)
    if "decoder_positions" not in out:
        rows = out["decoder_target_tokens"].shape[0]
        out["decoder_positions"] = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                                    (rows, length))
    index = jnp.asarray(order)
    return {k: (jnp.take(v, index, axis=1) if v.ndim == 2 and v.shape[1] == length else v)
            for k, v in out.items()}
