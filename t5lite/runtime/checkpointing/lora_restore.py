"""LoRA and checkpoints: which adapters a checkpoint holds, a LoRA run from a base
checkpoint, and the fingerprint of the frozen base a LoRA run started from.

    stored = open_checkpoint(path).adapters   # None, or (rank, targets) of its adapters
    check_adapters(stored, model, where, what)  # refused in one line when they differ
    fp = base_fingerprint(params, cfg)        # "sha256:..." over the frozen base

A checkpoint without adapters (a base model's, a converted Hugging Face / T5X one) gives
a LoRA run its base; the adapters come fresh from the init (B zero: step 0 is the base
model). One with the same adapters (rank, targets) gives them too; one with other
adapters is refused, naming both.

The fingerprint: SHA-256 over each frozen leaf's path, shape and dtype and a strided
sample of at most `SAMPLES` of its values (float32). Cheap on any size (a 7B base: a few
MB leave the devices, no full read back), and it tells apart any two bases that differ
beyond a handful of values (another checkpoint, another finetune, another size); it
would miss an edit of single values between the sampled ones, which a SHA-256 of every
byte (13 GB read back and hashed for a 7B model, at every start) would catch. A LoRA run
records it with the data position in each checkpoint (`KEY`); a resume, or loading the
adapters of such a checkpoint, whose base fingerprints otherwise is refused in one line.

LORA_ALPHA is recorded beside it (`ALPHA_KEY`): the adapters' update is scaled by
alpha / rank, so a checkpoint's adapters under another alpha would silently be another
model. A resume, a LoRA run given them, eval and infer (any load through
`finetune_restore`) are refused in one line when the model's LORA_ALPHA is not the
recorded one. (Rank and targets are in the adapters' shapes and names: `check_adapters`.)
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from t5lite.errors import CheckpointMismatchError, ConfigError
from t5lite.formats import checkpoint_kinds
from t5lite.formats.checkpoint_trees import Adapters, say_adapters
from t5lite.models import lora
from t5lite.runtime.checkpointing.start import Start

log = logging.getLogger(__name__)

KEY = "lora_base_fingerprint"  # in the checkpoint's data item (JSON), beside the position
ALPHA_KEY = "lora_alpha"  # beside it: the LORA_ALPHA the adapters were trained with
SAMPLES = 4096  # values sampled per frozen leaf


def model_lora(cfg) -> Optional[Adapters]:
    return (int(cfg.lora_rank), tuple(sorted(cfg.lora_targets))) if lora.enabled(cfg) else None


def check_adapters(stored: Optional[Adapters], cfg, where: str, what: str) -> None:
    """CheckpointMismatchError (one line, naming both) when the checkpoint's adapters are
    not the model's; a checkpoint without adapters fits any LoRA model (its base)."""
    mine = model_lora(cfg)
    if stored is None or stored == mine:
        return
    if mine is None:
        raise CheckpointMismatchError(
            f"{what} {where} holds {say_adapters(stored)}, the model has none: set LORA_RANK="
            f"{stored[0]} and LORA_TARGETS={list(stored[1])} (and the LORA_ALPHA it was "
            f"trained with) to use them, or merge them first")
    raise CheckpointMismatchError(
        f"{what} {where} holds {say_adapters(stored)}, the model has {say_adapters(mine)} "
        f"(LORA_RANK, "
        f"LORA_TARGETS): use the checkpoint's settings, or start from a checkpoint "
        f"without adapters")


def base_model(model):
    """The model with LoRA off (the base network a checkpoint without adapters holds)."""
    return type(model)(lora.base_config(model.config))


def restore_base(restore: Callable[..., Any], model, abstract_params: Mapping[str, Any],
                 fresh: Optional[Callable[[], Any]], where: str, what: str) -> Any:
    """A LoRA model's parameters from a checkpoint without adapters: the base restored
    by `restore(base_model, abstract base)`, the adapters from `fresh()` (the init's
    params, as `abstract_params` is shaped)."""
    if fresh is None:
        raise ConfigError(f"{what} {where} holds no LoRA adapters (a base model), and "
                          f"LORA_RANK={model.config.lora_rank} asks for them: point {what} "
                          f"at the LoRA run's checkpoint, or set LORA_RANK=0")
    bare = "params" not in abstract_params
    tree = abstract_params if bare else abstract_params["params"]
    _, frozen = lora.split_trainable(tree, model.config)
    base = restore(base_model(model), frozen if bare else {**abstract_params, "params": frozen})
    init = fresh()
    adapters, _ = lora.split_trainable(init if bare else init["params"], model.config)
    joined = lora.join_trainable(adapters, base if bare else base["params"])
    return joined if bare else {**base, "params": joined}


# ----------------------------------------------------------------------------- fingerprint


