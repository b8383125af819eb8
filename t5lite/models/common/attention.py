"""Attention: relative position bias (T5), and the multi-head / grouped-query `Attention`
module with its KV cache and fused-kernel paths; RoPE (`t5lite.models.common.rope`) and
Qwen3's per-head query / key norms applied inside it.

Shapes use the logical axis names of `t5lite.models.common.layers` (`batch`, `q_length`,
`kv_length`, `heads`, `kv`, `embed`, `stack`, `relpos_buckets`); masks
(`t5lite.models.common.masks`) are [batch, 1, q_length, kv_length] booleans (True: attend) or
`MaskIds`, which each kernel turns into what it takes.
"""
from __future__ import annotations

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from t5lite.models.common import te_backend
from t5lite.models.common.context_attention import attend_over_context
from t5lite.models.common.context_order import context_size
from t5lite.models.common.layers import Dense, Layout, RMSNorm, gemm_input_views
from t5lite.models.lora import LoraSpec
from t5lite.models.common.masks import NEG_INF, MaskIds, as_dense
from t5lite.models.common.rope import Rope, apply_rope

Array = jax.Array


def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bucketing of (key position - query position); float32 arithmetic as in T5."""
    ret = np.zeros_like(relative_position)
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(np.int64) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    n_large = np.maximum(n, max_exact).astype(np.float32)  # log only where not small
    large = (np.log(n_large / np.float32(max_exact))
             / np.float32(math.log(max_distance / max_exact))
             * np.float32(num_buckets - max_exact))
    large = max_exact + np.where(is_small, 0, large).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return ret + np.where(is_small, n, large)


class RelativePositionBias(nn.Module):
    """One table [heads, relpos_buckets] per stack; returns bias [1, heads, q, k] (float32)."""

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True

    @nn.compact
    def __call__(self, q_length: int, k_length: int,
                 q_positions: Optional[Array] = None) -> Array:
        """Without `q_positions`: queries 0..q_length-1 -> bias [1, heads, q, k].
        With `q_positions` [batch, q] (int; decoding): one row per query at its own
        position, over keys 0..k_length-1 -> bias [batch, heads, q, k]."""
        table = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(nn.initializers.normal(1.0 / math.sqrt(self.num_buckets)),
                                         ("heads", "relpos_buckets")),
            (self.num_heads, self.num_buckets), jnp.float32)
        if q_positions is None:
            rel = np.arange(k_length)[None, :] - np.arange(q_length)[:, None]
            buckets = relative_position_bucket(rel, self.bidirectional, self.num_buckets,
                                               self.max_distance)
            return jnp.take(table, jnp.asarray(buckets, jnp.int32), axis=1)[None]
        # Buckets of every relative position -(k_length-1)..k_length-1, computed once in
        # numpy (the same arithmetic as above), then gathered at key - query.
        span = np.arange(-(k_length - 1), k_length)
        by_offset = jnp.asarray(relative_position_bucket(
            span, self.bidirectional, self.num_buckets, self.max_distance), jnp.int32)
        rel = jnp.arange(k_length)[None, None, :] - q_positions[:, :, None]  # [b, q, k]
        buckets = jnp.take(by_offset, rel + (k_length - 1), axis=0)
        return jnp.moveaxis(jnp.take(table, buckets, axis=1), 0, 1)  # [b, heads, q, k]


# ----------------------------------------------------------------------------- attention


class Attention(nn.Module):
    """Multi-head / grouped-query dot-product attention.

    x_q: [batch, q_length, embed] (or [q_length, batch, embed] in the SB layout);
    x_kv: same with kv_length, or a pair of views of it (`layers.gemm_input_views`) for
    the key and the value projections; bias: float32 [1|batch, heads, q, k] or None;
    mask: bool [batch, 1, q, k], `MaskIds` or None. Returns the same layout as x_q.
    `logits_dtype`: the einsum path's scores, bias and softmax (float32, or bfloat16 as
    T5X's GPU runs computed them).

    With `decode=True` the module keeps a KV cache in the flax collection "cache":
    `cached_key` / `cached_value` [batch, max_length, kv_heads, kv] ([max_length, batch,
    ...] in the SB layout), holding keys and values after projection (and RoPE), so the
    fused / unfused kernel layout does not matter. The first decode-mode call, with no
    cache yet, creates it (needs `mutable=["cache"]`): a self-attention sizes it from its
    input (call it with a full-length input; the cache starts as zeros), a
    cross-attention stores the projected encoder keys and values once. Later calls:

    - self-attention: x_q holds the new tokens at `q_positions` ([batch, q], or [q, batch]
      in the SB layout; consecutive per row). Their keys/values are written into the
      cache at those positions and the queries attend over the whole cache; `mask` and
      `bias` must then be [.., q, max_length] (`decode_mask`, and
      `RelativePositionBias(..., q_positions=...)`).
    - cross-attention: x_kv is not read again; keys/values come from the cache.

    Decoding always uses the einsum attention (any `attention_impl`).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    layout: Layout
    dtype: jnp.dtype = jnp.bfloat16
    is_cross: bool = False
    fuse_qkv: bool = False
    use_bias: bool = False
    fp8: str = ""
    logits_scale: float = 1.0
    query_init_scale: float = 1.0
    dropout_rate: float = 0.0
    deterministic: bool = True
    attention_impl: str = "xla"
    logits_dtype: jnp.dtype = jnp.float32
    causal: bool = False  # a causal self-attention (its mask is causal; TE must know it)
    rope: Optional[Rope] = None  # RoPE on queries and keys (at their positions)
    qkv_bias: bool = False  # biases on the query / key / value projections (Qwen2)
    # RMSNorm over each head's query and key (scale [kv] each) before RoPE (Qwen3), with
    # this epsilon; None: none
    qk_norm_epsilon: Optional[float] = None
    decode: bool = False
    lora: Optional[LoraSpec] = None  # low-rank adapters on the projections it names

    def _dense(self, features, axes, name, n_in=1, init_scale=1.0, target=None, adapters=0):
        """A projection; adapted when LoRA names `target` (default: its name). A fused
        kernel keeps `adapters` adapters, one per projection (`lora.slot_adapters`)."""
        spec = self.lora and self.lora.for_target(target or name)
        bias = self.use_bias or (self.qkv_bias and name != "out")
        return Dense(features=features, kernel_axes=axes, n_in=n_in, dtype=self.dtype,
                     use_bias=bias, fp8=self.fp8, init_scale=init_scale,
                     lora=spec, lora_adapters=adapters if spec else 0,
                     deterministic=self.deterministic, name=name)

    def _project(self, x_q: Array, x_kv):
        """q [.., heads, kv], k / v [.., kv_heads, kv]; k, v are None when x_kv is None
        (a cross-attention reading its cache)."""
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        group = h // hkv
        if self.fuse_qkv and not self.is_cross:
            y = self._dense((group + 2, hkv, d), ("embed", "stack", "heads", "kv"), "qkv",
                            target="query", adapters=3)(x_q)
            y = checkpoint_name(y, "qkv_proj")
            q = jnp.swapaxes(y[..., :group, :, :], -3, -2)  # [..., hkv, group, d]
            q = q.reshape(q.shape[:-3] + (h, d))
            return q, y[..., group, :, :], y[..., group + 1, :, :]
        if x_kv is x_q:  # self-attention: three GEMMs read one input
            x_q, x_k, x_v = gemm_input_views(x_q, 3)
        elif isinstance(x_kv, tuple):
            x_k, x_v = x_kv
        else:  # two readers: XLA adds their gradients in place as they are
            x_k = x_v = x_kv
        q = self._dense((h, d), ("embed", "heads", "kv"), "query",
                        init_scale=self.query_init_scale)(x_q)
        q = checkpoint_name(q, "query_proj")
        if x_kv is None:
            return q, None, None
        if self.fuse_qkv:  # cross-attention: one kernel for k and v
            y = self._dense((2, hkv, d), ("embed", "stack", "heads", "kv"), "kv", target="key",
                            adapters=2)(x_k)
            y = checkpoint_name(y, "kv_proj")
            return q, y[..., 0, :, :], y[..., 1, :, :]
        k = checkpoint_name(self._dense((hkv, d), ("embed", "heads", "kv"), "key")(x_k), "key_proj")
        v = checkpoint_name(self._dense((hkv, d), ("embed", "heads", "kv"), "value")(x_v),
                            "value_proj")
        return q, k, v

    @nn.compact
    def __call__(self, x_q: Array, x_kv: Array, bias: Optional[Array] = None,
                 mask: Optional[Array] = None, q_positions: Optional[Array] = None,
                 kv_positions: Optional[Array] = None) -> Array:
        lay = self.layout
        cross_cached = (self.decode and self.is_cross
                        and self.has_variable("cache", "cached_key"))
        # [b, l, heads, kv] (or [l, b, ...])
        q, k, v = self._project(x_q, None if cross_cached else x_kv)
        if self.qk_norm_epsilon is not None:
            q = self._head_norm("query_norm")(q)
            if k is not None:
                k = self._head_norm("key_norm")(k)
        if self.rope is not None:
            q = apply_rope(q, q_positions, self.rope)
            if k is not None:
                k = apply_rope(k, kv_positions, self.rope)
        q = lay.constrain(q, "heads", "kv")
        if k is not None:  # projected from this device's tokens (context parallelism:
            # its slice of the sequence), then made whole: an all-gather of k and v
            k, v = lay.constrain(k, "heads", "kv"), lay.constrain(v, "heads", "kv")
        if self.decode:
            k, v = self._cached_kv(k, v, q_positions)
        # jax.nn's attention under a context axis gathers them itself (context_attention)
        over_context = (not self.decode and self.attention_impl in ("dot_product", "cudnn")
                        and context_size() > 1)
        if not over_context:
            k, v = lay.constrain_keys(k), lay.constrain_keys(v)
        if self.attention_impl == "xla" or self.decode:
            out = self._einsum_attention(q, k, v, bias, as_dense(mask))
        elif self.attention_impl == "te":
            out = self._te_attention(q, k, v, bias, as_dense(mask))
        else:
            out = self._jax_nn_attention(q, k, v, bias, mask, over_context)
        out = lay.constrain(out, "heads", "kv")
        y = self._dense((x_q.shape[-1],), ("heads", "kv", "embed"), "out", n_in=2)(out)
        return checkpoint_name(y, "out_proj")

    def _head_norm(self, name: str) -> RMSNorm:
        """Qwen3's RMSNorm over one head's [kv] features, the same scale for every head."""
        return RMSNorm(epsilon=self.qk_norm_epsilon, dtype=self.dtype, axis="kv", name=name)

    def _cached_kv(self, k: Optional[Array], v: Optional[Array],
                   q_positions: Optional[Array]):
        """Decode mode: the keys and values to attend over. See the class docstring."""
        initialized = self.has_variable("cache", "cached_key")
        if self.is_cross:
            ck = self.variable("cache", "cached_key", lambda: k)
            cv = self.variable("cache", "cached_value", lambda: v)
            return ck.value, cv.value
        ck = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cv = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        if not initialized:  # the cache-creating call: attend over its own input
            return k, v
        if q_positions is None:
            raise ValueError("decoding with a KV cache needs the query positions")
        lay = self.layout
        b_axis = 1 - lay.length_axis
        max_length = ck.value.shape[lay.length_axis]
        start = lay.to_external(q_positions)[:, 0].astype(jnp.int32)  # [batch]
        if k.shape[lay.length_axis] == 1:  # one new token per row: a masked select
            hit = lay.to_internal(jnp.arange(max_length)[None, :] == start[:, None])
            new_k = jnp.where(hit[..., None, None], k, ck.value)
            new_v = jnp.where(hit[..., None, None], v, cv.value)
        else:  # a block of tokens per row (prefill)
            def write(cache, x):
                return jax.vmap(
                    lambda c, xi, s: jax.lax.dynamic_update_slice_in_dim(c, xi, s, axis=0),
                    in_axes=(b_axis, b_axis, 0), out_axes=b_axis)(cache, x, start)

            new_k, new_v = write(ck.value, k), write(cv.value, v)
        ck.value = lay.constrain_keys(new_k.astype(ck.value.dtype))
        cv.value = lay.constrain_keys(new_v.astype(cv.value.dtype))
        return ck.value, cv.value

    def _einsum_attention(self, q, k, v, bias, mask):
        """Plain XLA attention; scores and softmax in `logits_dtype`. q [.., h, d], k/v
        [.., hkv, d]."""
        h, hkv = self.num_heads, self.num_kv_heads
        g = h // hkv
        bl = "lb" if self.layout.transposed else "bl"
        qs = bl.replace("l", "q")
        ks = bl.replace("l", "k")
        q = q.reshape(q.shape[:-2] + (hkv, g, self.head_dim))
        dtype = jnp.dtype(self.logits_dtype)
        logits = jnp.einsum(f"{qs}hgd,{ks}hd->bhgqk", q, k, preferred_element_type=dtype)
        if self.logits_scale != 1.0:
            logits = logits * jnp.asarray(self.logits_scale, dtype)
        b, _, _, ql, kl = logits.shape
        if bias is not None:
            logits = logits + bias.reshape(bias.shape[0], hkv, g, ql, kl).astype(dtype)
        if mask is not None:
            logits = jnp.where(mask[:, :, None], logits, NEG_INF)
        probs = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        if self.dropout_rate > 0.0 and not self.deterministic:
            probs = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(probs, deterministic=False)
        out = jnp.einsum(f"bhgqk,{ks}hd->{qs}hgd", probs, v)
        return out.reshape(out.shape[:-3] + (h, self.head_dim))

    def _jax_nn_attention(self, q, k, v, bias, mask, over_context: bool = False):
        """`jax.nn.dot_product_attention` ("cudnn": cuDNN flash attention on GPU;
        "dot_product": whatever jax picks, XLA on CPU). Expects [batch, length, heads, kv].
        A `MaskIds` goes as its causal flag (cuDNN then skips the blocks above the
        diagonal), sequence lengths and sliding window, or packed as the [batch, 1, q, k]
        boolean mask (to jax a bias without a gradient, one for every head). `over_context`: each device of the
        context axis attends with its queries (`context_attention`), the mask dense."""
        if self.layout.transposed:
            q, k, v = (jnp.swapaxes(t, 0, 1) for t in (q, k, v))
        impl = "cudnn" if self.attention_impl == "cudnn" else None
        by_ids = (dict(is_causal=mask.causal and mask.q_positions is None)
                  if isinstance(mask, MaskIds) and not over_context else {})
        if isinstance(mask, MaskIds) and not mask.needs_dense and not over_context:
            q_lengths, k_lengths = mask.lengths()
            by_ids.update(query_seq_lengths=q_lengths, key_value_seq_lengths=k_lengths)
            if mask.window is not None:  # the query and the window - 1 keys before it
                by_ids.update(local_window_size=(mask.window - 1, 0))
            mask = None

        def attend(q, k, v, bias, mask):
            return jax.nn.dot_product_attention(
                q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
                scale=self.logits_scale, implementation=impl, **by_ids)

        if over_context:
            out = attend_over_context(attend, q, k, v, bias, as_dense(mask))
        else:
            out = attend(q, k, v, bias, as_dense(mask))
        return jnp.swapaxes(out, 0, 1) if self.layout.transposed else out

    def _te_attention(self, q, k, v, bias, mask):
        """Transformer Engine's fused attention (`te_backend.attention`); [batch, length,
        heads, kv] inside, either layout outside."""
        if self.layout.transposed:
            q, k, v = (jnp.swapaxes(t, 0, 1) for t in (q, k, v))
        out = te_backend.attention(
            q, k, v, bias, mask, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, scale=self.logits_scale, causal=self.causal,
            dropout_rate=self.dropout_rate, deterministic=self.deterministic)
        return jnp.swapaxes(out, 0, 1) if self.layout.transposed else out
