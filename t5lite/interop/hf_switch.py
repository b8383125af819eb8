"""transformers' SwitchTransformers (T5 with experts) <-> a T5Config with experts: its
config.json's own fields and its per-expert weight layout. `t5lite.interop.hf_config`
reads the T5 part of the config, `t5lite.interop.hf_families` the weights.

Read: T5 1.0's stacks (`dense_act_fn`, ungated) whose `*_sparse_step`-th layers (from
layer 1; every layer when the step is 1) route each token to one expert by capacity,
with T5X's settings (the Switch checkpoints were trained in T5X / Mesh TensorFlow):
factors 1.25 (training) / 2.0 (eval) over groups of MOE_GROUP_SIZE tokens, flaxformer's
capacity rule, the encoder batch-prioritized. transformers routes otherwise: each
sequence its own group, `expert_capacity` slots per expert in training and evaluation
alike, tokens in order. Where either capacity binds, the two give other logits; the
settings `transformers_routing` names (MOE_GROUP_SIZE='sequence', EXPERT_CAPACITY=its
`expert_capacity`, BATCH_PRIORITIZED_ROUTING=False) give transformers' numbers, and
loading a Switch model says so in one line. Router jitter is not carried over; a dropped
token gives zero, as in T5X and transformers 5 (transformers 4 passed it on scaled by
its probability).
"""
from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Callable, Dict, Iterator, List, Mapping

import numpy as np

from t5lite.models.moe.routing import expert_capacity
from t5lite.models.moe.settings import SEQUENCE_GROUPS

log = logging.getLogger(__name__)

# the weight table's name of a sparse layer's stacked [expert, out, in] kernels
STACKED = "stacked"
_EXPERT = re.compile(r"^((?:en|de)coder\.block\.\d+\.layer\.\d+\.mlp\.experts)\."
                     r"expert_(\d+)\.(wi|wo)\.weight$")


def _count(hf: Mapping[str, Any], field: str, default: int) -> int:
    value = hf.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: expected a whole number >= 1, got {value!r}")
    return value


def hf_sparse_layers(num_layers: int, num_sparse: int) -> List[int]:
    """transformers' sparse layers of a stack: every (num_layers // num_sparse)-th from
    layer 1, every layer when that step is 1."""
    step = num_layers // num_sparse
    return [i for i in range(num_layers) if step == 1 or i % step == 1]


def as_t5(hf: Mapping[str, Any]) -> Dict[str, Any]:
    """The config.json as T5's fields (its activation, SwitchTransformersConfig's sizes)."""
    act = hf.get("dense_act_fn", hf.get("feed_forward_proj", "relu"))
    if "-" in str(act):
        raise ValueError(f"dense_act_fn: {act!r}: gated Switch MLPs are not supported "
                         f"(transformers' Switch MLPs are ungated)")
    if hf.get("router_bias"):
        raise ValueError("router_bias: true is not supported (t5lite's router has no bias)")
    return {**hf, "feed_forward_proj": act, "num_layers": hf.get("num_layers", 12),
            "d_model": hf.get("d_model", 768), "d_ff": hf.get("d_ff", 2048),
            "num_heads": hf.get("num_heads", 12)}


def with_experts(cfg, hf: Mapping[str, Any]):
    """The T5Config `cfg` of the config.json `hf` with its experts (module docstring)."""
    layers = {}
    for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        layers[stack] = hf_sparse_layers(n, _count(hf, f"num_sparse_{stack}_layers", 3))
    step = cfg.num_encoder_layers // len(layers["encoder"])
    every, first = (1, 0) if step == 1 else (step, 1)
    cfg = dataclasses.replace(
        cfg, num_experts=_count(hf, "num_experts", 8), moe_top_k=1,
        expert_mlp=cfg.mlp_activations[0], moe_every=every, moe_first=first,
        routing="capacity", capacity_factor=1.25, eval_capacity_factor=2.0,
        capacity_rule="t5x", batch_prioritized_routing=True,
        router_aux_loss=float(hf.get("router_aux_loss_coef", 0.001)),
        router_z_loss=float(hf.get("router_z_loss_coef", 0.001)))
    for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        if [i for i in range(n) if cfg.is_moe_layer(i)] != layers[stack]:
            raise ValueError(f"num_sparse_{stack}_layers: the {stack}'s sparse layers "
                             f"{layers[stack]} differ from the encoder's pattern (t5lite's "
                             f"MOE_EVERY / MOE_FIRST hold for both stacks)")
    log.info("Switch: routed with T5X's capacity (factors %g / %g over groups of "
             "MOE_GROUP_SIZE=%s tokens, the encoder batch-prioritized); transformers' own "
             "numbers, where its capacity binds: %s", cfg.capacity_factor,
             cfg.eval_capacity_factor, cfg.moe_group_size,
             " ".join(f"--gin.{k}={v!r}" for k, v in transformers_routing(hf).items()))
    return cfg


def transformers_routing(hf: Mapping[str, Any]) -> Dict[str, Any]:
    """The macros that route as transformers' Switch does (each sequence its own group,
    its `expert_capacity` slots per expert, tokens in order)."""
    return {"MOE_GROUP_SIZE": SEQUENCE_GROUPS,
            "EXPERT_CAPACITY": _count(hf, "expert_capacity", 64),
            "BATCH_PRIORITIZED_ROUTING": False}


