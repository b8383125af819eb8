"""The encoder-decoder family's settings (T5 v1.1, original T5, Switch): `T5Config`.

Parameter tree naming (unscanned, unfused; every kernel in float32):

Encoder-decoder (`T5Config`)::

    token_embedder/embedding                          [vocab, embed]
    encoder/relpos_bias/rel_embedding                 [heads, relpos_buckets]
    encoder/layers_{i}/pre_attention_layer_norm/scale [embed]
    encoder/layers_{i}/attention/{query,key,value}/kernel  [embed, heads, kv]
    encoder/layers_{i}/attention/out/kernel           [heads, kv, embed]
    encoder/layers_{i}/pre_mlp_layer_norm/scale       [embed]
    encoder/layers_{i}/mlp/wi_0/kernel, wi_1/kernel   [embed, mlp]  (wi/kernel if not gated)
    encoder/layers_{i}/mlp/wo/kernel                  [mlp, embed]
    encoder/encoder_norm/scale                        [embed]
    decoder/relpos_bias/rel_embedding                 [heads, relpos_buckets]
    decoder/layers_{i}/pre_self_attention_layer_norm/scale
    decoder/layers_{i}/self_attention/...             (as encoder attention)
    decoder/layers_{i}/pre_cross_attention_layer_norm/scale
    decoder/layers_{i}/encoder_decoder_attention/{query,key,value,out}/kernel
    decoder/layers_{i}/pre_mlp_layer_norm/scale, mlp/...
    decoder/decoder_norm/scale                        [embed]
    decoder/logits_dense/kernel                       [embed, vocab] (absent if logits_via_embedding)

Other layouts and LoRA: `t5lite/models/common/settings.py`.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional, Tuple

from t5lite.models.common.settings import MoeSettings, check_special_ids


@dataclasses.dataclass(frozen=True)
class T5Config(MoeSettings):
    """T5 v1.1 (and original T5) encoder-decoder architecture, and the switches."""

    HF_MODEL_TYPE: ClassVar[str] = "t5"
    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 6
    head_dim: int = 64
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    mlp_dim: int = 1024
    mlp_activations: Tuple[str, ...] = ("gelu", "linear")
    logits_via_embedding: bool = False
    relpos_num_buckets: int = 32
    relpos_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    # the token that ends a target (decoding stops there); the decoder starts from 0
    # (T5's padding id). 1 is T5's SentencePiece EOS; the vocabulary must agree
    eos_id: int = 1

    def __post_init__(self):
        super().__post_init__()
        check_special_ids(self)
        if self.relpos_max_distance <= self.relpos_num_buckets // 2:
            raise ValueError(
                f"relpos_max_distance={self.relpos_max_distance} must exceed relpos_num_buckets // 2 "
                f"= {self.relpos_num_buckets // 2} (the exact buckets of the causal decoder)")

    @property
    def kv_heads(self) -> int:
        return self.num_heads
