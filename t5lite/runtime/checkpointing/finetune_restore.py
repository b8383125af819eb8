"""The finetuning restore: the parameters of a checkpoint (INITIAL_CHECKPOINT_PATH, a
converted checkpoint, or CHECKPOINT_PATH for eval / infer / export) as the model wants
them. What the path holds is decided once (`formats/checkpoint_kinds.open_checkpoint`:
t5lite, T5X dense or MoE, Hugging Face), and its reader gives the parameters in the
model's layout, or refuses another architecture or size in one line
(CheckpointMismatchError). Here: what a LoRA model takes from it (`lora_restore`: a
checkpoint without adapters gives the base and the init the adapters; other adapters
are refused), and a T5X run continued at its step (INITIAL_CHECKPOINT_STATE=
'train_state'), which also takes its Adafactor state (`continue_t5x_run`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

import jax
import numpy as np

from t5lite.errors import ConfigError
from t5lite.formats import checkpoint_kinds, t5x_optimizer_state
from t5lite.formats.checkpoint_files import PathLike
from t5lite.formats.placement import place
from t5lite.models import lora
from t5lite.optim import skipping
from t5lite.runtime.checkpointing import lora_restore


def opened(path, what: str):
    """`path` as a reader (`checkpoint_kinds`); a reader given is passed through."""
    if hasattr(path, "read_params"):
        return path
    return checkpoint_kinds.open_checkpoint(path, what)


def restore_params_for_finetuning(path: PathLike, model: Any, abstract_params: Mapping[str, Any],
                                  what: str = "INITIAL_CHECKPOINT_PATH",
                                  fresh: Optional[Callable[[], Any]] = None) -> Dict[str, Any]:
    """The parameters of the checkpoint at `path` (a path the setting `what` names, or a
    reader `checkpoint_kinds.open_checkpoint` gave), as `abstract_params` (`{"params":
    ...}` of jax.ShapeDtypeStruct with shardings, or a bare params tree) describes them.
    With LoRA (`lora_restore`): a checkpoint without adapters gives the base, `fresh()`
    (the init's parameters) the adapters; one with other adapters than the model's, or
    trained with another LORA_ALPHA, is refused."""
    ckpt = opened(path, what)
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "lora_rank"):
        lora_restore.check_adapters(ckpt.adapters, cfg, ckpt.where, what)
        if ckpt.adapters is not None:  # the adapters load: under the alpha they were trained with
            lora_restore.check_alpha(ckpt.recorded(lora_restore.ALPHA_KEY), cfg,
                                     f"{what} {ckpt.where}")
        elif lora.enabled(cfg):
            return lora_restore.restore_base(ckpt.read_params, model, abstract_params, fresh,
                                             ckpt.where, what)
    return ckpt.read_params(model, abstract_params)


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
    ckpt = opened(path, "INITIAL_CHECKPOINT_PATH")
    if ckpt.kind != checkpoint_kinds.T5X:
        raise ConfigError(f"INITIAL_CHECKPOINT_STATE='train_state' continues a T5X run, and "
                          f"INITIAL_CHECKPOINT_PATH {path} is no T5X checkpoint (a t5lite run "
                          f"continues from its own MODEL_DIR); or set "
                          f"INITIAL_CHECKPOINT_STATE='params'")
    origin = f"INITIAL_CHECKPOINT_PATH {path}"
    abstract_opt = abstract_state.opt_state
    skips = isinstance(abstract_opt, skipping.SkipState)  # SKIP_BAD_STEPS: counters fresh
    opt_state = t5x_optimizer_state.opt_state_from_t5x(
        ckpt.tree["state"], model, abstract_opt.inner if skips else abstract_opt, factoring,
        origin)
    if skips:
        opt_state = skipping.fresh(opt_state)
    params = ckpt.read_params(model, abstract_state.params)
    opt_state = jax.tree.map(place, opt_state, abstract_state.opt_state)
    step = place(np.asarray(ckpt.step, np.int32), abstract_state.step)
    return init_fn().replace(step=step, params=params, opt_state=opt_state)
