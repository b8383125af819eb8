"""The finetuning restore: the parameters of a checkpoint (INITIAL_CHECKPOINT_PATH, a
converted checkpoint, or CHECKPOINT_PATH for eval / infer / export) as the model wants
them. A training checkpoint gives its `params` only; a stored layout other than the
model's (fused / unfused QKV, scanned / unscanned layers) is converted on the host; a
checkpoint of another architecture or size is refused in one line
(CheckpointMismatchError). A T5X run continued at its step (INITIAL_CHECKPOINT_STATE=
'train_state') also gets its Adafactor state (`continue_t5x_run`). A LoRA model given a
checkpoint without adapters gets the base from it and fresh adapters; adapters other
than the model's are refused (`lora_restore`).
"""
from __future__ import annotations

import dataclasses
import logging
import types
from typing import Any, Callable, Dict, Mapping, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from t5lite.errors import CheckpointMismatchError, ConfigError
from t5lite.formats import t5x_checkpoint, t5x_optimizer_state, t5x_params
from t5lite.models import layouts, lora
from t5lite.formats.checkpoint_files import PARAMS_ITEM, STATE_ITEM, PathLike, resolve_item
from t5lite.runtime.checkpointing import lora_restore
from t5lite.formats.checkpoint_trees import (first_difference, flat_shapes, item_metadata_tree,
                                             layout_str)

log = logging.getLogger(__name__)


def _layout_cfg(model, layout: Mapping[str, bool]):
    if model is not None and dataclasses.is_dataclass(getattr(model, "config", None)):
        return dataclasses.replace(model.config, **layout)
    return types.SimpleNamespace(**layout)


def place(x: np.ndarray, like: Any) -> Any:
    """`x` (host) as `like` (a jax.ShapeDtypeStruct, with a sharding or not) describes it."""
    x = np.asarray(x, dtype=like.dtype)
    sharding = getattr(like, "sharding", None)
    if sharding is None:
        return x
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def restore_params_for_finetuning(path: PathLike, model: Any, abstract_params: Mapping[str, Any],
                                  what: str = "INITIAL_CHECKPOINT_PATH",
                                  fresh: Optional[Callable[[], Any]] = None) -> Dict[str, Any]:
    """The parameters of the checkpoint at `path` (INITIAL_CHECKPOINT_PATH, or the setting
    `what` names; see `checkpoint_files.resolve_item`), as `abstract_params`
    (`{"params": ...}` of jax.ShapeDtypeStruct with shardings) describes them. A training
    checkpoint gives its `params` only. A stored layout other than the model's (fused /
    unfused QKV, scanned / unscanned layers) is converted (on the host); then the shapes
    are checked (CheckpointMismatchError). With LoRA (`lora_restore`): a checkpoint
    without adapters gives the base, `fresh()` (the init's parameters) the adapters; one
    with other adapters than the model's, or trained with another LORA_ALPHA, is refused."""
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "lora_rank"):
        if t5x_checkpoint.is_t5x_checkpoint(path):
            stored, where = None, str(path)
        else:
            item_dir, _, where, meta = _stored(path, what)
            stored = lora_restore.stored_lora(meta["params"])
        lora_restore.check_adapters(stored, cfg, where, what)
        if stored is not None:  # the adapters load: under the alpha they were trained with
            lora_restore.check_alpha(lora_restore.recorded(item_dir, lora_restore.ALPHA_KEY),
                                     cfg, f"{what} {where}")
        if stored is None and lora.enabled(cfg):
            return lora_restore.restore_base(
                lambda base, abstract: _restore(path, base, abstract, what), model,
                abstract_params, fresh, where, what)
    return _restore(path, model, abstract_params, what)


def _stored(path: PathLike, what: str):
    """(item dir, item, where, its {"params": ...} metadata) of a t5lite checkpoint."""
    item_dir, item = resolve_item(path, what)
    where = str(item_dir.parent if item_dir.name in (PARAMS_ITEM, STATE_ITEM) else item_dir)
    meta = item_metadata_tree(item_dir)
    stored = meta.get("params", {}) if item == STATE_ITEM else meta  # {"params": ...}
    if not isinstance(stored, Mapping) or "params" not in stored:
        raise FileNotFoundError(f"{what} {path}: {item_dir} holds no 'params' collection")
    return item_dir, item, where, stored


