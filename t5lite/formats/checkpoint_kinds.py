"""What a checkpoint path holds, decided once, and a reader for each kind that gives the
same tree: the parameters of a model, in the model's layout, placed on its devices.

    ckpt = open_checkpoint("/runs/mnli", "CHECKPOINT_PATH")    # the one place that looks
    ckpt.kind                   # T5LITE, T5X or HUGGING_FACE
    params = ckpt.read_params(model, {"params": abstract})    # {"params": ...}, placed

Every path a user gives (INITIAL_CHECKPOINT_PATH, CHECKPOINT_PATH, `convert --input`)
goes through `open_checkpoint` once; what a restore does next depends on data the
reader states (`layout`, `adapters`, `recorded`), never on asking the files again. A new
layout is a new reader here, not another branch in the restores above.

The kinds:

- T5LITE (`T5liteCheckpoint`): a MODEL_DIR, its `checkpoints` directory, a step
  directory or an item directory (`state` of a training run, `params` of a converted
  one: `checkpoint_files.resolve_item`). Nothing but its Orbax metadata is read on
  opening. Its tree may be in any layout (converted on the host to the model's) and may
  hold LoRA adapters (`adapters`: data, not another kind; `runtime/checkpointing/
  lora_restore.py` decides what a LoRA model takes from it). A step that no save
  committed (Orbax's tmp name, one set aside `.incomplete-` / `.damaged-`, a step
  directory without its commit marker) is refused in one line: its arrays may be half
  written.
- T5X (`T5xCheckpoint`): T5X's own msgpack + zarr layout or its Orbax one
  (`t5x_checkpoint`), dense T5 (`examples/t5`) and `contrib/moe`'s Switch Transformers
  alike: their names differ only in a sparse layer's router and experts, which
  `t5x_params.t5lite_name` maps. Read whole on first use and kept (a T5X run continued
  at its step takes its parameters and its Adafactor state from one read).
- HUGGING_FACE (`HuggingFaceDirectory`): `config.json` beside safetensors weights. Read
  by `python -m t5lite.convert --from=hf` (its architecture comes from config.json, not
  from a gin file); as a checkpoint path it is refused in one line naming that command.

A path that is none of these is FileNotFoundError in one line (what exists instead).
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Dict, Mapping, Optional


from t5lite.errors import CheckpointDamagedError, CheckpointMismatchError, ConfigError
from t5lite.formats import checkpoint_files, t5x_checkpoint, t5x_params
from t5lite.formats.checkpoint_files import PARAMS_ITEM, STATE_ITEM, PathLike
from t5lite.formats.checkpoint_trees import (first_difference, flat_shapes, layout_str,
                                             stored_adapters)
from t5lite.formats.placement import (CANONICAL, convert_and_place, layout_config,
                                      model_layout)
from t5lite.formats.t5lite_step import T5liteStep
from t5lite.models import layouts

log = logging.getLogger(__name__)

T5LITE, T5X, HUGGING_FACE = "t5lite", "t5x", "hugging_face"

# Step directories that are not (or no longer) checkpoints (checkpoint_files).
_NOT_COMMITTED = {".orbax-checkpoint-tmp": "a save that never finished (Orbax's tmp name)",
                  ".incomplete-": "a save that never finished, set aside",
                  ".damaged-": "a checkpoint set aside as damaged"}


def open_checkpoint(path: PathLike, what: str = "INITIAL_CHECKPOINT_PATH",
                    expect: Optional[str] = None):
    """The reader for what `path` holds (module docstring); `what` names the setting in
    every message. FileNotFoundError (one line) when it holds no checkpoint, or one that
    no save committed. `expect=T5X` (`convert --from=t5x`): anything else is refused with
    the reason it is not a T5X checkpoint (ConfigError / CheckpointDamagedError)."""
    remote = "://" in str(path)
    if not remote and t5x_checkpoint.is_t5x_checkpoint(path):
        return T5xCheckpoint(path, what)
    if expect == T5X:
        t5x_checkpoint.read_checkpoint(path, arrays=False)  # raises the line that says why not
        raise ConfigError(f"{what} {path} is not a T5X checkpoint directory")
    if not remote and _is_hugging_face(Path(path)):
        return HuggingFaceDirectory(path, what)
    item_dir, item = checkpoint_files.resolve_item(path, what)
    if not remote:
        _check_committed(path, item_dir, what)
    return T5liteCheckpoint(path, what, item_dir, item)


def _is_hugging_face(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and not any(
        (path / d).is_dir() for d in (checkpoint_files.CHECKPOINTS_DIR, PARAMS_ITEM, STATE_ITEM))


def _check_committed(path, item_dir, what: str) -> None:
    step_dir = item_dir.parent
    mark = next((m for m in _NOT_COMMITTED if m in step_dir.name), None)
    uncommitted = ((step_dir / "_CHECKPOINT_METADATA").exists()  # an Orbax step directory
                   and not checkpoint_files.is_committed(step_dir))
    if mark is None and not uncommitted:
        return
    why = (f"its directory {step_dir.name} is {_NOT_COMMITTED[mark]}"
           if mark else f"{step_dir} has no commit marker: the save that wrote it did not "
                        f"finish")
    steps = checkpoint_files.complete_steps(step_dir.parent, (PARAMS_ITEM, STATE_ITEM))
    where = (f"{step_dir.parent} holds the complete checkpoints of steps "
             f"{', '.join(map(str, steps))}: point {what} at one of them, or at the "
             f"MODEL_DIR for the latest" if steps else
             f"{step_dir.parent} holds no complete checkpoint to use instead")
    raise FileNotFoundError(f"{what} {path} is an incomplete checkpoint ({why}); {where}")


class T5liteCheckpoint:
    """A t5lite checkpoint: a training run's `state` item or a converted `params` item,
    read through its step (`t5lite_step.T5liteStep`, the one reader of a step)."""

    kind = T5LITE

    def __init__(self, path: PathLike, what: str, item_dir, item: str):
        self.path, self.what, self.item_dir, self.item = path, what, item_dir, item
        self.where = str(item_dir.parent if item_dir.name in (PARAMS_ITEM, STATE_ITEM)
                         else item_dir)
        self._step = T5liteStep(item_dir)
        stored = self._step.params_metadata
        if not isinstance(stored, Mapping) or "params" not in stored:
            raise FileNotFoundError(f"{what} {path}: {item_dir} holds no 'params' collection")
        self.stored = stored  # {"params": metadata}: shapes and dtypes, nothing read
        self.layout = layouts.detect_layout(stored)
        self.adapters = stored_adapters(stored["params"])
        damaged = self._step.damage_before_reading(params_only=True)
        if damaged:  # checked before the tree is compared with the model's
            self._refuse(damaged)

    def verified(self, tree: Mapping[str, Any]) -> Mapping[str, Any]:
        """`tree` (the {"params": ...} read) when its arrays are the ones saved (their
        fingerprints); else CheckpointDamagedError, one line naming the first that is
        not. A checkpoint saved before t5lite recorded fingerprints is not checked."""
        damaged = self._step.damage_in(tree, params_only=True)
        if damaged is not None:
            self._refuse(damaged)
        return tree

    def _refuse(self, damaged: str) -> None:
        raise CheckpointDamagedError(
            f"{self.what} {self.where} is damaged: {damaged} (its bytes changed on disk "
            f"since it was saved); python -m t5lite.info --verify "
            f"{Path(self.where).parent.parent} checks every checkpoint of the run")

    @property
    def step(self) -> int:
        """The step of the checkpoint (0 when its directory names none)."""
        return self._step.step

    def recorded(self, key: str) -> Optional[Any]:
        """What a training checkpoint's data position records under `key` (None: not a
        training checkpoint, or nothing recorded)."""
        try:
            position = self._step.data_position()
        except (ValueError, OSError):
            return None
        return None if position is None else position.get(key)

    def read_stored(self, target: Any = None) -> Dict[str, Any]:
        """The stored `{"params": ...}` tree: numpy arrays as saved (`target` None), or
        restored into `target` (arrays or jax.ShapeDtypeStruct with shardings, the stored
        layout)."""
        return self._step.read(target, params_only=True)

    def read_params(self, model, abstract_params: Mapping[str, Any]) -> Dict[str, Any]:
        """The parameters as `model` has them, placed as `abstract_params` ({"params": ...}
        or a bare params tree; the result is alike) describes. In the model's layout they
        restore straight onto the devices; in another one they are read to the host and
        converted there. CheckpointMismatchError (one line) for another architecture or
        size."""
        bare = "params" not in abstract_params
        target = {"params": abstract_params if bare else abstract_params["params"]}
        dst_layout = (model_layout(model) if model is not None and hasattr(model, "config")
                      else layouts.detect_layout(target))
        head = f"checkpoint {self.where} does not match the model: "
        cause = (f"{self.what} probably holds another model size or architecture — point it "
                 "at a checkpoint of this model (or fix the model config)")
        mine, theirs = sorted(target["params"]), sorted(self.stored["params"])
        if mine != theirs:  # another architecture altogether: say so, not a leaf's shape
            raise CheckpointMismatchError(
                f"checkpoint {self.where} holds another architecture than MODEL: its "
                f"top-level modules are {', '.join(theirs)}, the model's {', '.join(mine)} — "
                f"{self.what} must be a checkpoint of the same family (T5 for a T5 model, "
                f"GPT / LLaMA for a decoder-only one), converted with python -m "
                f"t5lite.convert if it comes from Hugging Face")
        if self.layout == dst_layout:
            diff = first_difference(flat_shapes(self.stored), flat_shapes(target))
            if diff:
                raise CheckpointMismatchError(head + diff + "; " + cause)
            restored = self.verified(self.read_stored(target))
            return restored["params"] if bare else restored
        log.info("converting %s from %s to %s", self.where, layout_str(self.layout),
                 layout_str(dst_layout))
        return convert_and_place(
            self.verified(self.read_stored())["params"], model, self.layout, dst_layout,
            abstract_params,
            lambda diff: head + diff + f" (after converting from {layout_str(self.layout)} to "
                                       f"{layout_str(dst_layout)}); " + cause)


class _Foreign:
    """A checkpoint another program wrote: the canonical layout, no LoRA adapters, no
    data item recording anything."""

    adapters = None
    layout = CANONICAL

    def __init__(self, path: PathLike, what: str):
        self.path, self.what, self.where = path, what, str(path)

    def recorded(self, key: str) -> None:
        return None


class T5xCheckpoint(_Foreign):
    """A T5X checkpoint (dense or `contrib/moe`), read whole on first use."""

    kind = T5X

    @functools.cached_property
    def tree(self) -> Dict[str, Any]:
        """T5X's state dict, numpy leaves: {"target": params, "state": {"step", ...}}."""
        return t5x_checkpoint.read_checkpoint(self.path)

    @property
    def step(self) -> int:
        if "tree" in self.__dict__:
            return int(self.tree["state"]["step"])
        return t5x_checkpoint.read_step(self.path)

    def read_params(self, model, abstract_params: Mapping[str, Any]) -> Dict[str, Any]:
        """T5X's tree mapped onto the model's (`t5x_params`), converted to the model's
        layout, cast and placed as `abstract_params` describes."""
        if model is None or getattr(model, "FEATURE_CONVERTER_KIND", None) != "encoder_decoder":
            raise CheckpointMismatchError(f"{self.what} {self.path} is a T5X checkpoint; t5lite "
                                          f"reads T5X's T5 networks (examples/t5, contrib/moe) "
                                          f"into a T5 model only")
        plain = type(model)(layout_config(model, CANONICAL))
        params = t5x_params.params_from_t5x(self.tree["target"], plain,
                                            origin=f"{self.what} {self.path}")
        log.info("restoring parameters from T5X checkpoint %s", self.path)
        return convert_and_place(
            params, model, CANONICAL, model_layout(model), abstract_params,
            lambda diff: f"T5X checkpoint {self.path} does not match the model: {diff}")


class HuggingFaceDirectory(_Foreign):
    """A Hugging Face model directory: read by `t5lite.convert --from=hf` only."""

    kind = HUGGING_FACE
    step = 0

    def read_params(self, model, abstract_params: Mapping[str, Any]) -> Dict[str, Any]:
        raise ConfigError(
            f"{self.what} {self.path} is a Hugging Face model directory (config.json): convert "
            f"it once with python -m t5lite.convert --from=hf --input={self.path} "
            f"--output=DIR, then use --gin_file=DIR/model.gin and {self.what}=DIR")
