"""Host parameters made into the model's: converted to its layout (fused / unfused QKV,
stacked / unstacked layers, their pipeline repeats) on the host, checked against its shapes, cast and placed on
its devices as an abstract tree (jax.ShapeDtypeStruct with shardings) describes them.
What every checkpoint reader (`checkpoint_kinds`) and the upcycling end with.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Dict, Mapping

import jax
import numpy as np

from t5lite.errors import CheckpointMismatchError
from t5lite.formats.checkpoint_trees import first_difference, flat_shapes
from t5lite.models import layouts

# how T5X and Hugging Face store them
CANONICAL = {"fuse_qkv": False, "scan_layers": False, "pipeline_repeats": 1}


def layout_config(model, layout: Mapping[str, Any]):
    """`model`'s config with the layout of `layout` (`layouts.detect_layout`'s keys; a
    namespace without one). Its `scan_layers` says whether the layers are stacked, so the
    pipeline's own reason to stack them is dropped (a config, not a run)."""
    layout = {"pipeline_repeats": 1, **layout}
    if model is not None and dataclasses.is_dataclass(getattr(model, "config", None)):
        extra = ({"pipeline_microbatches": None}
                 if hasattr(model.config, "pipeline_microbatches") else {})
        return dataclasses.replace(model.config, **layout, **extra)
    return types.SimpleNamespace(**layout)


def model_layout(model) -> Dict[str, Any]:
    return layouts.config_layout(model.config)


def place(x: np.ndarray, like: Any) -> Any:
    """`x` (host) as `like` (a jax.ShapeDtypeStruct, with a sharding or not) describes it."""
    x = np.asarray(x, dtype=like.dtype)
    sharding = getattr(like, "sharding", None)
    if sharding is None:
        return x
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def convert_and_place(params: Mapping[str, Any], model: Any, src_layout: Mapping[str, bool],
                      dst_layout: Mapping[str, bool], abstract_params: Mapping[str, Any],
                      mismatch: Callable[[str], str]) -> Dict[str, Any]:
    """`params` (host arrays in `src_layout`) converted on the host to `dst_layout`,
    checked against `abstract_params`' shapes (CheckpointMismatchError(mismatch(the first
    difference))), then cast and placed as `abstract_params` ({"params": ...}, or a bare
    params tree: the result is alike) describes them."""
    converted = layouts.convert_params({"params": params}, layout_config(model, src_layout),
                                       layout_config(model, dst_layout))  # numpy: no compile
    bare = "params" not in abstract_params
    target = {"params": abstract_params if bare else abstract_params["params"]}
    diff = first_difference(flat_shapes(converted), flat_shapes(target))
    if diff:
        raise CheckpointMismatchError(mismatch(diff))
    placed = jax.tree.map(place, converted, target)
    return placed["params"] if bare else placed
