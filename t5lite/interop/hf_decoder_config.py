"""Hugging Face config.json <-> `DecoderConfig`, for LLaMA and its kin.

Read (`decoder_config`), by `model_type`:

- "llama": LLaMA 1 / 2 / 3; RoPE plain or with LLaMA-3.1's "llama3" scaling, from
  transformers 4's `rope_scaling` or 5's `rope_parameters`;
- "mistral": LLaMA's layers with a sliding window (`sliding_window`);
- "qwen2": biases on the query / key / value projections (Qwen2, Qwen2.5);
- "qwen3": an RMSNorm over each head's query and key, no biases;
- "mixtral": SwiGLU experts in every layer, top-k >= 2, dropless routing.

A config.json written by transformers 5 leaves out what equals its class's default, so
each type's defaults (`DEFAULTS`, transformers 5's own) fill what is absent. A field that
would change the numbers and that t5lite cannot hold (another RoPE scaling, a partial
rotary factor, Qwen's per-layer windows) is refused in one line naming it.

Write (`decoder_hf_config`): the model_type a config needs (`decoder_model_type`: experts
-> mixtral, per-head norms -> qwen3, query / key / value biases -> qwen2, a window ->
mistral, else llama), and one line naming whatever that type cannot express.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping

from t5lite.models.configs import DecoderConfig

DECODER_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral")

# HF activation name -> t5lite activation name, and back.
ACT_FROM_HF = {"relu": "relu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
               "gelu": "gelu_exact", "silu": "silu", "swish": "silu"}
ACT_TO_HF = {"relu": "relu", "gelu": "gelu_new", "gelu_exact": "gelu", "silu": "silu"}

# transformers 5's class defaults, where they differ from LlamaConfig's.
_QWEN = {"vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768,
         "bos_token_id": None, "eos_token_id": None, "use_sliding_window": False}
DEFAULTS: Dict[str, Dict[str, Any]] = {
    "llama": {},
    "mistral": {"intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 4096 * 32, "sliding_window": 4096},
    "qwen2": _QWEN,
    "qwen3": {**_QWEN, "head_dim": 128},
    "mixtral": {"intermediate_size": 14336, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 4096 * 32, "rope_theta": 1e6,
                "num_local_experts": 8, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.001},
}
_LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor",
                  "original_max_position_embeddings")


def act_from_hf(name: str, field: str) -> str:
    if name not in ACT_FROM_HF:
        raise ValueError(f"{field}: activation {name!r} is not supported "
                         f"(supported: {sorted(ACT_FROM_HF)})")
    return ACT_FROM_HF[name]


def token_id(hf: Mapping[str, Any], field: str, default) -> int:
    """A special token id of an HF config: an int, the first of a list (decoding stops at
    one EOS), or `default` when absent or null."""
    value = hf.get(field)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field}: expected a token id, got {value!r}")
    return value


def _number(spec: Mapping[str, Any], key: str, field: str) -> float:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: rope type 'llama3' needs a number {key!r}, got {value!r}")
    return value


def rope_fields(hf: Mapping[str, Any]) -> Dict[str, Any]:
    """The DecoderConfig's rope_* fields from an HF config: theta, and LLaMA-3.1's scaling
    from `rope_parameters` (transformers 5) or `rope_scaling` (4); other types refused."""
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor is not supported (t5lite rotates every "
                         "dimension of a head)")
    out: Dict[str, Any] = {}
    for field in ("rope_scaling", "rope_parameters"):  # the second, when both, wins
        spec = hf.get(field)
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise ValueError(f"{field}: expected an object or null, got {spec!r}")
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind not in ("default", "llama3"):
            raise ValueError(f"{field}: rope type {kind!r} is not supported (t5lite reads "
                             f"'default' and LLaMA-3.1's 'llama3'); got {spec}")
        if spec.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"{field}: partial_rotary_factor is not supported")
        if "rope_theta" in spec:
            out["rope_theta"] = float(_number(spec, "rope_theta", field))
        if kind == "llama3":
            factor, low, high, orig = (_number(spec, k, field) for k in _LLAMA3_FIELDS)
            if not (float(orig).is_integer() and orig >= 1):
                raise ValueError(f"{field}: original_max_position_embeddings must be a whole "
                                 f"number >= 1, got {orig!r}")
            out.update(rope_scaling="llama3", rope_factor=float(factor),
                       rope_low_freq_factor=float(low), rope_high_freq_factor=float(high),
                       rope_original_length=int(orig))
        else:
            out["rope_scaling"] = "default"
    out.setdefault("rope_theta", float(hf.get("rope_theta") or 10000.0))
    return out


def _window(hf: Mapping[str, Any], max_pos) -> Any:
    """Mistral's / Mixtral's sliding window: None when absent or as wide as the context."""
    window = hf.get("sliding_window")
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window: expected a whole number >= 1 or null, got "
                         f"{window!r}")
    return None if isinstance(max_pos, int) and window >= max_pos else window


def _qwen_windows(hf: Mapping[str, Any]) -> None:
    """Qwen's per-layer windows (use_sliding_window from max_window_layers on): refused."""
    if hf.get("use_sliding_window"):
        raise ValueError("use_sliding_window: true is not supported (Qwen's windowed "
                         "attention in the layers from max_window_layers on; t5lite's window "
                         "is the same in every layer): set it false, as Qwen's released "
                         "models have it")
    kinds = set(hf.get("layer_types") or ())
    if kinds - {"full_attention"}:
        raise ValueError(f"layer_types: {sorted(kinds)} is not supported (t5lite reads "
                         f"'full_attention' in every layer)")