def switch_hf_config(cfg, t5_hf_config: Callable) -> Dict[str, Any]:
    """A T5Config with experts as a SwitchTransformersConfig dict (`t5_hf_config` gives
    T5's fields); one line for what transformers' Switch cannot hold. Its
    `expert_capacity` (per sequence): `_hf_capacity`."""
    problems = []
    if cfg.moe_top_k != 1 or cfg.routing != "capacity":
        problems.append(f"MOE_TOP_K={cfg.moe_top_k}, ROUTING={cfg.routing!r} (Switch routes "
                        f"each token to 1 expert by capacity)")
    if len(cfg.mlp_activations) != 1 or cfg.expert_activations != tuple(cfg.mlp_activations):
        problems.append(f"mlp_activations={tuple(cfg.mlp_activations)} with EXPERT_MLP="
                        f"{cfg.expert_mlp!r} (Switch's MLPs and experts share one ungated "
                        f"activation)")
    sparse = {}
    for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        ours = [i for i in range(n) if cfg.is_moe_layer(i)]
        if not ours or hf_sparse_layers(n, len(ours)) != ours:
            problems.append(f"the {stack}'s sparse layers {ours} (transformers makes every "
                            f"step-th from layer 1)")
        sparse[stack] = len(ours)
    if problems:
        raise ValueError("transformers' SwitchTransformers cannot hold this model: "
                         + "; ".join(problems))
    out = t5_hf_config(cfg)  # its feed_forward_proj: the one (ungated) activation's name
    act = out.pop("feed_forward_proj")
    del out["scale_decoder_outputs"]
    return {**out, "architectures": ["SwitchTransformersForConditionalGeneration"],
            "model_type": "switch_transformers", "dense_act_fn": act,
            "num_experts": cfg.num_experts,
            "num_sparse_encoder_layers": sparse["encoder"],
            "num_sparse_decoder_layers": sparse["decoder"],
            "expert_capacity": _hf_capacity(cfg),
            "router_bias": False, "router_jitter_noise": 0.0, "router_dtype": "float32",
            "router_ignore_padding_tokens": False,
            "router_aux_loss_coef": cfg.router_aux_loss,
            "router_z_loss_coef": cfg.router_z_loss}


def _hf_capacity(cfg) -> int:
    """transformers' `expert_capacity` (per sequence): EXPERT_CAPACITY when set, else the
    slots of a MOE_GROUP_SIZE group at EVAL_CAPACITY_FACTOR."""
    if cfg.expert_capacity:
        return int(cfg.expert_capacity)
    if cfg.moe_group_size == SEQUENCE_GROUPS:
        raise ValueError("transformers' SwitchTransformers needs an expert_capacity, and "
                         "MOE_GROUP_SIZE='sequence' without EXPERT_CAPACITY sets none: set "
                         "EXPERT_CAPACITY")
    return expert_capacity(cfg.moe_group_size, cfg.num_experts, cfg.eval_capacity_factor,
                           cfg.capacity_rule)


def _sparse_layers(cfg) -> Iterator[str]:
    """The HF prefix of each sparse layer's experts."""
    for stack, n_layers, sub in (("encoder", cfg.num_encoder_layers, 1),
                                 ("decoder", cfg.num_decoder_layers, 2)):
        for i in filter(cfg.is_moe_layer, range(n_layers)):
            yield f"{stack}.block.{i}.layer.{sub}.mlp.experts"


def read_layout(cfg, tensors: Dict[str, np.ndarray], path) -> Dict[str, np.ndarray]:
    """Each sparse layer's per-expert kernels stacked under the weight table's names; one
    line when an expert is missing or there are more than config.json's num_experts."""
    tensors, found = dict(tensors), {}
    for name in list(tensors):
        m = _EXPERT.match(name)
        if m:
            found.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = tensors.pop(name)
    for experts in _sparse_layers(cfg):
        for w in ("wi", "wo"):
            have = found.pop((experts, w), {})
            if sorted(have) != list(range(cfg.num_experts)):
                raise ValueError(
                    f"{path}: {experts} holds {w} of experts {sorted(have)[:8]}, but "
                    f"config.json's num_experts is {cfg.num_experts} (experts 0 to "
                    f"{cfg.num_experts - 1}, each with wi and wo)")
            tensors[f"{experts}.{STACKED}.{w}"] = np.stack(
                [have[j] for j in range(cfg.num_experts)])
    if found:
        raise ValueError(f"{path}: experts in a layer the config holds dense: "
                         f"{sorted(found)[0][0]} (config.json's sparse layers disagree)")
    return tensors


def write_layout(cfg, state: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The stacked expert kernels written one expert at a time, as transformers does."""
    state = dict(state)
    for experts in _sparse_layers(cfg):
        for w in ("wi", "wo"):
            for j, kernel in enumerate(state.pop(f"{experts}.{STACKED}.{w}")):
                state[f"{experts}.expert_{j}.{w}.weight"] = kernel
    return state