def _sample(x):
    flat = jnp.ravel(x)
    stride = max(1, flat.size // SAMPLES)
    return flat[::stride][:SAMPLES].astype(jnp.float32)


def base_fingerprint(params: Mapping[str, Any], cfg) -> str:
    """"sha256:<hex>" over the frozen base of `params` (the bare params tree): each
    leaf's path, shape, dtype and a strided sample of its values (module docstring)."""
    _, frozen = lora.split_trainable(params, cfg)
    leaves = jax.tree_util.tree_flatten_with_path(frozen)[0]
    mesh = getattr(getattr(leaves[0][1], "sharding", None), "mesh", None) if leaves else None
    replicated = {}  # on a mesh: the samples replicated, so every process reads them
    if isinstance(mesh, jax.sharding.Mesh):
        replicated["out_shardings"] = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    samples = jax.device_get(jax.jit(lambda t: [_sample(x) for x in t], **replicated)(
        [x for _, x in leaves]))
    digest = hashlib.sha256()
    for (path, x), sample in zip(leaves, samples):
        digest.update(f"{jax.tree_util.keystr(path)}{tuple(x.shape)}{x.dtype};".encode())
        digest.update(np.asarray(sample, np.float32).tobytes())
    return "sha256:" + digest.hexdigest()


def check_alpha(recorded_alpha: Optional[Any], cfg, where: str) -> None:
    """CheckpointMismatchError when the adapters at `where` were trained with another
    LORA_ALPHA than the model's (None: nothing recorded)."""
    if recorded_alpha is None or not lora.enabled(cfg):
        return
    if float(recorded_alpha) != float(cfg.lora_alpha):
        raise CheckpointMismatchError(
            f"{where} holds LoRA adapters trained with LORA_ALPHA={float(recorded_alpha):g}, "
            f"the model has LORA_ALPHA={float(cfg.lora_alpha):g}: their update is scaled by "
            f"alpha / rank, so another alpha is another model — set "
            f"LORA_ALPHA={float(recorded_alpha):g}")


def check_base(recorded: Optional[str], now: str, where: str) -> None:
    """CheckpointMismatchError naming both when `recorded` (None: nothing recorded) is
    not `now`."""
    if recorded is not None and recorded != now:
        raise CheckpointMismatchError(
            f"{where} holds LoRA adapters trained on the base {recorded[:19]}, but the base "
            f"parameters now are {now[:19]} (fingerprints): the adapters belong to another "
            f"base model — use the base they were trained on, or a new MODEL_DIR")


def start_fingerprint(model, params: Mapping[str, Any], data_state: Optional[Mapping[str, Any]],
                      start: Start
                      ) -> Tuple[Optional[Dict[str, Any]], Optional[Mapping[str, Any]]]:
    """(what the run records beside its data position, None without LoRA: the base
    fingerprint and LORA_ALPHA; `data_state` without them) as a run starts from `start`
    (`checkpoints.restore_or_init`'s): a resumed LoRA run's base must fingerprint, and its
    LORA_ALPHA be, as its checkpoint records; so must the base under the adapters of a
    LoRA run's checkpoint given as INITIAL_CHECKPOINT_PATH, whose alpha
    `finetune_restore` checked as it loaded them (CheckpointMismatchError)."""
    data = ({k: v for k, v in data_state.items() if k not in (KEY, ALPHA_KEY)}
            if data_state else data_state)
    cfg = getattr(model, "config", None)
    if cfg is None or not lora.enabled(cfg):
        return None, data
    now = base_fingerprint(params["params"], cfg)
    if start.kind == "resume":
        where = start.in_words()
        check_base((data_state or {}).get(KEY), now, where)
        check_alpha((data_state or {}).get(ALPHA_KEY), cfg, where)
    elif start.kind in ("initial", "t5x_continue"):
        ckpt = checkpoint_kinds.open_checkpoint(start.path)
        check_base(ckpt.recorded(KEY), now,  # (its alpha: checked as its adapters loaded)
                   f"INITIAL_CHECKPOINT_PATH {ckpt.where}")
    return {KEY: now, ALPHA_KEY: float(cfg.lora_alpha)}, data


def recording(get_state: Callable[[], Mapping[str, Any]], record: Optional[Mapping[str, Any]]):
    """`get_state` (the data position saved with each checkpoint), with a LoRA run's
    record (`start_fingerprint`) beside it when there is one."""
    if record is None:
        return get_state
    return lambda: {**get_state(), **record}


def adopt_adapters(model, ckpt, what: str = "CHECKPOINT_PATH"):
    """`model` with the LoRA adapters the checkpoint `ckpt` (a `checkpoint_kinds` reader)
    holds (rank and targets from its tree, LORA_ALPHA as its run recorded it) when the
    config names none (LORA_RANK=0), so a LoRA run's checkpoint evaluates, serves and
    exports (`eval`, `infer`, `convert --to=hf`) without its flags repeated. Adapters the
    config names are checked against the checkpoint's as given (one line when they
    differ); a checkpoint that records no LORA_ALPHA leaves the model as it is (the
    restore then names the flags to set)."""
    from t5lite.models.model import model_for_config
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "lora_rank") or lora.enabled(cfg) or ckpt.adapters is None:
        return model
    alpha = ckpt.recorded(ALPHA_KEY)
    if alpha is None:
        return model
    rank, targets = ckpt.adapters
    log.info("%s %s holds LoRA rank %d adapters on %s (LORA_ALPHA %g as its run recorded): "
             "the model takes them", what, ckpt.where, rank, ", ".join(targets), alpha)
    return model_for_config(dataclasses.replace(cfg, lora_rank=rank, lora_targets=targets,
                                                lora_alpha=float(alpha)))
