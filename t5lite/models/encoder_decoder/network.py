"""T5 v1.1 encoder-decoder network (and original T5 through two settings).

Pre-norm RMSNorm layers; one relative-position table per stack (bidirectional in the
encoder, causal in the decoder) shared by its layers; unscaled attention logits (the
1/sqrt(head_dim) lives in the query initializer); gated tanh-GELU MLP; token embedding
shared by encoder and decoder; untied logits kernel unless `logits_via_embedding`.
Padding is token id 0. With NUM_EXPERTS > 0 the config's sparse layers (`is_moe_layer`)
hold a mixture of experts in place of the MLP, in encoder and decoder (Switch
Transformers).
"""
from __future__ import annotations

from typing import ClassVar, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import lora
from t5lite.models.encoder_decoder.config import T5Config
from t5lite.models.common.attention import Attention, RelativePositionBias
from t5lite.models.common.masks import attention_mask, decode_mask, make_mask
from t5lite.models.common.layers import (MLP, Dense, Embed, Layout, RMSNorm, get_dtype, moe_mlp,
                                  residual_add)
from t5lite.models.common.precision import fp8_mode
from t5lite.models.common.stack import run_layers

Array = jax.Array


class _T5Layer(nn.Module):
    """Shared helpers of the encoder and decoder layers."""

    cfg: T5Config
    deterministic: bool = True
    scanned: bool = False
    decode: bool = False  # KV cache in the decoder's attentions (see attention.Attention)
    moe: bool = False  # a mixture of experts instead of the MLP (Switch's sparse layers)
    ENCODER: ClassVar[bool] = False

    @property
    def layout(self) -> Layout:
        return Layout(self.cfg.transpose_bs)

    def norm(self, name: str) -> RMSNorm:
        return RMSNorm(self.cfg.layer_norm_epsilon, get_dtype(self.cfg.dtype), name=name)

    def attention(self, name: str, is_cross: bool, causal: bool = False) -> Attention:
        c = self.cfg
        return Attention(
            num_heads=c.num_heads, num_kv_heads=c.num_heads, head_dim=c.head_dim,
            layout=self.layout, dtype=get_dtype(c.dtype), is_cross=is_cross,
            fuse_qkv=c.fuse_qkv, fp8=fp8_mode(c), logits_scale=1.0,
            query_init_scale=c.head_dim ** -0.5, dropout_rate=c.dropout_rate,
            deterministic=self.deterministic, attention_impl=c.attention_impl,
            logits_dtype=jnp.dtype(c.attention_logits_dtype), causal=causal,
            decode=self.decode, lora=lora.spec(c), name=name)

    def mlp(self, h: Array) -> Array:
        c, lay = self.cfg, self.layout
        if self.moe:
            return lay.to_internal(moe_mlp(c, self.deterministic, self.ENCODER)(
                lay.to_external(h)))
        return MLP(mlp_dim=c.mlp_dim, activations=c.mlp_activations, layout=lay,
                   dtype=get_dtype(c.dtype), fp8=fp8_mode(c), dropout_rate=c.dropout_rate,
                   deterministic=self.deterministic, lora=lora.spec(c), name="mlp")(h)

    def residual(self, x: Array, y: Array) -> Array:
        rate = self.cfg.dropout_rate
        y = nn.Dropout(rate, broadcast_dims=(self.layout.length_axis,))(
            y, deterministic=self.deterministic)
        return self.layout.constrain_residual(residual_add(x, y, rate, self.deterministic))

    def output(self, x: Array):
        return (x, None) if self.scanned else x


class EncoderLayer(_T5Layer):
    ENCODER: ClassVar[bool] = True

    @nn.compact
    def __call__(self, x: Array, bias: Array, mask: Array):
        """x [batch, length, embed] (or SB); bias [1, heads, l, l]; mask [batch, 1, l, l]."""
        h = self.norm("pre_attention_layer_norm")(x)
        x = self.residual(x, self.attention("attention", False)(h, h, bias, mask))
        h = self.norm("pre_mlp_layer_norm")(x)
        return self.output(self.residual(x, self.mlp(h)))


