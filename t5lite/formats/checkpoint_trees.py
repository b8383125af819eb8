"""Whether a checkpoint's tree fits the model: the first difference between two trees'
shapes, said in one line with its likely cause (another model size, another parameter
layout, FP8 or optimizer setting), and the tree an item directory holds (its Orbax
metadata; no array is read).
"""
from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from t5lite.errors import CheckpointMismatchError, ConfigError
from t5lite.models import layouts, lora

Adapters = Tuple[int, Tuple[str, ...]]  # (LoRA rank, sorted targets)


def key_name(k) -> str:
    """A tree path entry's name (a dict key, a field, an index) as the paths here spell it."""
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def flat_shapes(tree: Any) -> Dict[str, Tuple[int, ...]]:
    """{"a/b/c": shape} over the leaves; None and empty containers have no leaves.
    Namedtuples (targets) and dicts (Orbax metadata of namedtuples) name fields alike."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(key_name(k) for k in path):
            tuple(leaf.shape if hasattr(leaf, "shape") else np.shape(leaf))
            for path, leaf in flat}


def _natural(path: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


_EXPERT_KERNEL = re.compile(r"/mlp/(wi|wi_\d+|wo)/kernel$")


def expert_counts(path: str, ckpt: tuple, model: tuple) -> str:
    """' (N experts in the checkpoint, NUM_EXPERTS=M in the model)' when `path` is a
    sparse layer's router kernel [.., embed, experts] or expert kernel [experts, in, out]
    whose shapes differ in the expert count alone; '' otherwise."""
    ckpt, model = tuple(ckpt), tuple(model)
    if len(ckpt) != len(model) or not ckpt:
        return ""
    if path.endswith("/router/kernel") and ckpt[:-1] == model[:-1]:
        n, m = ckpt[-1], model[-1]
    elif _EXPERT_KERNEL.search(path) and len(model) == 3 and ckpt[1:] == model[1:]:
        n, m = ckpt[0], model[0]
    else:
        return ""
    return f" ({n} experts in the checkpoint, NUM_EXPERTS={m} in the model)"


def first_difference(ckpt: Dict[str, tuple], model: Dict[str, tuple]) -> Optional[str]:
    """The first difference as a clause, shapes first, then missing, then extra."""
    for path in sorted(model, key=_natural):
        if path in ckpt and tuple(ckpt[path]) != tuple(model[path]):
            return (f"{path} has shape {tuple(ckpt[path])} in the checkpoint but "
                    f"{tuple(model[path])} in the model"
                    f"{expert_counts(path, ckpt[path], model[path])}")
    missing = sorted((p for p in model if p not in ckpt), key=_natural)
    extra = sorted((p for p in ckpt if p not in model), key=_natural)
    if missing:
        more = f", {len(extra)} in the checkpoint only" if extra else ""
        return (f"{missing[0]} is in the model but not in the checkpoint ({len(missing)} "
                f"missing{more})")
    if extra:
        return (f"{extra[0]} is in the checkpoint but not in the model ({len(extra)} "
                f"in the checkpoint only)")
    return None


def layout_str(layout: Mapping[str, Any]) -> str:
    runs = layout.get("pipeline_repeats", 1)
    return (f"fuse_qkv={layout['fuse_qkv']}, scan_layers={layout['scan_layers']}"
            + (f", pipeline_repeats={runs}" if runs != 1 else ""))


def stored_adapters(params: Mapping[str, Any]) -> Optional[Adapters]:
    """(rank, sorted targets) of the LoRA adapters in a params tree (arrays or metadata
    with .shape), None when it has none."""
    names = {"qkv": lora.QKV, "kv": ("key", "value")}
    rank, targets = None, set()

    def walk(tree, name):
        nonlocal rank
        if lora.A in tree and hasattr(tree[lora.A], "shape"):
            rank = int(tree[lora.A].shape[-1])
            targets.update(names.get(name, (name,)))
        for key, value in tree.items():
            if isinstance(value, Mapping):
                walk(value, str(key))

    walk(params, "")
    return None if rank is None else (rank, tuple(sorted(targets)))


def say_adapters(adapters: Optional[Adapters]) -> str:
    if adapters is None:
        return "no LoRA adapters"
    return f"LoRA rank {adapters[0]} on {', '.join(adapters[1])}"


def _check_adapters(ckpt: Optional[Adapters], model: Optional[Adapters], where: str) -> None:
    """ConfigError (one line) when a run's checkpoint holds other LoRA adapters than the
    model asks for (LORA_RANK, LORA_TARGETS): what each holds and how to go on."""
    if ckpt == model:
        return
    head = f"checkpoint {where} holds {say_adapters(ckpt)}, the config asks for "
    if ckpt is None:
        raise ConfigError(head + f"{say_adapters(model)}: it is a run without LoRA — set "
                          f"LORA_RANK=0 to resume it, or start a new MODEL_DIR with "
                          f"INITIAL_CHECKPOINT_PATH={where} to train adapters on it")
    resume = f"set LORA_RANK={ckpt[0]} and LORA_TARGETS={list(ckpt[1])} to resume it"
    if model is None:
        raise ConfigError(head + f"none (LORA_RANK=0): {resume}, or merge them first "
                          f"(python -m t5lite.convert --to=hf merges them)")
    raise ConfigError(head + f"{say_adapters(model)} (LORA_RANK={model[0]}): {resume}, or "
                      f"start a new MODEL_DIR with INITIAL_CHECKPOINT_PATH at the base "
                      f"checkpoint for other adapters")


def _state_groups(tree: Mapping[str, Any]) -> Dict[str, Dict[str, tuple]]:
    """Flat shapes of a state dict by group; params paths shown as variables paths
    (`params/encoder/...`), the others prefixed by their field."""
    groups = {}
    for field in ("params", "fp8", "opt_state"):
        flat = flat_shapes(tree.get(field, {}) if isinstance(tree, Mapping) else {})
        groups[field] = flat if field == "params" else {f"{field}/{k}": v for k, v in flat.items()}
    rest = {k: v for k, v in tree.items() if k not in groups} if isinstance(tree, Mapping) else {}
    groups["other"] = flat_shapes(rest)
    return groups


def _params_of(tree: Any) -> Mapping[str, Any]:
    params = tree.get("params", {}) if isinstance(tree, Mapping) else {}
    return params if isinstance(params, Mapping) else {}


def check_state_matches(ckpt_tree: Mapping[str, Any], target: Mapping[str, Any],
                        where: str) -> None:
    """Raise CheckpointMismatchError (one line) when a training checkpoint's state tree
    (Orbax metadata) does not fit the abstract target state dict; ConfigError when it
    holds other LoRA adapters than the model (a setting to change: LORA_RANK)."""
    _check_adapters(stored_adapters(_params_of(ckpt_tree)), stored_adapters(_params_of(target)),
                    where)
    ck, md = _state_groups(ckpt_tree), _state_groups(target)
    head = f"checkpoint {where} does not match the model: "
    diff = first_difference(ck["params"], md["params"])
    if diff:
        ck_layout = layouts.detect_layout(ckpt_tree.get("params", {}))
        md_layout = layouts.detect_layout(target.get("params", {}))
        if ck_layout != md_layout:
            cause = (f"the checkpoint has the parameter layout {layout_str(ck_layout)} but the "
                     f"model {layout_str(md_layout)} — resume with the same switches, or start "
                     f"a new MODEL_DIR with INITIAL_CHECKPOINT_PATH={where} (converts layouts)")
        elif " has shape " in diff:
            cause = ("MODEL_DIR probably holds a run of another model size — use a new "
                     "MODEL_DIR")
        else:
            cause = ("MODEL_DIR probably holds a run of another model or architecture — use a "
                     "new MODEL_DIR")
        raise CheckpointMismatchError(head + diff + "; " + cause)
    diff = first_difference(ck["fp8"], md["fp8"])
    if diff:
        raise CheckpointMismatchError(
            head + diff + "; the FP8 setting (or the FP8-using layers) differs from the run "
            f"that wrote it — keep the same precision, or start a new MODEL_DIR with "
            f"INITIAL_CHECKPOINT_PATH={where} (parameters only)")
    diff = first_difference(ck["opt_state"], md["opt_state"])
    if diff:
        raise CheckpointMismatchError(
            head + diff + "; the optimizer differs from the one that wrote it — use the same "
            f"optimizer, or start a new MODEL_DIR with INITIAL_CHECKPOINT_PATH={where} "
            "(parameters only, fresh optimizer)")
    diff = first_difference(ck["other"], md["other"])
    if diff:
        raise CheckpointMismatchError(head + diff + "; it was not written by this version of "
                                      "t5lite's trainer — use a new MODEL_DIR")


def item_metadata_tree(item_dir: epath.Path) -> Any:
    handler = ocp.PyTreeCheckpointHandler()
    try:
        return handler.metadata(item_dir).tree
    finally:
        handler.close()
