"""Attention masks: which keys each query attends to (True: attend).

Two forms, chosen by the ATTENTION_MASK switch (`make_mask`):

- 'dense': a boolean [batch, 1, q_length, kv_length] array, built once a stack and read
  by every layer (`attention_mask`; `decode_mask` for decoding against a KV cache);
- 'lengths': `MaskIds`, the ids the mask is made of (validity [batch, q_length] /
  [batch, kv_length], packed-segment ids or None, causality). Each layer's attention
  builds what its kernel takes from them: the einsum path the same boolean inside its
  softmax's fusion, `jax.nn.dot_product_attention` (cuDNN) sequence lengths and a causal
  flag when nothing is packed, so no [batch, heads, q, k] bias is ever made from a mask.

Lengths assume every row's valid tokens come first (right padding), as t5lite's
batches always have them; a packed batch keeps its segment ids (dense inside the layer).

A sliding window (`window`, Mistral's): a causal query also sees only the `window`
latest tokens, itself included (key position > query position - window), by places or
by positions as causality is.
"""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
NEG_INF = -1e10  # added to masked attention logits


def attention_mask(q_valid: Array, k_valid: Array, causal: bool = False,
                   q_segments: Optional[Array] = None,
                   k_segments: Optional[Array] = None,
                   q_positions: Optional[Array] = None,
                   k_positions: Optional[Array] = None,
                   window: Optional[int] = None) -> Array:
    """Boolean mask [batch, 1, q, k] from validity [batch, q] / [batch, k], optional
    causality and packed-segment ids (attention only within one segment). Causal by
    the tokens' places, or with positions [batch, q] / [batch, k] by those (a sequence
    kept out of order: `context_order`); a causal mask with `window` sees only the
    `window` latest tokens."""
    mask = q_valid[:, None, :, None] & k_valid[:, None, None, :]
    if causal and q_positions is not None:
        ahead = q_positions[:, None, :, None] - k_positions[:, None, None, :]
        mask = mask & (ahead >= 0)
        if window is not None:
            mask = mask & (ahead < window)
    elif causal:
        q_len, k_len = q_valid.shape[1], k_valid.shape[1]
        ahead = np.arange(q_len)[:, None] - np.arange(k_len)[None, :]
        near = ahead >= 0
        if window is not None:
            near = near & (ahead < window)
        mask = mask & jnp.asarray(near)[None, None]
    if q_segments is not None and k_segments is not None:
        mask = mask & (q_segments[:, None, :, None] == k_segments[:, None, None, :])
    return mask


def decode_mask(q_positions: Array, k_length: int, window: Optional[int] = None) -> Array:
    """Causal mask for decoding against a KV cache: query at position p (q_positions
    [batch, q]) sees cache slots 0..p (with `window`: p - window + 1..p). Returns bool
    [batch, 1, q, k_length]."""
    ahead = q_positions[:, :, None] - jnp.arange(k_length)[None, None, :]
    seen = ahead >= 0
    if window is not None:
        seen = seen & (ahead < window)
    return seen[:, None]


@flax.struct.dataclass
class MaskIds:
    """A mask as the ids it is made of (ATTENTION_MASK='lengths'); a pytree, so it passes
    through scanned and rematerialized layers like the dense mask."""

    q_valid: Array                       # [batch, q_length] bool
    k_valid: Array                       # [batch, kv_length] bool
    q_segments: Optional[Array] = None   # [batch, q_length] packed-segment ids, or None
    k_segments: Optional[Array] = None   # [batch, kv_length]
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    q_positions: Optional[Array] = None  # [batch, q_length]: causal by these, not places
    k_positions: Optional[Array] = None  # [batch, kv_length]
    window: Optional[int] = flax.struct.field(pytree_node=False, default=None)

    def dense(self) -> Array:
        """The same mask as `attention_mask` builds: bool [batch, 1, q, k]."""
        return attention_mask(self.q_valid, self.k_valid, self.causal, self.q_segments,
                              self.k_segments, self.q_positions, self.k_positions,
                              self.window)

    @property
    def packed(self) -> bool:
        return self.q_segments is not None and self.k_segments is not None

    @property
    def needs_dense(self) -> bool:
        """Whether only the dense mask says it: packed rows, or a sequence out of order."""
        return self.packed or self.q_positions is not None

    def lengths(self):
        """(query lengths, key lengths), int32 [batch] each: the valid tokens a row."""
        return (jnp.sum(self.q_valid, axis=-1, dtype=jnp.int32),
                jnp.sum(self.k_valid, axis=-1, dtype=jnp.int32))


def make_mask(kind: str, q_valid: Array, k_valid: Array, causal: bool = False,
              q_segments: Optional[Array] = None, k_segments: Optional[Array] = None,
              q_positions: Optional[Array] = None, k_positions: Optional[Array] = None,
              window: Optional[int] = None):
    """The mask in the form ATTENTION_MASK names ('dense' | 'lengths')."""
    if kind == "lengths":
        return MaskIds(q_valid, k_valid, q_segments, k_segments, causal, q_positions,
                       k_positions, window)
    return attention_mask(q_valid, k_valid, causal, q_segments, k_segments, q_positions,
                          k_positions, window)


def as_dense(mask):
    """A dense boolean mask (or None) from either form."""
    return mask.dense() if isinstance(mask, MaskIds) else mask
