"""The decoder-only family's settings (GPT, LLaMA, GLaM, Mixtral): `DecoderConfig`.

Parameter tree naming (unscanned, unfused; every kernel in float32):

Decoder-only (`DecoderConfig`)::

    token_embedder/embedding                          [vocab, embed]
    position_embedder/embedding                       [abspos_buckets, embed] (learned
                                                      positions; max_length rows)
    decoder/layers_{i}/pre_self_attention_layer_norm/{scale,bias}
    decoder/layers_{i}/self_attention/{query,key,value}/kernel (+bias with use_bias or
                                                      qkv_bias)
    decoder/layers_{i}/self_attention/{query,key}_norm/scale  [kv] (qk_norm)
    decoder/layers_{i}/self_attention/out/kernel      [heads, kv, embed]
    decoder/layers_{i}/pre_mlp_layer_norm/{scale,bias}
    decoder/layers_{i}/mlp/{wi_0,wi_1 | wi, wo}/kernel (+bias)
    decoder/decoder_norm/{scale,bias}
    logits_dense/kernel                               [embed, vocab] (absent if tied)

Other layouts and LoRA: `t5lite/models/common/settings.py`.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional, Tuple

from t5lite.models.common.rope import Rope
from t5lite.models.common.settings import MoeSettings, check_special_ids


@dataclasses.dataclass(frozen=True)
class DecoderConfig(MoeSettings):
    """Decoder-only architecture (GPT and LLaMA), and the switches."""

    HF_MODEL_TYPE: ClassVar[str] = "llama"  # GPT-style settings have no HF mapping
    vocab_size: int = 32000
    emb_dim: int = 4096
    num_heads: int = 32
    num_kv_heads: Optional[int] = None  # None: multi-head attention (== num_heads)
    head_dim: int = 128
    num_layers: int = 32
    mlp_dim: int = 11008
    mlp_activations: Tuple[str, ...] = ("silu", "linear")
    norm_type: str = "rms"  # "rms" (LLaMA) or "layer" (GPT, with bias)
    layer_norm_epsilon: float = 1e-5
    # "rope" (LLaMA), "learned" (GPT) or "relative" (GLaM: T5's causal buckets as an
    # attention bias, one [heads, relpos_buckets] table a layer)
    position_embedding: str = "rope"
    max_length: int = 4096  # table size for learned positions
    rope_theta: float = 10000.0
    # RoPE scaling: "default" (none) or "llama3" (LLaMA-3.1 / 3.2's: the frequencies
    # slower than the original context divided by rope_factor, the fast ones kept, those
    # between blended; `t5lite.models.common.rope`)
    rope_scaling: str = "default"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_length: int = 8192
    # Mistral's sliding window: each token attends to the `sliding_window` latest tokens,
    # itself included, in training and in decoding; None: to every earlier token
    sliding_window: Optional[int] = None
    relpos_num_buckets: int = 32
    relpos_max_distance: int = 128
    use_bias: bool = False  # biases on every projection (GPT)
    qkv_bias: bool = False  # biases on the query, key and value projections only (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head's query and key before RoPE (Qwen3)
    tie_embeddings: bool = False
    # attention scores times head_dim^-0.5 (off: GLaM, whose query is not scaled)
    scale_attention_logits: bool = True
    # with tied embeddings, the logits of the last layer's output times emb_dim^-0.5 (GLaM)
    scale_tied_logits: bool = False
    # prefix LM (a task's inputs then targets in one sequence): the inputs attend to each
    # other both ways, as T5X's decoder_causal_attention does; off: causal throughout
    # (GPT, LLaMA). Needs attention_impl 'xla'
    bidirectional_prefix: bool = False
    # the token every sequence starts with (the feature converters' decoder_input_tokens
    # and every prompt) and the one that ends it (decoding stops there). 0 / 1: T5's
    # SentencePiece convention (BOS is the padding id); LLaMA's tokenizer uses 1 / 2. The
    # vocabulary's EOS must be eos_id (`model.check_vocabulary`)
    bos_id: int = 0
    eos_id: int = 1

    def __post_init__(self):
        super().__post_init__()
        check_special_ids(self)
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.norm_type not in ("rms", "layer"):
            raise ValueError(f"norm_type must be 'rms' or 'layer', got {self.norm_type!r}")
        if self.position_embedding not in ("rope", "learned", "relative"):
            raise ValueError(f"position_embedding must be 'rope', 'learned' or 'relative', got "
                             f"{self.position_embedding!r}")
        if self.position_embedding == "relative" and self.attention_impl == "te":
            raise ValueError("position_embedding='relative' adds a bias to the attention scores, "
                             "which ATTENTION_IMPL='te' does not take here: use 'xla' or "
                             "'cudnn'")
        if self.position_embedding == "rope":
            self.rope  # noqa: B018  (checks the scaling's fields)
        if self.sliding_window is not None:
            if isinstance(self.sliding_window, bool) or not (
                    isinstance(self.sliding_window, int) and self.sliding_window >= 1):
                raise ValueError(f"sliding_window must be a whole number >= 1 or None, got "
                                 f"{self.sliding_window!r}")
            if self.attention_impl == "te" or self.bidirectional_prefix:
                raise ValueError("sliding_window is not taken with ATTENTION_IMPL='te' or a "
                                 "bidirectional prefix: use 'xla', 'dot_product' or 'cudnn', "
                                 "causal throughout")
        if self.bidirectional_prefix and self.attention_impl != "xla":
            raise ValueError(f"bidirectional_prefix needs attention_impl 'xla' (the fused "
                             f"kernels take causal or padding masks only), got "
                             f"{self.attention_impl!r}")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def rope(self) -> Rope:
        """RoPE's settings (read when position_embedding is 'rope')."""
        return Rope(self.rope_theta, self.rope_scaling, self.rope_factor,
                    self.rope_low_freq_factor, self.rope_high_freq_factor,
                    self.rope_original_length)
