"""Model-FLOP formulas under the MFU convention (docs/performance.md, "How MFU is counted").

Conventions: matmul FLOPs only (2 per multiply-add), forward + backward = 3 x forward,
no recomputation counted, padding counts as real tokens. `inner = num_heads * head_dim`;
`n_in = len(mlp_activations)` input projections in the MLP (2 for gated MLPs). Decoder-only
attention is causal, so its score/value matmuls are halved (in a sliding window W < S, a
query sees W - W^2 / (2 S) keys on average). Pure functions of a config's
numbers (a `T5Config` for the encoder-decoder formulas, a `DecoderConfig` for the
decoder-only ones), no gin: a room of its own that needs nothing of t5lite.

A mixture-of-experts layer counts its active parameters: the router (2 d E a token) and
top_k experts' MLPs; the capacity routing's dispatch and combine gathers are overhead, not
model FLOPs (MaxText's convention), and dropped tokens count as routed.

With LoRA (`lora_rank` > 0) the backward pass computes no gradient of a frozen weight:
a weight matmul costs 2 x forward (forward, the gradient of its input), an attention
matmul (scores, values: both operands activations) still 3 x, and each adapter (A
[d_in, r], B [r, d_out]: 2 r (d_in + d_out) a token forward) 3 x.
"""
from __future__ import annotations

from typing import Tuple


TRAIN_MULTIPLIER = 3  # forward + backward (backward = 2 x forward)
FROZEN_MULTIPLIER = 2  # a frozen weight's matmul: forward + its input's gradient


def _mlp_flops_per_token(d: int, ff: int, n_in: int) -> int:
    """`n_in` input projections [d, ff] plus the output projection [ff, d]."""
    return 2 * d * ff * (n_in + 1)


def _train(weights: int, attention: int, cfg) -> int:
    """Training FLOPs of forward weight-matmul and attention-matmul FLOPs (LoRA: the
    weights frozen; the adapters' FLOPs are added by the caller)."""
    if getattr(cfg, "lora_rank", 0):
        return FROZEN_MULTIPLIER * weights + TRAIN_MULTIPLIER * attention
    return TRAIN_MULTIPLIER * (weights + attention)


def _adapter(cfg, name: str, d_in: int, d_out: int) -> int:
    """Forward FLOPs a token of projection `name`'s adapter (0 when not a target)."""
    if not getattr(cfg, "lora_rank", 0) or name not in cfg.lora_targets:
        return 0
    return 2 * int(cfg.lora_rank) * (d_in + d_out)


def _mlp_adapters(cfg, d: int, ff: int) -> int:
    n_in = len(cfg.mlp_activations)
    names = ("wi",) if n_in == 1 else tuple(f"wi_{i}" for i in range(n_in))
    return sum(_adapter(cfg, n, d, ff) for n in names) + _adapter(cfg, "wo", ff, d)


def _mlps(cfg, layers: int) -> int:
    """Forward FLOPs a token of `layers` layers' MLPs, dense or mixtures of experts."""
    d, ff = cfg.emb_dim, cfg.mlp_dim
    sparse = sum(cfg.is_moe_layer(i) for i in range(layers))
    dense_mlp = _mlp_flops_per_token(d, ff, len(cfg.mlp_activations))
    moe_mlp = (cfg.moe_top_k * _mlp_flops_per_token(d, ff, len(cfg.expert_activations))
               + 2 * d * cfg.num_experts)                        # top-k experts, the router
    return (layers - sparse) * dense_mlp + sparse * moe_mlp


def _encoder_decoder_parts(cfg, Se: int, Sd: int) -> Tuple[int, int, int]:
    """Forward (weight matmuls, attention matmuls, adapters) FLOPs of one example."""
    d, ff, V = cfg.emb_dim, cfg.mlp_dim, cfg.vocab_size
    inner = cfg.num_heads * cfg.head_dim
    Le, Ld = cfg.num_encoder_layers, cfg.num_decoder_layers
    # Per encoder token: q,k,v,o projections (8*d*inner), MLP, full attention (QK^T and AV),
    # plus the decoder's cross-attention K/V projections of this token in every decoder layer.
    weights = Se * (Le * 8 * d * inner + _mlps(cfg, Le) + Ld * 4 * d * inner)
    attention = Se * Le * 4 * Se * inner
    # Per decoder token: self-attention projections, MLP, causal self-attention (halved),
    # cross-attention q,o projections and attention over Se keys; then the logits.
    weights += Sd * (Ld * (8 * d * inner + 4 * d * inner) + _mlps(cfg, Ld) + 2 * d * V)
    attention += Sd * Ld * (2 * Sd * inner + 4 * Se * inner)
    q_o = _adapter(cfg, "query", d, inner) + _adapter(cfg, "out", inner, d)
    k_v = _adapter(cfg, "key", d, inner) + _adapter(cfg, "value", d, inner)
    adapters = (Se * Le * (q_o + k_v + _mlp_adapters(cfg, d, ff))    # encoder
                + Sd * Ld * (2 * q_o + k_v + _mlp_adapters(cfg, d, ff))  # self, cross q/o
                + Se * Ld * k_v)                                      # cross-attention k/v
    return weights, attention, adapters