def _restore(path: PathLike, model: Any, abstract_params: Mapping[str, Any],
             what: str) -> Dict[str, Any]:
    if t5x_checkpoint.is_t5x_checkpoint(path):
        return restore_t5x_params(t5x_checkpoint.read_checkpoint(path), path, model,
                                  abstract_params, what)
    item_dir, item, where, stored = _stored(path, what)
    bare = "params" not in abstract_params  # a bare params tree: return one alike
    target = {"params": abstract_params if bare else abstract_params["params"]}
    src_layout = layouts.detect_layout(stored)
    dst_layout = (_model_layout(model) if model is not None and hasattr(model, "config")
                  else layouts.detect_layout(target))
    head = f"checkpoint {where} does not match the model: "
    cause = (f"{what} probably holds another model size or architecture — "
             "point it at a checkpoint of this model (or fix the model config)")
    mine, theirs = sorted(target["params"]), sorted(stored["params"])
    if mine != theirs:  # another architecture altogether: say so, not a leaf's shape
        raise CheckpointMismatchError(
            f"checkpoint {where} holds another architecture than MODEL: its top-level modules "
            f"are {', '.join(theirs)}, the model's {', '.join(mine)} — {what} must be a "
            f"checkpoint of the same family (T5 for a T5 model, GPT / LLaMA for a "
            f"decoder-only one), converted with python -m t5lite.convert if it comes from "
            f"Hugging Face")

    if src_layout == dst_layout:
        diff = first_difference(flat_shapes(stored), flat_shapes(target))
        if diff:
            raise CheckpointMismatchError(head + diff + "; " + cause)
        request = {"params": target} if item == STATE_ITEM else target
        with ocp.PyTreeCheckpointer() as ckpt:
            restored = ckpt.restore(item_dir, args=ocp.args.PyTreeRestore(
                item=request, restore_args=ocp.checkpoint_utils.construct_restore_args(request),
                partial_restore=True))
        restored = restored["params"] if item == STATE_ITEM else restored
        return restored["params"] if bare else restored

    # Another layout: read to host memory, convert there, check, then place.
    log.info("converting %s from %s to %s", where, layout_str(src_layout), layout_str(dst_layout))
    host = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), stored)
    request = {"params": host} if item == STATE_ITEM else host
    with ocp.PyTreeCheckpointer() as ckpt:
        loaded = ckpt.restore(item_dir, args=ocp.args.PyTreeRestore(
            item=request, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(
                restore_type=np.ndarray), request), partial_restore=True))
    loaded = loaded["params"] if item == STATE_ITEM else loaded
    return convert_and_place(
        loaded["params"], model, src_layout, dst_layout, abstract_params,
        lambda diff: head + diff + f" (after converting from {layout_str(src_layout)} to "
                                   f"{layout_str(dst_layout)}); " + cause)


def _model_layout(model) -> Dict[str, bool]:
    return {"fuse_qkv": bool(model.config.fuse_qkv),
            "scan_layers": bool(model.config.scan_layers)}


def convert_and_place(params: Mapping[str, Any], model: Any, src_layout: Mapping[str, bool],
                       dst_layout: Mapping[str, bool], abstract_params: Mapping[str, Any],
                       mismatch) -> Dict[str, Any]:
    """`params` (host arrays in `src_layout`) converted on the host to `dst_layout`,
    checked against `abstract_params`' shapes (CheckpointMismatchError(mismatch(the first
    difference))), then cast and placed as `abstract_params` describes them."""
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        converted = layouts.convert_params({"params": params}, _layout_cfg(model, src_layout),
                                           _layout_cfg(model, dst_layout))
        converted = jax.tree.map(np.asarray, converted)
    bare = "params" not in abstract_params  # a bare params tree: return one alike
    target = {"params": abstract_params if bare else abstract_params["params"]}
    diff = first_difference(flat_shapes(converted), flat_shapes(target))
    if diff:
        raise CheckpointMismatchError(mismatch(diff))
    placed = jax.tree.map(place, converted, target)
    return placed["params"] if bare else placed


def restore_t5x_params(tree: Mapping[str, Any], path: PathLike, model: Any,
                       abstract_params: Mapping[str, Any], what: str) -> Dict[str, Any]:
    """The parameters of a T5X checkpoint (`tree`: `t5x_checkpoint.read_checkpoint(path)`),
    T5X's tree mapped onto the model's (`t5x_params`), converted to the model's layout,
    cast and placed."""
    if model is None or getattr(model, "FEATURE_CONVERTER_KIND", None) != "encoder_decoder":
        raise CheckpointMismatchError(f"{what} {path} is a T5X checkpoint; t5lite reads T5X's "
                                      f"T5 networks (examples/t5) into a T5 model only")
    canonical = {"fuse_qkv": False, "scan_layers": False}
    plain = type(model)(_layout_cfg(model, canonical))
    params = t5x_params.params_from_t5x(tree["target"], plain, origin=f"{what} {path}")
    log.info("restoring parameters from T5X checkpoint %s", path)
    return convert_and_place(
        params, model, canonical, _model_layout(model), abstract_params,
        lambda diff: f"T5X checkpoint {path} does not match the model: {diff}")


def continue_t5x_run(path, model, abstract_state, init_fn, factoring):
    """The train state of the T5X checkpoint at `path` (INITIAL_CHECKPOINT_STATE=
    'train_state'): its parameters, its step and its Adafactor state; FP8 state and the
    dropout rng fresh from `init_fn()`. Everything is mapped and checked before anything
    is placed on the devices."""
    if lora.enabled(model.config):
        raise ConfigError("INITIAL_CHECKPOINT_STATE='train_state' continues a T5X run's "
                          "Adafactor state over every parameter, and a LoRA run (LORA_RANK "
                          "> 0) trains its adapters only: set INITIAL_CHECKPOINT_STATE="
                          "'params' (the base from the checkpoint, a fresh optimizer)")
    if not t5x_checkpoint.is_t5x_checkpoint(path):
        raise ConfigError(f"INITIAL_CHECKPOINT_STATE='train_state' continues a T5X run, and "
                          f"INITIAL_CHECKPOINT_PATH {path} is no T5X checkpoint (a t5lite run "
                          f"continues from its own MODEL_DIR); or set "
                          f"INITIAL_CHECKPOINT_STATE='params'")
    tree = t5x_checkpoint.read_checkpoint(path)
    origin = f"INITIAL_CHECKPOINT_PATH {path}"
    opt_state = t5x_optimizer_state.opt_state_from_t5x(
        tree["state"], model, abstract_state.opt_state, factoring, origin)
    params = restore_t5x_params(tree, path, model, abstract_state.params,
                                "INITIAL_CHECKPOINT_PATH")
    opt_state = jax.tree.map(place, opt_state, abstract_state.opt_state)
    step = place(np.asarray(tree["state"]["step"], np.int32), abstract_state.step)
    return init_fn().replace(step=step, params=params, opt_state=opt_state)
