"""Hugging Face config.json <-> t5lite configs.

`read_hf_config` reads a local model directory's config.json; `config_from_hf` maps it
to a `T5Config` (`model_type` "t5", and "switch_transformers": a T5Config with top-1
capacity-routed experts in every `*_sparse_step`-th layer, T5X's settings) or a
`DecoderConfig` (LLaMA and its kin: "llama", "mistral", "qwen2", "qwen3", "mixtral";
`t5lite.interop.hf_decoder_config`), unfused, unscanned and with t5lite's default dtype
(Switch's own fields: `t5lite.interop.hf_switch`). `t5_hf_config` and
`hf_decoder_config.decoder_hf_config` go the other way for
`t5lite.interop.hf.save_pretrained`. Weights (and the output-head decision that depends on
them) live in `t5lite.interop.hf_families`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Mapping, Union

from t5lite.interop import hf_switch
from t5lite.interop.hf_decoder_config import (
    ACT_TO_HF, DECODER_MODEL_TYPES, act_from_hf, decoder_config, token_id)
from t5lite.models.configs import DecoderConfig, T5Config

PathLike = Union[str, Path]
CONFIG_NAME = "config.json"
SUPPORTED_MODEL_TYPES = ("t5", "switch_transformers") + DECODER_MODEL_TYPES

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


def _t5_config(hf: Mapping[str, Any]) -> T5Config:
    ffp = hf.get("feed_forward_proj", "relu")
    parts = ffp.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        raise ValueError(f"feed_forward_proj: {ffp!r} is not 'ACT' or 'gated-ACT'")
    act = "gelu_new" if ffp == "gated-gelu" else parts[-1]  # as transformers does
    act = act_from_hf(act, f"feed_forward_proj={ffp!r}")
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
        eos_id=token_id(hf, "eos_token_id", 1),
    )


def t5_scales_output(hf: Mapping[str, Any]) -> bool:
    """Whether transformers multiplies the T5 decoder output by d_model**-0.5."""
    if "scale_decoder_outputs" in hf:
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings", True) is not False


def config_from_hf(hf: Mapping[str, Any]) -> Union[T5Config, DecoderConfig]:
    """t5lite config matching an HF config dict (unfused, unscanned, default dtype).
    For T5, `logits_via_embedding` is decided later from the weights (see `t5lite.interop.hf_families`)."""
    model_type = hf.get("model_type")
    if model_type == "t5":
        return _t5_config(hf)
    if model_type == "switch_transformers":
        return hf_switch.with_experts(_t5_config(hf_switch.as_t5(hf)), hf)
    if model_type in DECODER_MODEL_TYPES:
        return decoder_config(hf)
    raise ValueError(f"model_type: {model_type!r} is not supported "
                     f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")


# --------------------------------------------------------------------------- reverse


def t5_hf_config(cfg: T5Config) -> Dict[str, Any]:
    acts = tuple(cfg.mlp_activations)
    if len(acts) == 1:
        ffp = ACT_TO_HF.get(acts[0])
    elif len(acts) == 2 and acts[1] == "linear" and acts[0] in ACT_TO_HF:
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
