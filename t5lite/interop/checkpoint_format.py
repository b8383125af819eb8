"""The converted-checkpoint format: parameters only, as an Orbax checkpoint.

Layout (the same one a training run's MODEL_DIR has, so a converted directory can be
given as INITIAL_CHECKPOINT_PATH or CHECKPOINT_PATH, or its step directory; see
t5lite/formats/checkpoint_files.py)::

    DIR/
      model.gin                      (written by `t5lite.convert`: the architecture)
      checkpoints/
        <step>/                      one Orbax CheckpointManager step (default step 0)
          fingerprints/              item "fingerprints" (JSON): each array's, checked
                                     as it is read (t5lite/formats/fingerprints.py)
          params/                    item "params" (StandardSave): the variables tree
                                     {"params": {...}} of float32 arrays, unfused /
                                     fused and unscanned / scanned as the model.gin says

Only the "params" collection is stored: FP8 statistics and optimizer state start fresh.
Arrays are written from host (numpy) copies, so no device sharding is recorded; restore
them on any mesh by passing a `target` tree with shardings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Union

import jax
import numpy as np
import orbax.checkpoint as ocp

from t5lite.formats import checkpoint_kinds, fingerprints
from t5lite.formats.checkpoint_files import CHECKPOINTS_DIR, PARAMS_ITEM

PathLike = Union[str, Path]


def _params_only(variables: Mapping[str, Any]) -> dict:
    tree = variables["params"] if "params" in variables else variables
    return {"params": jax.tree.map(np.asarray, dict(tree))}


def save_params(directory: PathLike, variables: Mapping[str, Any], step: int = 0) -> Path:
    """Write `{"params": ...}` of `variables` (a variables dict, or a bare params tree) to
    `directory/checkpoints/<step>/params`. Returns the step directory."""
    root = Path(directory).absolute() / CHECKPOINTS_DIR
    tree = _params_only(variables)
    record = {"arrays": fingerprints.array_fingerprints(tree)}
    with ocp.CheckpointManager(root, item_names=(PARAMS_ITEM, fingerprints.ITEM),
                               options=ocp.CheckpointManagerOptions(create=True)) as mgr:
        if step in mgr.all_steps():
            raise FileExistsError(f"{root / str(step)} already exists")
        mgr.save(step, args=ocp.args.Composite(
            **{PARAMS_ITEM: ocp.args.StandardSave(tree),
               fingerprints.ITEM: ocp.args.JsonSave(record)}))
        mgr.wait_until_finished()
    return root / str(step)


def load_params(path: PathLike, target: Any = None) -> dict:
    """Restore the `{"params": ...}` tree of a converted checkpoint (or of a training
    run's `state`). `path`: a MODEL_DIR-like directory, its `checkpoints` directory, one
    step directory or the item directory (`checkpoint_files.resolve_item`). `target`:
    optional tree of arrays or jax.ShapeDtypeStruct (with shardings) to restore into;
    without it the arrays come back as saved (numpy)."""
    ckpt = checkpoint_kinds.open_checkpoint(path, what="checkpoint")
    if ckpt.kind != checkpoint_kinds.T5LITE:
        raise ValueError(f"{path} is a {ckpt.kind} checkpoint, not a t5lite one")
    return ckpt.read_stored(target)
