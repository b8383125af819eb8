"""Model-FLOP formulas under the MFU convention (docs/performance.md, "How MFU is counted").

Conventions: matmul FLOPs only (2 per multiply-add), forward + backward = 3 x forward,
no recomputation counted, padding counts as real tokens. `inner = num_heads * head_dim`;
`n_in = len(mlp_activations)` input projections in the MLP (2 for gated MLPs). Decoder-only
attention is causal, so its score/value matmuls are halved. Pure functions, no gin.
"""
from __future__ import annotations

from t5lite.models.configs import DecoderConfig, T5Config

TRAIN_MULTIPLIER = 3  # forward + backward (backward = 2 x forward)


def _mlp_flops_per_token(d: int, ff: int, n_in: int) -> int:
    """`n_in` input projections [d, ff] plus the output projection [ff, d]."""
    return 2 * d * ff * (n_in + 1)


def encoder_decoder_forward_flops_per_example(
        cfg: T5Config, inputs_length: int, targets_length: int) -> int:
    """Forward matmul FLOPs of one (inputs_length, targets_length) example."""
    d, ff, V = cfg.emb_dim, cfg.mlp_dim, cfg.vocab_size
    inner = cfg.num_heads * cfg.head_dim
    n_in = len(cfg.mlp_activations)
    Le, Ld = cfg.num_encoder_layers, cfg.num_decoder_layers
    Se, Sd = inputs_length, targets_length
    mlp = _mlp_flops_per_token(d, ff, n_in)

    # Per encoder token: q,k,v,o projections (8*d*inner), MLP, full attention (QK^T and AV),
    # plus the decoder's cross-attention K/V projections of this token in every decoder layer.
    encoder_token = Le * (8 * d * inner + mlp + 4 * Se * inner) + Ld * 4 * d * inner
    # Per decoder token: self-attention projections, MLP, causal self-attention (halved),
    # cross-attention q,o projections and attention over Se keys; then the logits.
    decoder_token = (Ld * (8 * d * inner + mlp + 2 * Sd * inner + 4 * d * inner + 4 * Se * inner)
                     + 2 * d * V)
    return Se * encoder_token + Sd * decoder_token


def encoder_decoder_train_flops_per_example(
        cfg: T5Config, inputs_length: int = 512, targets_length: int = 128) -> int:
    """Training (fwd + bwd) model FLOPs of one encoder-decoder example."""
    return TRAIN_MULTIPLIER * encoder_decoder_forward_flops_per_example(
        cfg, inputs_length, targets_length)


def decoder_only_forward_flops_per_token(cfg: DecoderConfig, seq_length: int) -> int:
    """Forward matmul FLOPs of one token in a causal sequence of `seq_length`."""
    d, ff, V, S = cfg.emb_dim, cfg.mlp_dim, cfg.vocab_size, seq_length
    H, Hkv, hd = cfg.num_heads, cfg.kv_heads, cfg.head_dim
    n_in = len(cfg.mlp_activations)
    per_layer = (2 * d * (H + 2 * Hkv) * hd       # q, k, v projections
                 + 2 * d * H * hd                 # output projection
                 + _mlp_flops_per_token(d, ff, n_in)
                 + 4 * S * H * hd // 2)           # QK^T and AV, causal: halved
    return cfg.num_layers * per_layer + 2 * d * V


def decoder_only_train_flops_per_token(cfg: DecoderConfig, seq_length: int = 2048) -> int:
    """Training (fwd + bwd) model FLOPs per token."""
    return TRAIN_MULTIPLIER * decoder_only_forward_flops_per_token(cfg, seq_length)


def decoder_only_train_flops_per_example(cfg: DecoderConfig, seq_length: int = 2048) -> int:
    """Training (fwd + bwd) model FLOPs of one sequence of `seq_length` tokens."""
    return seq_length * decoder_only_train_flops_per_token(cfg, seq_length)


def train_flops_per_example(cfg, *, inputs_length: int = 512, targets_length: int = 128,
                            seq_length: int = 2048) -> int:
    """Dispatch on the config type: enc-dec uses the two lengths, decoder-only `seq_length`."""
    if isinstance(cfg, T5Config):
        return encoder_decoder_train_flops_per_example(cfg, inputs_length, targets_length)
    if isinstance(cfg, DecoderConfig):
        return decoder_only_train_flops_per_example(cfg, seq_length)
    raise TypeError(f"expected T5Config or DecoderConfig, got {type(cfg).__name__}")
