"""Sparse upcycling (Komatsuzaki et al.; T5X's `contrib/moe` UpcycleCheckpointer):
INITIAL_CHECKPOINT_STATE='upcycle' starts a mixture-of-experts run from a dense
checkpoint of the same architecture (a t5lite checkpoint, a converted one, or a T5X one:
whatever INITIAL_CHECKPOINT_PATH reads). Every parameter the dense model has is copied;
each sparse layer's experts are copies of that layer's dense MLP (each [in, out] kernel
broadcast to [experts, in, out]); the routers are fresh (the run's own initializer);
the optimizer starts fresh at step 0.

With top-k > 1 the gates are renormalized to sum to one, so identical experts give the
dense MLP's output exactly: the upcycled model's first logits are the dense model's
(where capacity drops nothing). With top-1 (Switch) the gate is the raw router
probability, so each sparse layer's MLP output starts scaled by it (about 1/experts for a
fresh router) and the first logits differ from the dense model's.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, Mapping

import jax
import numpy as np

from t5lite.errors import CheckpointMismatchError, ConfigError
from t5lite.formats import placement
from t5lite.models import layouts
from t5lite.models.common.param_paths import flatten, unflatten
from t5lite.runtime.checkpointing import finetune_restore

log = logging.getLogger(__name__)
ROUTER = "/mlp/router/kernel"


def check(model) -> None:
    """One line when `model` cannot be upcycled: no experts, or experts unlike its MLP."""
    cfg = getattr(model, "config", None)
    if not getattr(cfg, "num_experts", 0):
        raise ConfigError("INITIAL_CHECKPOINT_STATE='upcycle' turns a dense checkpoint into "
                          "a mixture of experts, and the model has none: set NUM_EXPERTS "
                          "(and MOE_EVERY / MOE_FIRST), or INITIAL_CHECKPOINT_STATE='params'")
    if tuple(cfg.expert_activations) != tuple(cfg.mlp_activations):
        raise ConfigError(f"INITIAL_CHECKPOINT_STATE='upcycle' copies the dense MLP into each "
                          f"expert, and EXPERT_MLP={cfg.expert_mlp!r} is not the MLP's "
                          f"{tuple(cfg.mlp_activations)}: set EXPERT_MLP to match (geglu for "
                          f"T5 v1.1, relu for T5 1.0, swiglu for LLaMA)")


def upcycled(dense: Mapping[str, np.ndarray], fresh: Mapping[str, np.ndarray],
             shapes: Mapping[str, tuple], num_experts: int) -> Dict[str, np.ndarray]:
    """Flat parameter trees (names -> arrays): the MoE model's `shapes` filled from the
    dense model's `dense` (copied, or broadcast over a leading expert axis) and, for the
    routers, from `fresh`. CheckpointMismatchError in one line for a parameter neither
    gives."""
    out = {}
    for name, shape in shapes.items():
        if name.endswith(ROUTER):
            out[name] = np.asarray(fresh[name])
        elif name in dense and tuple(dense[name].shape) == tuple(shape):
            out[name] = np.asarray(dense[name])
        elif name in dense and tuple(shape) == (num_experts,) + tuple(dense[name].shape):
            out[name] = np.broadcast_to(dense[name], shape)
        else:
            held = list(dense[name].shape) if name in dense else "nothing"
            raise CheckpointMismatchError(
                f"upcycling: the dense checkpoint holds {held} for {name!r}, and the model "
                f"with experts needs {list(shape)}: it is another model size or architecture")
    return out


def restore_upcycled(path, model, abstract_params: Mapping[str, Any],
                     fresh: Callable[[], Any]) -> Dict[str, Any]:
    """The parameters of `model` (with experts) upcycled from the dense checkpoint at
    `path`, placed as `abstract_params` ({"params": ...} with shardings) describes;
    `fresh()`: the run's initialized parameters (the routers come from them)."""
    check(model)
    cfg = model.config
    plain = layouts.canonical_config(cfg)
    dense_model = type(model)(dataclasses.replace(plain, num_experts=0))
    host = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                        dense_model.abstract_variables()["params"])
    dense = finetune_restore.restore_params_for_finetuning(path, dense_model, host)
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        mine = layouts.convert_params({"params": jax.device_get(fresh()["params"])}, cfg,
                                      plain)["params"]
        mine = jax.tree.map(np.asarray, mine)
    shapes = {n: tuple(np.shape(a)) for n, a in flatten(mine).items()}
    params = unflatten(upcycled(flatten(jax.device_get(dense)), flatten(mine), shapes,
                                cfg.num_experts))
    log.info("upcycled %s: each sparse layer's %d experts copies of its dense MLP, the "
             "routers fresh", path, cfg.num_experts)
    return placement.convert_and_place(
        params, model, layouts.config_layout(plain), layouts.config_layout(cfg),
        abstract_params, lambda diff: f"upcycling {path}: {diff}")
