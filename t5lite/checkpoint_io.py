"""The converted-checkpoint format: parameters only, as an Orbax checkpoint.

Layout (the same one a training run's MODEL_DIR has, so a converted directory can be
given as INITIAL_CHECKPOINT_PATH, or its step directory)::

    DIR/
      model.gin                      (written by `t5lite.convert`: the architecture)
      checkpoints/
        <step>/                      one Orbax CheckpointManager step (default step 0)
          params/                    item "params" (StandardSave): the variables tree
                                     {"params": {...}} of float32 arrays, unfused /
                                     fused and unscanned / scanned as the model.gin says

Only the "params" collection is stored: FP8 statistics and optimizer state start fresh.
Arrays are written from host (numpy) copies, so no device sharding is recorded; restore
them on any mesh by passing a `target` tree with shardings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np
import orbax.checkpoint as ocp

PathLike = Union[str, Path]
CHECKPOINTS_DIR = "checkpoints"
ITEM = "params"


def _params_only(variables: Mapping[str, Any]) -> dict:
    tree = variables["params"] if "params" in variables else variables
    import jax

    return {"params": jax.tree.map(np.asarray, dict(tree))}


def save_params(directory: PathLike, variables: Mapping[str, Any], step: int = 0) -> Path:
    """Write `{"params": ...}` of `variables` (a variables dict, or a bare params tree) to
    `directory/checkpoints/<step>/params`. Returns the step directory."""
    root = Path(directory).absolute() / CHECKPOINTS_DIR
    with ocp.CheckpointManager(root, item_names=(ITEM,),
                               options=ocp.CheckpointManagerOptions(create=True)) as mgr:
        if step in mgr.all_steps():
            raise FileExistsError(f"{root / str(step)} already exists")
        mgr.save(step, args=ocp.args.Composite(
            **{ITEM: ocp.args.StandardSave(_params_only(variables))}))
        mgr.wait_until_finished()
    return root / str(step)


def _latest_step(checkpoints: Path) -> Optional[int]:
    with ocp.CheckpointManager(checkpoints.absolute(), item_names=(ITEM,)) as mgr:
        return mgr.latest_step()


def resolve(path: PathLike) -> Path:
    """The `params` item directory for `path`: a MODEL_DIR-like directory (latest step
    under `path/checkpoints`), the `checkpoints` directory itself, one step directory, or
    the item directory."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint directory")
    if (path / ITEM).is_dir():
        return path / ITEM
    for checkpoints in (path / CHECKPOINTS_DIR, path):
        if checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()):
            step = _latest_step(checkpoints)
            if step is not None and (checkpoints / str(step) / ITEM).is_dir():
                return checkpoints / str(step) / ITEM
    if (path / "_METADATA").is_file() or (path / "_CHECKPOINT_METADATA").is_file():
        return path
    raise FileNotFoundError(
        f"{path}: no checkpoint found (expected {CHECKPOINTS_DIR}/<step>/{ITEM}, <step>/{ITEM} "
        f"or {ITEM}/ under it)")


def load_params(path: PathLike, target: Any = None) -> dict:
    """Restore the `{"params": ...}` tree saved by `save_params` (or by a training run).

    `path`: see `resolve`. `target`: optional tree of arrays or jax.ShapeDtypeStruct (with
    shardings) to restore into; without it the arrays come back as saved (numpy)."""
    item = resolve(path)
    with ocp.StandardCheckpointer() as ckpt:
        return ckpt.restore(item.absolute(), target)
