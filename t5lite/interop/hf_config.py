"""Hugging Face config.json <-> t5lite configs.

`read_hf_config` reads a local model directory's config.json; `config_from_hf` maps it
to a `T5Config` (`model_type` "t5", and "switch_transformers": a T5Config with top-1
capacity-routed experts in every `*_sparse_step`-th layer, T5X's settings) or
`DecoderConfig` ("llama", and "mixtral": a DecoderConfig with SwiGLU experts in every
layer, top-k >= 2, dropless routing), unfused, unscanned and with t5lite's default
dtype (Switch's own fields: `t5lite.interop.hf_switch`). `t5_hf_config` /
`llama_hf_config` / `mixtral_hf_config` go the other way for `t5lite.interop.hf.save_pretrained`. Weights
(and the output-head decision that depends on them) live in `t5lite.interop.hf_families`.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Union

from t5lite.interop import hf_switch
from t5lite.models.configs import DecoderConfig, T5Config

PathLike = Union[str, Path]
CONFIG_NAME = "config.json"
SUPPORTED_MODEL_TYPES = ("t5", "llama", "mixtral", "switch_transformers")

# HF activation name -> t5lite activation name, and back.
_ACT_FROM_HF = {"relu": "relu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                "gelu": "gelu_exact", "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"relu": "relu", "gelu": "gelu_new", "gelu_exact": "gelu", "silu": "silu"}
# transformers' MixtralConfig defaults (where they differ from LlamaConfig's).
_MIXTRAL_DEFAULTS = {"intermediate_size": 14336, "num_key_value_heads": 8,
                     "rms_norm_eps": 1e-5, "max_position_embeddings": 4096 * 32,
                     "rope_theta": 1e6, "num_local_experts": 8, "num_experts_per_tok": 2,
                     "router_aux_loss_coef": 0.001}


def read_hf_config(path: PathLike) -> Dict[str, Any]:
    """config.json of a local HF model directory, as a dict."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory (expected a local HF model dir)")
    cfg_file = path / CONFIG_NAME
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG_NAME}")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_file}: expected a JSON object")
    return cfg


# --------------------------------------------------------------------------- configs


def _act_from_hf(name: str, field: str) -> str:
    if name not in _ACT_FROM_HF:
        raise ValueError(f"{field}: activation {name!r} is not supported "
                         f"(supported: {sorted(_ACT_FROM_HF)})")
    return _ACT_FROM_HF[name]


def _token_id(hf: Mapping[str, Any], field: str, default: int) -> int:
    """A special token id of an HF config: an int, the first of a list (decoding stops at
    one EOS), or `default` (transformers' own) when absent or null."""
    value = hf.get(field)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field}: expected a token id, got {value!r}")
    return value


def _t5_config(hf: Mapping[str, Any]) -> T5Config:
    ffp = hf.get("feed_forward_proj", "relu")
    parts = ffp.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        raise ValueError(f"feed_forward_proj: {ffp!r} is not 'ACT' or 'gated-ACT'")
    act = "gelu_new" if ffp == "gated-gelu" else parts[-1]  # as transformers does
    act = _act_from_hf(act, f"feed_forward_proj={ffp!r}")
    num_layers = hf.get("num_layers", 6)
    dec_layers = hf.get("num_decoder_layers")
    return T5Config(
        vocab_size=hf.get("vocab_size", 32128),
        emb_dim=hf.get("d_model", 512),
        num_heads=hf.get("num_heads", 8),
        head_dim=hf.get("d_kv", 64),
        num_encoder_layers=num_layers,
        num_decoder_layers=num_layers if dec_layers is None else dec_layers,
        mlp_dim=hf.get("d_ff", 2048),
        mlp_activations=(act, "linear") if gated else (act,),
        dropout_rate=float(hf.get("dropout_rate", 0.1)),
        relpos_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relpos_max_distance=hf.get("relative_attention_max_distance", 128),
        layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-6)),
        eos_id=_token_id(hf, "eos_token_id", 1),
    )