def encoder_decoder_forward_flops_per_example(
        cfg, inputs_length: int, targets_length: int) -> int:
    """Forward matmul FLOPs of one (inputs_length, targets_length) example."""
    return sum(_encoder_decoder_parts(cfg, inputs_length, targets_length))


def encoder_decoder_train_flops_per_example(
        cfg, inputs_length: int = 512, targets_length: int = 128) -> int:
    """Training (fwd + bwd) model FLOPs of one encoder-decoder example."""
    weights, attention, adapters = _encoder_decoder_parts(cfg, inputs_length, targets_length)
    return _train(weights, attention, cfg) + TRAIN_MULTIPLIER * adapters


def _decoder_only_parts(cfg, S: int) -> Tuple[int, int, int]:
    """Forward (weight matmuls, attention matmuls, adapters) FLOPs of one token in a
    causal sequence of `S`."""
    d, ff, V = cfg.emb_dim, cfg.mlp_dim, cfg.vocab_size
    H, Hkv, hd = cfg.num_heads, cfg.kv_heads, cfg.head_dim
    weights = cfg.num_layers * (2 * d * (H + 2 * Hkv) * hd       # q, k, v projections
                                + 2 * d * H * hd                 # output projection
                                ) + 2 * d * V                    # the logits
    weights += _mlps(cfg, cfg.num_layers)
    # QK^T and AV over the keys a query sees on average: causal, S / 2; in a window W < S,
    # W - W^2 / (2 S)
    W = getattr(cfg, "sliding_window", None)
    if W is None or W >= S:
        attention = cfg.num_layers * (4 * S * H * hd // 2)
    else:
        attention = cfg.num_layers * (4 * H * hd * (2 * S * W - W * W) // (2 * S))
    adapters = cfg.num_layers * (
        _adapter(cfg, "query", d, H * hd) + _adapter(cfg, "key", d, Hkv * hd)
        + _adapter(cfg, "value", d, Hkv * hd) + _adapter(cfg, "out", H * hd, d)
        + _mlp_adapters(cfg, d, ff))
    return weights, attention, adapters


def decoder_only_forward_flops_per_token(cfg, seq_length: int) -> int:
    """Forward matmul FLOPs of one token in a causal sequence of `seq_length`."""
    return sum(_decoder_only_parts(cfg, seq_length))


def decoder_only_train_flops_per_token(cfg, seq_length: int = 2048) -> int:
    """Training (fwd + bwd) model FLOPs per token."""
    weights, attention, adapters = _decoder_only_parts(cfg, seq_length)
    return _train(weights, attention, cfg) + TRAIN_MULTIPLIER * adapters


def decoder_only_train_flops_per_example(cfg, seq_length: int = 2048) -> int:
    """Training (fwd + bwd) model FLOPs of one sequence of `seq_length` tokens."""
    return seq_length * decoder_only_train_flops_per_token(cfg, seq_length)


def train_flops_per_example(cfg, *, inputs_length: int = 512, targets_length: int = 128,
                            seq_length: int = 2048) -> int:
    """Dispatch on the config type: enc-dec uses the two lengths, decoder-only `seq_length`."""
    if hasattr(cfg, "num_encoder_layers"):  # a T5Config
        return encoder_decoder_train_flops_per_example(cfg, inputs_length, targets_length)
    if hasattr(cfg, "num_layers"):  # a DecoderConfig
        return decoder_only_train_flops_per_example(cfg, seq_length)
    raise TypeError(f"expected T5Config or DecoderConfig, got {type(cfg).__name__}")