class DecoderLayer(_T5Layer):
    @nn.compact
    def __call__(self, x: Array, encoded: Tuple[Array, Array], bias: Array, self_mask: Array,
                 cross_mask: Array, positions: Optional[Array] = None):
        """x [batch, dec_length, embed]; encoded: the encoder output [batch, enc_length,
        embed] (or SB) twice, the views the key and the value projections read
        (`run_layers`' gemm_reads); positions (decoding only) [batch, dec_length] (or SB):
        where x's tokens sit."""
        h = self.norm("pre_self_attention_layer_norm")(x)
        attention = self.attention("self_attention", False, causal=True)
        x = self.residual(x, attention(h, h, bias, self_mask, positions))
        h = self.norm("pre_cross_attention_layer_norm")(x)
        x = self.residual(
            x, self.attention("encoder_decoder_attention", True)(h, tuple(encoded), None,
                                                                  cross_mask))
        h = self.norm("pre_mlp_layer_norm")(x)
        return self.output(self.residual(x, self.mlp(h)))


def _dropout(cfg: T5Config, x: Array, deterministic: bool) -> Array:
    axis = Layout(cfg.transpose_bs).length_axis
    return nn.Dropout(cfg.dropout_rate, broadcast_dims=(axis,))(x, deterministic=deterministic)


class Encoder(nn.Module):
    cfg: T5Config
    embedder: Embed

    @nn.compact
    def __call__(self, tokens: Array, segment_ids: Optional[Array] = None,
                 deterministic: bool = True) -> Array:
        """tokens [batch, length] -> encoded [batch, length, embed] (SB layout when
        transposed: it stays internal and feeds the decoder's cross-attention)."""
        c, lay = self.cfg, Layout(self.cfg.transpose_bs)
        x = _dropout(c, self.embedder(lay.to_internal(tokens)), deterministic)
        x = lay.constrain_residual(x)
        length = tokens.shape[1]
        bias = RelativePositionBias(c.num_heads, c.relpos_num_buckets, c.relpos_max_distance,
                                    bidirectional=True, name="relpos_bias")(length, length)
        valid = tokens > 0
        mask = make_mask(c.attention_mask, valid, valid, False, segment_ids, segment_ids)
        x = run_layers(EncoderLayer, c.num_encoder_layers, x, (bias, mask), scan=c.scan_layers,
                       remat=c.remat_policy, per_layer=lambda i: {"moe": c.is_moe_layer(i)},
                       period=c.layer_period,
                       cfg=c, deterministic=deterministic)
        x = RMSNorm(c.layer_norm_epsilon, get_dtype(c.dtype), name="encoder_norm")(x)
        return _dropout(c, x, deterministic)