def t5_scales_output(hf: Mapping[str, Any]) -> bool:
    """Whether transformers multiplies the T5 decoder output by d_model**-0.5."""
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings", True) is not False


def _check_rope(hf: Mapping[str, Any]) -> float:
    """rope theta of a LLaMA config; refuses RoPE scaling variants."""
    params = hf.get("rope_parameters") or {}
    for field in ("rope_parameters", "rope_scaling"):
        spec = hf.get(field)
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise ValueError(f"{field}: expected an object or null, got {spec!r}")
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind != "default":
            raise ValueError(f"{field}: rope type {kind!r} is not supported (only plain RoPE, "
                             f"rope_type 'default'); got {spec}")
        if spec.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"{field}: partial_rotary_factor is not supported")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor is not supported")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _llama_config(hf: Mapping[str, Any]) -> DecoderConfig:
    theta = _check_rope(hf)
    hidden = hf.get("hidden_size", 4096)
    heads = hf.get("num_attention_heads", 32)
    kv = hf.get("num_key_value_heads") or heads
    act = _act_from_hf(hf.get("hidden_act", "silu"), "hidden_act")
    return DecoderConfig(
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
        max_length=hf.get("max_position_embeddings", 2048),
        rope_theta=theta,
        use_bias=bool(hf.get("attention_bias", False) or hf.get("mlp_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        dropout_rate=0.0,
        bos_id=_token_id(hf, "bos_token_id", 1),
        eos_id=_token_id(hf, "eos_token_id", 2),
    )


def _count(hf: Mapping[str, Any], field: str, low: int) -> int:
    value = hf[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{field}: expected a whole number >= {low}, got {value!r}")
    return value


def _mixtral_config(hf: Mapping[str, Any]) -> DecoderConfig:
    """A Mixtral: LLaMA's decoder (no biases) whose every MLP is a mixture of SwiGLU
    experts, top-k of a float32 softmax, the k weights renormalized, no token dropped."""
    hf = {**_MIXTRAL_DEFAULTS, **{k: v for k, v in hf.items()
                                  if k not in ("attention_bias", "mlp_bias")}}
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act: Mixtral experts with {act!r} are not supported (t5lite "
                         f"reads SwiGLU experts: hidden_act 'silu')")
    window, max_pos = hf.get("sliding_window"), hf["max_position_embeddings"]
    if window is not None and not (isinstance(max_pos, int) and window >= max_pos):
        raise ValueError(f"sliding_window: {window} is not supported (t5lite attends to the "
                         f"whole causal context; null, or a window >= max_position_embeddings="
                         f"{max_pos}, reads the same)")
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
        _llama_config(hf),
        num_experts=experts, moe_top_k=top_k, moe_every=1, expert_mlp="swiglu",
        routing="dropless", router_aux_loss=float(coef), router_z_loss=0.0)


def config_from_hf(hf: Mapping[str, Any]) -> Union[T5Config, DecoderConfig]:
    """t5lite config matching an HF config dict (unfused, unscanned, default dtype).
    For T5, `logits_via_embedding` is decided later from the weights (see `t5lite.interop.hf_families`)."""
    model_type = hf.get("model_type")
    if model_type == "t5":
        return _t5_config(hf)
    if model_type == "switch_transformers":
        return hf_switch.with_experts(_t5_config(hf_switch.as_t5(hf)), hf)
    if model_type == "llama":
        return _llama_config(hf)
    if model_type == "mixtral":
        return _mixtral_config(hf)
    raise ValueError(f"model_type: {model_type!r} is not supported "
                     f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")


# --------------------------------------------------------------------------- reverse


def t5_hf_config(cfg: T5Config) -> Dict[str, Any]:
    acts = tuple(cfg.mlp_activations)
    if len(acts) == 1:
        ffp = _ACT_TO_HF.get(acts[0])
    elif len(acts) == 2 and acts[1] == "linear" and acts[0] in _ACT_TO_HF:
        # transformers reads "gated-gelu" as the tanh GELU; exact gated GELU has no name.
        ffp = {"gelu": "gated-gelu", "gelu_exact": None}.get(acts[0], f"gated-{acts[0]}")
    else:
        ffp = None
    if ffp is None:
        raise ValueError(f"mlp_activations={acts} has no transformers T5 feed_forward_proj")
    tied = bool(cfg.logits_via_embedding)
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.emb_dim,
        "d_kv": cfg.head_dim,
        "d_ff": cfg.mlp_dim,
        "num_layers": cfg.num_encoder_layers,
        "num_decoder_layers": cfg.num_decoder_layers,
        "num_heads": cfg.num_heads,
        "relative_attention_num_buckets": cfg.relpos_num_buckets,
        "relative_attention_max_distance": cfg.relpos_max_distance,
        "dropout_rate": cfg.dropout_rate,
        "layer_norm_epsilon": cfg.layer_norm_epsilon,
        "initializer_factor": 1.0,
        "feed_forward_proj": ffp,
        "is_encoder_decoder": True,
        "tie_word_embeddings": tied,
        "scale_decoder_outputs": tied,
        "pad_token_id": 0,
        "eos_token_id": cfg.eos_id,
        "decoder_start_token_id": 0,
        "use_cache": True,
        "dtype": "float32",
    }


def _decoder_problems(cfg: DecoderConfig) -> List[str]:
    """What keeps a decoder-only config from being a transformers LLaMA / Mixtral."""
    problems = []
    if cfg.norm_type != "rms":
        problems.append(f"norm_type={cfg.norm_type!r} (needs 'rms')")
    if cfg.position_embedding != "rope":
        problems.append(f"position_embedding={cfg.position_embedding!r} (needs 'rope')")
    if cfg.bidirectional_prefix:
        problems.append("bidirectional_prefix=True (a LLaMA is causal throughout)")
    if not cfg.scale_attention_logits:
        problems.append("scale_attention_logits=False (needs head_dim**-0.5 scaling)")
    if cfg.scale_tied_logits:
        problems.append("scale_tied_logits=True (needs unscaled logits)")
    return problems


def llama_hf_config(cfg: DecoderConfig) -> Dict[str, Any]:
    acts = tuple(cfg.mlp_activations)
    problems = _decoder_problems(cfg)
    if len(acts) != 2 or acts[1] != "linear" or acts[0] not in _ACT_TO_HF:
        problems.append(f"mlp_activations={acts} (needs (ACT, 'linear'))")
    if problems:
        raise ValueError("save_pretrained writes decoder-only models as LLaMA; this config "
                         "has " + ", ".join(problems))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.emb_dim,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": _ACT_TO_HF[acts[0]],
        "max_position_embeddings": cfg.max_length,
        "rms_norm_eps": cfg.layer_norm_epsilon,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": bool(cfg.use_bias),
        "mlp_bias": bool(cfg.use_bias),
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "bos_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "use_cache": True,
        "dtype": "float32",
    }


def mixtral_hf_config(cfg: DecoderConfig) -> Dict[str, Any]:
    """config.json of a MixtralForCausalLM (transformers 5) for a mixture-of-experts
    DecoderConfig; one line naming every setting transformers' Mixtral cannot express."""
    problems = _decoder_problems(cfg)
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
    if cfg.use_bias:
        problems.append("use_bias=True (Mixtral has no biases)")
    if problems:
        raise ValueError("save_pretrained writes mixture-of-experts decoders as Mixtral; this "
                         "config has " + ", ".join(problems))
    out = {k: v for k, v in llama_hf_config(dataclasses.replace(
        cfg, mlp_activations=("silu", "linear"))).items()
        if k not in ("attention_bias", "mlp_bias")}
    return {**out, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.moe_top_k,
            "router_aux_loss_coef": cfg.router_aux_loss, "output_router_logits": False,
            "router_jitter_noise": 0.0, "sliding_window": None}