def _count(hf: Mapping[str, Any], field: str, low: int) -> int:
    value = hf[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{field}: expected a whole number >= {low}, got {value!r}")
    return value


def _with_experts(cfg: DecoderConfig, hf: Mapping[str, Any]) -> DecoderConfig:
    """A Mixtral: every MLP a mixture of SwiGLU experts, top-k of a float32 softmax, the k
    weights renormalized, no token dropped."""
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act: Mixtral experts with {act!r} are not supported (t5lite "
                         f"reads SwiGLU experts: hidden_act 'silu')")
    experts = _count(hf, "num_local_experts", 1)
    top_k = _count(hf, "num_experts_per_tok", 1)
    if top_k > experts:
        raise ValueError(f"num_experts_per_tok: {top_k} exceeds num_local_experts={experts}")
    if top_k == 1:
        raise ValueError("num_experts_per_tok: 1 is not supported (transformers' Mixtral "
                         "gives the one chosen expert weight 1, t5lite's top-1 routing its "
                         "router probability; top-k >= 2 reads the same)")
    coef = hf["router_aux_loss_coef"]
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
        raise ValueError(f"router_aux_loss_coef: expected a number >= 0, got {coef!r}")
    return dataclasses.replace(
        cfg, num_experts=experts, moe_top_k=top_k, moe_every=1, expert_mlp="swiglu",
        routing="dropless", router_aux_loss=float(coef), router_z_loss=0.0)


def decoder_config(hf: Mapping[str, Any]) -> DecoderConfig:
    """The DecoderConfig of an HF config of one of `DECODER_MODEL_TYPES` (unfused,
    unscanned, default dtype)."""
    kind = hf.get("model_type")
    hf = {**DEFAULTS[kind], **{k: v for k, v in hf.items() if v is not None
                               or k in ("sliding_window", "bos_token_id", "eos_token_id")}}
    if kind in ("mistral", "mixtral"):  # no biases in either
        hf = {k: v for k, v in hf.items() if k not in ("attention_bias", "mlp_bias")}
    if kind in ("qwen2", "qwen3"):
        _qwen_windows(hf)
    hidden = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    kv = hf.get("num_key_value_heads") or heads
    act = act_from_hf(hf.get("hidden_act", "silu"), "hidden_act")
    max_pos = hf.get("max_position_embeddings", 2048)
    eos = token_id(hf, "eos_token_id", 2 if kind in ("llama", "mistral", "mixtral") else None)
    if eos is None:
        raise ValueError(f"eos_token_id: config.json names none (a {kind} config has no "
                         f"default): give the model's, as its released config.json does")
    cfg = DecoderConfig(
        vocab_size=hf.get("vocab_size", 32000),
        emb_dim=hidden,
        num_heads=heads,
        num_kv_heads=None if kv == heads else kv,
        head_dim=hf.get("head_dim") or hidden // heads,
        num_layers=hf.get("num_hidden_layers", 32),
        mlp_dim=hf.get("intermediate_size", 11008),
        mlp_activations=(act, "linear"),
        norm_type="rms",
        layer_norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        position_embedding="rope",
        max_length=max_pos,
        **rope_fields(hf),
        sliding_window=_window(hf, max_pos) if kind in ("mistral", "mixtral") else None,
        use_bias=bool(hf.get("attention_bias", False) or hf.get("mlp_bias", False)),
        qkv_bias=kind == "qwen2",
        qk_norm=kind == "qwen3",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        dropout_rate=0.0,
        # Qwen's configs may name no BOS (its tokenizer adds none): its EOS starts a
        # sequence, as Qwen's own finetuning scripts pad and begin with <|endoftext|>
        bos_id=token_id(hf, "bos_token_id", 1 if kind in ("llama", "mistral", "mixtral")
                        else eos),
        eos_id=eos,
    )
    return _with_experts(cfg, hf) if kind == "mixtral" else cfg


# --------------------------------------------------------------------------- reverse


def decoder_model_type(cfg: DecoderConfig) -> str:
    """The HF model_type a decoder-only config is written as."""
    if cfg.num_experts:
        return "mixtral"
    if cfg.qk_norm:
        return "qwen3"
    if cfg.qkv_bias:
        return "qwen2"
    if cfg.sliding_window is not None:
        return "mistral"
    return "llama"


_WRITTEN_AS = {"llama": "decoder-only models as LLaMA",
               "mistral": "decoders with a sliding window as Mistral",
               "qwen2": "decoders with query / key / value biases as Qwen2",
               "qwen3": "decoders with per-head query / key norms as Qwen3",
               "mixtral": "mixture-of-experts decoders as Mixtral"}


def _problems(cfg: DecoderConfig, kind: str) -> List[str]:
    """What keeps a decoder-only config from being a transformers model of `kind`."""
    problems = []
    if cfg.norm_type != "rms":
        problems.append(f"norm_type={cfg.norm_type!r} (needs 'rms')")
    if cfg.position_embedding != "rope":
        problems.append(f"position_embedding={cfg.position_embedding!r} (needs 'rope')")
    if cfg.bidirectional_prefix:
        problems.append("bidirectional_prefix=True (causal throughout)")
    if not cfg.scale_attention_logits:
        problems.append("scale_attention_logits=False (needs head_dim**-0.5 scaling)")
    if cfg.scale_tied_logits:
        problems.append("scale_tied_logits=True (needs unscaled logits)")
    acts = tuple(cfg.mlp_activations)  # (a Mixtral's experts are SwiGLU whatever these say)
    if kind != "mixtral" and (len(acts) != 2 or acts[1] != "linear"
                              or acts[0] not in ACT_TO_HF):
        problems.append(f"mlp_activations={acts} (needs (ACT, 'linear'))")
    if cfg.use_bias and kind not in ("llama",):
        problems.append(f"use_bias=True ({kind} has no biases on every projection)")
    if cfg.qkv_bias and (kind != "qwen2" or cfg.use_bias):
        problems.append("qkv_bias=True with " + ("use_bias" if cfg.use_bias else "qk_norm"))
    if cfg.sliding_window is not None and kind not in ("mistral", "mixtral"):
        problems.append(f"sliding_window={cfg.sliding_window} ({kind} has no window)")
    return problems


def _rope_parameters(cfg: DecoderConfig) -> Dict[str, Any]:
    out: Dict[str, Any] = {"rope_type": cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "llama3":
        out.update(factor=cfg.rope_factor, low_freq_factor=cfg.rope_low_freq_factor,
                   high_freq_factor=cfg.rope_high_freq_factor,
                   original_max_position_embeddings=cfg.rope_original_length)
    return out


def decoder_hf_config(cfg: DecoderConfig) -> Dict[str, Any]:
    """config.json (transformers 5) of the model_type `decoder_model_type` names; one line
    naming every setting that type cannot express."""
    kind = decoder_model_type(cfg)
    problems = _problems(cfg, kind)
    if kind == "mixtral":
        problems += _expert_problems(cfg)
    if problems:
        raise ValueError(f"save_pretrained writes {_WRITTEN_AS[kind]}; this config has "
                         + ", ".join(problems))
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "mixtral": "MixtralForCausalLM"}[kind]
    out = {
        "architectures": [arch],
        "model_type": kind,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.emb_dim,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": ACT_TO_HF.get(cfg.mlp_activations[0]),
        "max_position_embeddings": cfg.max_length,
        "rms_norm_eps": cfg.layer_norm_epsilon,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": _rope_parameters(cfg),
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "use_cache": True,
        "dtype": "float32",
    }
    if kind == "llama":
        out.update(attention_bias=bool(cfg.use_bias), mlp_bias=bool(cfg.use_bias))
    if kind == "qwen3":
        out["attention_bias"] = False
    if kind in ("qwen2", "qwen3"):
        out.update(use_sliding_window=False, sliding_window=None)
    if kind in ("mistral", "mixtral"):
        out["sliding_window"] = cfg.sliding_window
    if kind == "mixtral":
        out.update(hidden_act="silu", num_local_experts=cfg.num_experts,
                   num_experts_per_tok=cfg.moe_top_k,
                   router_aux_loss_coef=cfg.router_aux_loss, output_router_logits=False,
                   router_jitter_noise=0.0)
    return out


def _expert_problems(cfg: DecoderConfig) -> List[str]:
    problems = []
    if cfg.routing != "dropless":
        problems.append(f"routing={cfg.routing!r} (Mixtral routes 'dropless': no expert "
                        f"capacity, no token dropped)")
    if cfg.moe_every != 1:
        problems.append(f"moe_every={cfg.moe_every} (every Mixtral layer is sparse: needs 1, "
                        f"not dense and sparse layers in turn)")
    if cfg.expert_mlp != "swiglu":
        problems.append(f"expert_mlp={cfg.expert_mlp!r} (Mixtral's experts are 'swiglu')")
    if cfg.moe_top_k < 2:
        problems.append(f"moe_top_k={cfg.moe_top_k} (t5lite weights a top-1 choice by its "
                        f"probability, Mixtral by 1: needs >= 2)")
    return problems