class Decoder(nn.Module):
    cfg: T5Config
    embedder: Embed

    @nn.compact
    def __call__(self, encoded: Array, encoder_tokens: Array, decoder_input_tokens: Array,
                 decoder_target_tokens: Optional[Array] = None,
                 encoder_segment_ids: Optional[Array] = None,
                 decoder_segment_ids: Optional[Array] = None,
                 deterministic: bool = True, decode: bool = False,
                 decoder_positions: Optional[Array] = None,
                 max_decode_length: Optional[int] = None) -> Array:
        """Returns float32 logits [batch, dec_length, vocab].

        decode=True (with mutable "cache"): incremental decoding against the KV cache of
        `max_decode_length` slots; `decoder_positions` [batch, dec_length] say where the
        given tokens sit (default 0..dec_length-1). The first call, without a cache,
        must pass dec_length == max_decode_length: it creates the cache (see
        `attention.Attention`). Segment ids and `decoder_target_tokens` are ignored."""
        c, lay = self.cfg, Layout(self.cfg.transpose_bs)
        batch, length = decoder_input_tokens.shape
        relpos = RelativePositionBias(c.num_heads, c.relpos_num_buckets, c.relpos_max_distance,
                                      bidirectional=False, name="relpos_bias")
        extra = ()
        if decode:
            if decoder_positions is None:
                decoder_positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                                     (batch, length))
            cache_length = max_decode_length or length
            self_mask = decode_mask(decoder_positions, cache_length)
            cross_mask = attention_mask(jnp.ones((batch, length), bool), encoder_tokens > 0)
            bias = relpos(length, cache_length, q_positions=decoder_positions)
            extra = (lay.to_internal(decoder_positions),)
        else:
            valid = (decoder_target_tokens > 0 if decoder_target_tokens is not None
                     else jnp.ones(decoder_input_tokens.shape, bool))
            self_mask = make_mask(c.attention_mask, valid, valid, True, decoder_segment_ids,
                                  decoder_segment_ids)
            cross_mask = make_mask(c.attention_mask, valid, encoder_tokens > 0, False,
                                   decoder_segment_ids, encoder_segment_ids)
            bias = relpos(length, length)
        x = _dropout(c, self.embedder(lay.to_internal(decoder_input_tokens)), deterministic)
        x = lay.constrain_residual(x)
        x = run_layers(DecoderLayer, c.num_decoder_layers, x,
                       (encoded, bias, self_mask, cross_mask) + extra, scan=c.scan_layers,
                       remat=c.remat_policy, per_layer=lambda i: {"moe": c.is_moe_layer(i)},
                       period=c.layer_period, gemm_reads={0: 2},
                       cfg=c, deterministic=deterministic, decode=decode)
        x = RMSNorm(c.layer_norm_epsilon, get_dtype(c.dtype), name="decoder_norm")(x)
        x = _dropout(c, x, deterministic)
        if c.logits_via_embedding:
            logits = self.embedder.attend(x * (c.emb_dim ** -0.5))
        else:
            logits = Dense((c.vocab_size,), ("embed", "vocab"), dtype=get_dtype(c.dtype),
                           fp8=fp8_mode(c), name="logits_dense")(x)
        logits = lay.constrain(logits, "vocab")
        return lay.to_external(logits).astype(jnp.float32)


class T5(nn.Module):
    """Encoder-decoder transformer. Methods `encode` and `decode` let decoding reuse the
    encoder output; `__call__` runs both."""

    cfg: T5Config

    def setup(self):
        c = self.cfg
        self.token_embedder = Embed(c.vocab_size, c.emb_dim, get_dtype(c.dtype))
        self.encoder = Encoder(c, self.token_embedder)
        self.decoder = Decoder(c, self.token_embedder)

    def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Optional[Array] = None,
               deterministic: bool = True) -> Array:
        return self.encoder(encoder_input_tokens, encoder_segment_ids, deterministic)

    def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Optional[Array] = None,
               encoder_segment_ids: Optional[Array] = None,
               decoder_segment_ids: Optional[Array] = None,
               deterministic: bool = True, decode: bool = False,
               decoder_positions: Optional[Array] = None,
               max_decode_length: Optional[int] = None) -> Array:
        """Decoder logits given the encoder output `encoded` (internal layout, as `encode`
        returns it). `decode=True`: incremental decoding with a KV cache (`Decoder`)."""
        return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                            decoder_target_tokens, encoder_segment_ids, decoder_segment_ids,
                            deterministic, decode, decoder_positions, max_decode_length)

    def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
                 decoder_target_tokens: Optional[Array] = None,
                 encoder_segment_ids: Optional[Array] = None,
                 decoder_segment_ids: Optional[Array] = None,
                 encoder_positions: Optional[Array] = None,
                 decoder_positions: Optional[Array] = None,
                 deterministic: bool = True) -> Array:
        """Tokens [batch, length] int32 -> float32 logits [batch, dec_length, vocab].

        Positions are accepted for T5X batch compatibility; relative attention only
        needs in-segment distances, which packing preserves."""
        del encoder_positions, decoder_positions
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, deterministic)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                           decoder_target_tokens, encoder_segment_ids, decoder_segment_ids,
                           deterministic)
