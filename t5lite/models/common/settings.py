"""The settings both families take: the switches (one Gin macro each, bound in
configs/models/_switches.gin), the mixture-of-experts settings (configs/models/_moe.gin)
and the checks they share. The family configs (`encoder_decoder/config.py`,
`decoder_only/config.py`) extend `MoeSettings`; the rest of t5lite reads them all from
`t5lite.models.configs`. Nothing here imports gin.

Switch layouts: with `fuse_qkv` a self-attention holds `qkv/kernel`
[embed, stack, heads, kv] where stack = num_heads // num_kv_heads + 2 and the heads axis
counts kv heads (query head h = kv_head * group + g sits at stack index g); a
cross-attention holds `query/kernel` and `kv/kernel` [embed, 2, heads, kv]. With
`scan_layers` the `layers_{i}` subtrees become one `layers` subtree whose leaves gain a
leading `layers` axis. `t5lite.models.layouts` converts between all four layouts.

With LoRA (`lora_rank` > 0) every projection named in `lora_targets` holds `lora_a`
[*in, lora_rank] and `lora_b` [lora_rank, *out] beside its kernel (`t5lite.models.lora`).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional, Tuple

from t5lite.models import lora
from t5lite.models.moe import settings as moe_settings
from t5lite.models.pipeline import settings as pipeline_settings

REMAT_POLICIES = ("none", "full", "minimal", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj")
ATTENTION_IMPLS = ("xla", "dot_product", "cudnn", "te")
ATTENTION_MASKS = ("dense", "lengths")
FP8_BACKENDS = ("native", "te")
FP8_RECIPES = ("delayed", "current")
PRECISIONS = ("bf16", "fp8")


def _switch(default, macro: str):
    """A switch field: its default and the gin macro that sets it in every model config
    (configs/models/_switches.gin binds it; `t5lite.convert` writes it)."""
    return dataclasses.field(default=default, metadata={"macro": macro})


@dataclasses.dataclass(frozen=True)
class Switches:
    """The settings both families take, each set by one macro for any model: precision,
    layouts, rematerialization, attention kernel and dropout. The same weights give the
    same function under every switch but dropout (layouts convert on load)."""

    dropout_rate: float = _switch(0.0, "DROPOUT_RATE")
    dtype: str = _switch("bfloat16", "ACTIVATION_DTYPE")  # activations; parameters stay float32
    fuse_qkv: bool = _switch(False, "FUSE_QKV")
    transpose_bs: bool = _switch(False, "TRANSPOSE_BS")
    fp8: bool = _switch(False, "FP8")
    fp8_backend: str = _switch("native", "FP8_BACKEND")  # native (flax fp8 ops) | te
    fp8_recipe: str = _switch("delayed", "FP8_RECIPE")  # TE only: delayed (T5X's) | current
    remat_policy: str = _switch("none", "REMAT_POLICY")
    scan_layers: bool = _switch(False, "SCAN_LAYERS")
    attention_impl: str = _switch("xla", "ATTENTION_IMPL")
    # the attention scores' dtype ('float32', or 'bfloat16' as T5X's GPU runs used) and
    # how padding, packing and causality reach the attention: 'dense', one [batch, 1, q, k]
    # boolean mask a stack, or 'lengths', each layer's kernel takes the ids themselves
    # (jax.nn / cuDNN: sequence lengths and a causal flag; `attention.MaskIds`)
    attention_logits_dtype: str = _switch("float32", "ATTENTION_LOGITS_DTYPE")
    attention_mask: str = _switch("dense", "ATTENTION_MASK")
    # low-rank adapters (`t5lite.models.lora`): rank 0 / None is off; alpha / rank scales
    # them; targets name projections (query, key, value, out, wi | wi_0, wi_1, wo)
    lora_rank: Optional[int] = _switch(0, "LORA_RANK")
    lora_alpha: float = _switch(16.0, "LORA_ALPHA")
    lora_targets: Tuple[str, ...] = _switch((), "LORA_TARGETS")
    lora_dropout: float = _switch(0.0, "LORA_DROPOUT")
    # a pipeline over the mesh's stage axis (decoder-only; `t5lite.models.pipeline`): the
    # microbatches a batch is cut into (None: no pipeline), and the runs of layers each
    # stage holds (a circular pipeline, Megatron's virtual stages, when over 1)
    pipeline_microbatches: Optional[int] = _switch(None, "PIPELINE_MICROBATCHES")
    pipeline_repeats: int = _switch(1, "PIPELINE_REPEATS")

    def __post_init__(self):
        if isinstance(self.lora_targets, list):  # gin lists: kept as a (hashable) tuple
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        _check_switches(self)
        lora.check_config(self)


def _macros(cls) -> dict:
    return {f.name: f.metadata["macro"] for f in dataclasses.fields(cls)
            if "macro" in f.metadata}


def switch_macros() -> dict:
    """{switch field: the gin macro that sets it} (configs/models/_switches.gin)."""
    return _macros(Switches)


def moe_macros() -> dict:
    """{mixture-of-experts field: the gin macro that sets it} (configs/models/_moe.gin)."""
    return _macros(moe_settings.MoeFields)


def setting_macros() -> dict:
    """{field: macro} of every setting both families take through one macro: the
    switches and the mixture-of-experts settings."""
    return {**switch_macros(), **moe_macros()}


@dataclasses.dataclass(frozen=True)
class MoeSettings(Switches, moe_settings.MoeFields):
    """The switches and the mixture-of-experts settings (`moe_settings.MoeFields`), which
    both families take; NUM_EXPERTS = 0 is a dense model."""

    def __post_init__(self):
        super().__post_init__()
        moe_settings.check(self)
        pipeline_settings.check(self, pipelines=not hasattr(self, "num_encoder_layers"))


def check_special_ids(cfg) -> None:
    ids = {"eos_id": cfg.eos_id, "bos_id": getattr(cfg, "bos_id", 0)}
    for name, value in ids.items():
        if isinstance(value, bool) or not isinstance(value, int) or \
                not 0 <= value < cfg.vocab_size:
            raise ValueError(f"{name} must be a token id in [0, vocab_size={cfg.vocab_size}), "
                             f"got {value!r}")
    if cfg.eos_id == 0:
        raise ValueError("eos_id must not be 0: 0 is the padding id")



def _check_switches(cfg) -> None:
    macros = switch_macros()
    for name in ("fuse_qkv", "transpose_bs", "fp8", "scan_layers"):
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{macros[name]} ({name}) must be True or False, got "
                             f"{getattr(cfg, name)!r}")
    rate = cfg.dropout_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ValueError(f"DROPOUT_RATE (dropout_rate) must be a number >= 0 and < 1, got "
                         f"{rate!r}")
    for name, allowed in (("remat_policy", REMAT_POLICIES), ("attention_impl", ATTENTION_IMPLS),
                          ("fp8_backend", FP8_BACKENDS), ("fp8_recipe", FP8_RECIPES),
                          ("attention_logits_dtype", ("float32", "bfloat16")),
                          ("attention_mask", ATTENTION_MASKS),
                          ("dtype", ("bfloat16", "float32", "float16"))):
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{macros[name]} ({name}) must be one of {', '.join(allowed)}; "
                             f"got {getattr(cfg, name)!r}")
    if cfg.attention_impl == "cudnn" and cfg.dtype == "float32":
        raise ValueError("ATTENTION_IMPL='cudnn' runs in bfloat16 or float16 only (cuDNN's "
                         "fused attention), and ACTIVATION_DTYPE='float32': use "
                         "ATTENTION_IMPL='xla' (or 'dot_product') for float32")
    if rate > 0 and cfg.attention_impl in ("cudnn", "dot_product"):
        # jax.nn.dot_product_attention takes no dropout: the attention weights' dropout
        # would be left out without a word
        raise ValueError(f"ATTENTION_IMPL={cfg.attention_impl!r} applies no dropout to the "
                         f"attention weights, and DROPOUT_RATE={rate}: use DROPOUT_RATE=0.0, "
                         f"or ATTENTION_IMPL='xla' (or 'te') to keep that dropout")
