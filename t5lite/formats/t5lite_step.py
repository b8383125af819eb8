"""One committed step of a t5lite checkpoint, read in one place: its fingerprint record,
its Orbax metadata, its arrays and its data position. Resume (`Checkpointer.restore`),
`info --verify`, and every reader of a checkpoint path (`checkpoint_kinds.
T5liteCheckpoint`: finetuning, eval, infer, export) read a step through this class and no
other way (tests/test_architecture.py holds it).

    MODEL_DIR/checkpoints/<step>/
        state/ or params/       the item: a training run's TrainState.as_dict(), or a
                                converted checkpoint's {"params": ...}
        fingerprints/metadata   the record (JSON): each array's fingerprint, the data
                                position's; absent before t5lite recorded them
        data/metadata           the data position (JSON; training steps only)
        data_iterator/          the data shards' iterator states: their own item, with
                                their own SHA-256s (runtime/checkpointing/data_iterator_item.py)

    step = T5liteStep(item_dir)            # reads the record and the metadata, no array
    step.damage_before_reading(params_only=True)    # None, or what the record disagrees with
    tree = step.read(target, params_only=True)      # {"params": ...}, placed as target says
    step.damage_in(tree, params_only=True)          # None, or the first array not as saved

`params_only` reads the `params` collection of either item: the whole of a converted one,
the "params" part of a training state (Orbax's partial restore: the optimizer's moments
are not read). A damage is a short string (what differs); the caller words the error,
since resume, verify and a checkpoint path each say it to someone else.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from t5lite.formats import fingerprints
from t5lite.formats.checkpoint_files import DATA_ITEM, PARAMS_ITEM, STATE_ITEM
from t5lite.formats.checkpoint_trees import item_metadata_tree

class T5liteStep:
    """A step's item directory (`state` or `params`) and what was saved beside it."""

    def __init__(self, item_dir: epath.Path):
        self.item_dir = epath.Path(item_dir)
        self.item = self.item_dir.name  # STATE_ITEM or PARAMS_ITEM (checkpoint_files)
        self.step_dir = self.item_dir.parent
        self.record = fingerprints.read_record(self.step_dir)  # None: saved without one
        self._metadata = None

    @classmethod
    def at(cls, step_dir: epath.Path) -> "T5liteStep":
        """The step in `step_dir`: its `state` item, else its `params` one."""
        step_dir = epath.Path(step_dir)
        return cls(step_dir / (STATE_ITEM if (step_dir / STATE_ITEM).is_dir() else PARAMS_ITEM))

    @property
    def step(self) -> int:
        """The step its directory names (0 when it names none: a converted directory)."""
        name = self.step_dir.name
        return int(name) if name.isdigit() else 0

    @property
    def metadata(self) -> Any:
        """The item's Orbax metadata tree (shapes and dtypes; no array is read)."""
        if self._metadata is None:
            self._metadata = item_metadata_tree(self.item_dir)
        return self._metadata

    def _part(self, params_only: bool):
        """(its metadata, where it sits in the record) of the whole item or of its params."""
        if not params_only or self.item != STATE_ITEM:
            return self.metadata, ""
        return self.metadata.get("params", {}), "params/"

    @property
    def params_metadata(self) -> Any:
        """{"params": metadata} of either item (the "params" of a training state)."""
        return self._part(True)[0]

    def damage_before_reading(self, params_only: bool = False) -> Optional[str]:
        """What is wrong before an array is read (None: nothing, or no record): the record
        unreadable, or the metadata describing other arrays than the record says were
        saved."""
        metadata, prefix = self._part(params_only)
        return fingerprints.metadata_damage(self.record, metadata, prefix)

    def read(self, target: Any = None, params_only: bool = False) -> Dict[str, Any]:
        """The item (or its `{"params": ...}`): numpy arrays as saved (`target` None), or
        restored into `target` (arrays or jax.ShapeDtypeStruct with shardings, the stored
        layout; any mesh, any process count)."""
        metadata, _ = self._part(params_only)
        if target is None:
            target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)
            restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                        target)
        else:
            restore_args = ocp.checkpoint_utils.construct_restore_args(target)
        partial = params_only and self.item == STATE_ITEM
        wrap = (lambda t: {"params": t}) if partial else (lambda t: t)
        with ocp.PyTreeCheckpointer() as ckpt:
            out = ckpt.restore(self.item_dir, args=ocp.args.PyTreeRestore(
                item=wrap(target), restore_args=wrap(restore_args), partial_restore=partial))
        return out["params"] if partial else out

    def data_position(self) -> Optional[Dict[str, Any]]:
        """The data position saved with a training step (None: none saved); ValueError
        (its message names the file) when that file holds no JSON object."""
        f = self.step_dir / DATA_ITEM / "metadata"  # the file Orbax's JsonSave writes
        if self.item != STATE_ITEM or not f.exists():
            return None
        try:
            value = json.loads(f.read_text())
        except (ValueError, UnicodeDecodeError):
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"{DATA_ITEM}/metadata is not JSON")
        return value

    def damage_in(self, tree: Mapping[str, Any], params_only: bool = False,
                  **position: Any) -> Optional[str]:
        """The first array of `tree` (what `read` returned) whose fingerprint is not the
        recorded one, or the data position's (`data=`, when given); None when all match
        or there is no record."""
        _, prefix = self._part(params_only)
        return fingerprints.content_damage(self.record, tree, prefix, **position)
