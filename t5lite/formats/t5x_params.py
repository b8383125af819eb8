"""T5X's `examples/t5` parameter tree (T5 v1.1 and v1.0) onto t5lite's T5 tree.

The names are the same (t5lite kept T5X's); the layouts differ only in the attention
kernels, which T5X stores with the heads joined:

    T5X                                           t5lite
    .../{query,key,value}/kernel  [embed, heads*kv]   [embed, heads, kv]
    .../out/kernel                [heads*kv, embed]   [heads, kv, embed]

(joined index = head * kv + k in both directions). T5X's `contrib/moe` (flaxformer's
MoE layers: Switch Transformers) names a sparse layer's parameters apart:

    .../mlp/router/router_weights/w/kernel  [embed, experts]     .../mlp/router/kernel
    .../mlp/expert/{wi,wi_0,wi_1,wo}/kernel [experts, in, out]   .../mlp/{wi,...}/kernel

(`t5lite_name`; the same shapes). Everything else, relpos_bias [heads, buckets]
included, maps as it is. The query scaling 1/sqrt(kv) is in the
weights in both (T5's convention), so nothing is rescaled.

    params = params_from_t5x(read_checkpoint(path)["target"], model)

The result is in the unfused, unscanned layout (`t5lite.models.layouts` converts).
"""
from __future__ import annotations

import re
from typing import Any, Dict, Mapping

import numpy as np

from t5lite.errors import CheckpointMismatchError
from t5lite.formats.checkpoint_trees import expert_counts
from t5lite.models.common.param_paths import flatten, unflatten

_JOINED_IN = re.compile(r"(attention|self_attention|encoder_decoder_attention)/"
                        r"(query|key|value)/kernel$")
_JOINED_OUT = re.compile(r"(attention|self_attention|encoder_decoder_attention)/out/kernel$")
_MOE_NAMES = ((re.compile(r"/mlp/router/router_weights/w/kernel$"), "/mlp/router/kernel"),
              (re.compile(r"/mlp/expert/(wi|wi_\d+|wo)/kernel$"), r"/mlp/\1/kernel"))


def t5lite_name(name: str) -> str:
    """A T5X parameter's name in t5lite's tree (a sparse layer's router and experts are
    named apart in T5X's MoE layers; every other name is the same)."""
    for pattern, repl in _MOE_NAMES:
        name = pattern.sub(repl, name)
    return name


def params_from_t5x(target: Mapping[str, Any], model, origin: str = "the T5X checkpoint"
                    ) -> Dict[str, Any]:
    """t5lite params (numpy, the checkpoint's dtype) for `model` (a T5 encoder-decoder in
    the unfused, unscanned layout) from T5X's `target` tree. CheckpointMismatchError in
    one line naming the parameter: one the model needs and T5X lacks, one T5X holds and
    the model has no place for (another network), or a shape that does not fit."""
    expected = {name: tuple(leaf.shape) for name, leaf in
                flatten(model.abstract_variables()["params"]).items()}
    given = {t5lite_name(name): value for name, value in flatten(target).items()}
    unknown = sorted(set(given) - set(expected))
    if unknown:
        experts = ("; a router or experts: a mixture of experts (NUM_EXPERTS, MOE_EVERY, "
                   "MOE_FIRST as the checkpoint's sparse layers)"
                   if any("/router/" in n for n in given) else "")
        raise CheckpointMismatchError(
            f"{origin} holds parameter {unknown[0]!r} ({len(unknown)} in all) that this model "
            f"has no place for: it is another network, or the model config differs (T5 v1.0 "
            f"has mlp/wi and logits via the embedding; v1.1 mlp/wi_0, wi_1 and logits_dense"
            f"{experts})")
    missing = sorted(set(expected) - set(given))
    if missing:
        raise CheckpointMismatchError(
            f"{origin} lacks parameter {missing[0]!r} ({len(missing)} in all) that this model "
            f"needs; check the model config against the checkpoint's network")
    params = {}
    for name, shape in expected.items():
        value = np.asarray(given[name])
        if _JOINED_IN.search(name) and value.ndim == 2 and len(shape) == 3 \
                and value.shape == (shape[0], shape[1] * shape[2]):
            value = value.reshape(shape)
        elif _JOINED_OUT.search(name) and value.ndim == 2 and len(shape) == 3 \
                and value.shape == (shape[0] * shape[1], shape[2]):
            value = value.reshape(shape)
        if value.shape != shape:
            raise CheckpointMismatchError(
                f"{origin}: parameter {name!r} has shape {list(value.shape)}, the model needs "
                f"{list(shape)}{expert_counts(name, value.shape, shape)}; check the model "
                f"config against the checkpoint's")
        params[name] = value
    return unflatten(params)
