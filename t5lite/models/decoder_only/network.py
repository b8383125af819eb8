"""Decoder-only transformer: GPT (LayerNorm with bias, learned positions, GELU MLP, biases,
tied or untied output) and LLaMA (RMSNorm, RoPE, SwiGLU, grouped-query attention), with
LLaMA-3.1's RoPE scaling, Mistral's sliding window, Qwen2's query / key / value biases and
Qwen3's per-head query / key norms: one network configured by `DecoderConfig`.

Attention is causal; packed sequences are kept apart by `decoder_segment_ids`. Right
padding needs no mask (causal attention never looks ahead), so token id 0 stays an
ordinary token, as it is in GPT and LLaMA vocabularies.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import lora
from t5lite.models.decoder_only.config import DecoderConfig
from t5lite.models.common.attention import Attention, RelativePositionBias
from t5lite.models.common.masks import attention_mask, decode_mask, make_mask
from t5lite.models.common.layers import (MLP, Dense, Embed, Layout, get_dtype, make_norm, moe_mlp,
                                  residual_add)
from t5lite.models.common.precision import fp8_mode
from t5lite.models.common.stack import run_stack

Array = jax.Array


class DecoderOnlyLayer(nn.Module):
    cfg: DecoderConfig
    deterministic: bool = True
    scanned: bool = False
    decode: bool = False  # KV cache in the self-attention (see attention.Attention)
    moe: bool = False  # a mixture of experts in place of the MLP (`moe.MoeMLP`)

    @nn.compact
    def __call__(self, x: Array, mask: Optional[Array], positions: Array):
        """x [batch, length, embed] (or SB); mask [batch, 1, l, l] or None (causal only is
        then applied); positions [batch, length] (or SB) for RoPE."""
        c = self.cfg
        lay, dtype = Layout(c.transpose_bs), get_dtype(c.dtype)

        def residual(x, y):
            y = nn.Dropout(c.dropout_rate, broadcast_dims=(lay.length_axis,))(
                y, deterministic=self.deterministic)
            return lay.constrain_residual(residual_add(x, y, c.dropout_rate,
                                                       self.deterministic))

        h = make_norm(c.norm_type, c.layer_norm_epsilon, dtype, "pre_self_attention_layer_norm")(x)
        bias = None
        if c.position_embedding == "relative":  # GLaM: T5's causal buckets, a table a layer
            relpos = RelativePositionBias(c.num_heads, c.relpos_num_buckets,
                                          c.relpos_max_distance, bidirectional=False,
                                          name="relpos_bias")
            length = x.shape[lay.length_axis]
            bias = (relpos(length, mask.shape[-1], q_positions=lay.to_external(positions))
                    if self.decode else relpos(length, length))
        h = Attention(
            num_heads=c.num_heads, num_kv_heads=c.kv_heads, head_dim=c.head_dim, layout=lay,
            dtype=dtype, fuse_qkv=c.fuse_qkv, use_bias=c.use_bias, qkv_bias=c.qkv_bias,
            qk_norm_epsilon=c.layer_norm_epsilon if c.qk_norm else None, fp8=fp8_mode(c),
            logits_scale=c.head_dim ** -0.5 if c.scale_attention_logits else 1.0,
            dropout_rate=c.dropout_rate,
            deterministic=self.deterministic, attention_impl=c.attention_impl, causal=True,
            logits_dtype=jnp.dtype(c.attention_logits_dtype),
            rope=c.rope if c.position_embedding == "rope" else None,
            decode=self.decode, lora=lora.spec(c), name="self_attention")(
                h, h, bias, mask, positions, positions)
        x = residual(x, h)
        h = make_norm(c.norm_type, c.layer_norm_epsilon, dtype, "pre_mlp_layer_norm")(x)
        if self.moe:
            h = lay.to_internal(moe_mlp(c, self.deterministic)(lay.to_external(h)))
        else:
            h = MLP(mlp_dim=c.mlp_dim, activations=c.mlp_activations, layout=lay, dtype=dtype,
                    use_bias=c.use_bias, fp8=fp8_mode(c), dropout_rate=c.dropout_rate,
                    deterministic=self.deterministic, lora=lora.spec(c), name="mlp")(h)
        x = residual(x, h)
        return (x, None) if self.scanned else x


class DecoderStack(nn.Module):
    cfg: DecoderConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, positions: Array, deterministic: bool,
                 decode: bool = False) -> Array:
        c, lay = self.cfg, Layout(self.cfg.transpose_bs)
        batch_axis = 1 - lay.length_axis
        x = run_stack(self, DecoderOnlyLayer, c.num_layers, x, (mask, positions), cfg=c,
                      x_axis=batch_axis, x_names=lay.names("activation_embed"),
                      args_axes=(0, batch_axis), deterministic=deterministic, decode=decode,
                      per_layer=lambda i: {"moe": c.is_moe_layer(i)})
        return make_norm(c.norm_type, c.layer_norm_epsilon, get_dtype(c.dtype), "decoder_norm")(x)


class DecoderOnly(nn.Module):
    """Tokens [batch, length] -> float32 logits [batch, length, vocab]."""

    cfg: DecoderConfig

    def setup(self):
        c, dtype = self.cfg, get_dtype(self.cfg.dtype)
        self.token_embedder = Embed(c.vocab_size, c.emb_dim, dtype, init_std=0.02)
        if c.position_embedding == "learned":
            self.position_embedder = Embed(c.max_length, c.emb_dim, dtype, init_std=0.02,
                                           axes=("abspos_buckets", "embed"))
        self.embed_dropout = nn.Dropout(c.dropout_rate,
                                        broadcast_dims=(Layout(c.transpose_bs).length_axis,))
        self.decoder = DecoderStack(c)
        if not c.tie_embeddings:
            self.logits_dense = Dense((c.vocab_size,), ("embed", "vocab"), dtype=dtype, fp8=fp8_mode(c))

    def __call__(self, decoder_input_tokens: Array,
                 decoder_target_tokens: Optional[Array] = None,
                 decoder_segment_ids: Optional[Array] = None,
                 decoder_positions: Optional[Array] = None,
                 decoder_causal_attention: Optional[Array] = None,
                 deterministic: bool = True, decode: bool = False,
                 max_decode_length: Optional[int] = None,
                 causal_by_positions: bool = False) -> Array:
        """decode=True (with mutable "cache"): incremental decoding against a KV cache of
        `max_decode_length` slots; the tokens sit at `decoder_positions` (default
        0..length-1; consecutive within a row). The first call, without a cache, must
        pass length == max_decode_length: it creates the (zero) cache. Segment ids are
        ignored when decoding. decoder_causal_attention [batch, length]: 1 on a prefix-LM
        sequence's prompt positions (BOS and inputs), read when the config's
        `bidirectional_prefix` is on: those positions then attend to each other both ways
        (in decoding, pass it with the prompt block that fills the cache).
        causal_by_positions: the tokens are out of order (`context_order`): the causal
        mask compares their `decoder_positions`, not their places."""
        del decoder_target_tokens  # no padding mask needed: see the module docstring
        c, lay = self.cfg, Layout(self.cfg.transpose_bs)
        batch, length = decoder_input_tokens.shape
        if decoder_positions is None:
            decoder_positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                                 (batch, length))
        prefix = (decoder_causal_attention > 0
                  if c.bidirectional_prefix and decoder_causal_attention is not None else None)
        if decode:
            slots = max_decode_length or length
            mask = decode_mask(decoder_positions, slots, c.sliding_window)
            if prefix is not None:  # the prompt block: its keys sit at slots 0..length-1
                keys = jnp.pad(prefix, ((0, 0), (0, slots - length)))
                mask = mask | (prefix[:, None, :, None] & keys[:, None, None, :])
        else:
            valid = jnp.ones((batch, length), bool)
            by = (decoder_positions,) * 2 if causal_by_positions else (None, None)
            if prefix is None:
                mask = make_mask(c.attention_mask, valid, valid, True, decoder_segment_ids,
                                 decoder_segment_ids, *by, window=c.sliding_window)
            else:  # a prefix LM: causal or within the prefix, only as a dense mask
                mask = (attention_mask(valid, valid, True, decoder_segment_ids,
                                       decoder_segment_ids, *by)
                        | attention_mask(prefix, prefix, False, decoder_segment_ids,
                                         decoder_segment_ids))
        x = self.token_embedder(lay.to_internal(decoder_input_tokens))
        positions = lay.to_internal(decoder_positions)
        if c.position_embedding == "learned":
            x = x + self.position_embedder(positions)
        x = self.embed_dropout(x, deterministic=deterministic)
        x = lay.constrain_residual(x)
        x = self.decoder(x, mask, positions, deterministic, decode)
        if c.tie_embeddings:
            if c.scale_tied_logits:  # GLaM, as T5 1.0: the shared embedding's logits / sqrt(d)
                x = x * jnp.asarray(c.emb_dim ** -0.5, x.dtype)
            logits = self.token_embedder.attend(x)
        else:
            logits = self.logits_dense(x)
        logits = lay.constrain(logits, "vocab")
        return lay.to_external(logits).astype(jnp.float32)
