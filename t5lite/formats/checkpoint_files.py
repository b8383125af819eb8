"""Checkpoints on disk: the directory layout, which steps are complete, and what a
checkpoint path given by the user (INITIAL_CHECKPOINT_PATH, CHECKPOINT_PATH) points at.

    MODEL_DIR/checkpoints/
      <step>/                    one Orbax CheckpointManager step, complete once committed
        _CHECKPOINT_METADATA     (commit_timestamp_nsecs set at commit)
        commit_success.txt       the commit marker
        state/                   item "state": a training run's TrainState.as_dict()
        data/                    item "data": the data iterator position (JSON)
        data_iterator/           item "data_iterator": each data shard's tf.data iterator
                                 state, shard_<s>-of-<n>.process_<i> (older:
                                 process_<i>-of-<n>; runtime/checkpointing/data_iterator_item.py)
        params/                  item "params": a converted checkpoint ({"params": ...})
      <step>.orbax-checkpoint-tmp-<t>/   a save in flight (or a crash's leftover)
      <step>.incomplete-<ns>/            a step that was never committed, set aside

Pure file-system facts: no arrays are read here. Nothing imports TensorFlow.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Dict, List, Tuple, Union

import jax
from etils import epath

log = logging.getLogger(__name__)

PathLike = Union[str, "epath.PathLike"]
CHECKPOINTS_DIR = "checkpoints"
STATE_ITEM = "state"
DATA_ITEM = "data"
PARAMS_ITEM = "params"  # converted checkpoints (t5lite.interop.checkpoint_format)
_COMMIT_FILE = "commit_success.txt"
_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"
_ITEM_METADATA_FILE = "_METADATA"
_INCOMPLETE_MARK = ".incomplete-"
_DAMAGED_MARK = ".damaged-"


def absolute(path: PathLike) -> epath.Path:
    path = epath.Path(path)
    return path if "://" in str(path) else path.absolute()


def is_committed(step_dir: epath.Path) -> bool:
    """Orbax's commit: the marker file (written last, before the atomic rename), or for
    older Orbax versions a commit timestamp in the step metadata."""
    if (step_dir / _COMMIT_FILE).exists():
        return True
    meta = step_dir / _STEP_METADATA_FILE
    if not meta.exists():
        return False
    try:
        return json.loads(meta.read_text()).get("commit_timestamp_nsecs") is not None
    except (ValueError, OSError):
        return False


def step_dirs(checkpoints: epath.Path) -> Dict[int, epath.Path]:
    """Directories named by a bare step number (committed or not); tmp dirs excluded."""
    if not checkpoints.is_dir():
        return {}
    return {int(p.name): p for p in checkpoints.iterdir() if p.name.isdigit() and p.is_dir()}


def complete_steps(checkpoints: PathLike, items: Tuple[str, ...] = (STATE_ITEM,)) -> List[int]:
    """Sorted steps under a `checkpoints` directory that are committed and hold one of
    `items`. In-flight saves (tmp dirs), crashed saves (leftover tmp dirs, or a step dir
    without its commit marker) and steps of another kind are left out."""
    out = []
    for step, d in step_dirs(epath.Path(checkpoints)).items():
        if is_committed(d) and any((d / item).is_dir() for item in items):
            out.append(step)
    return sorted(out)


def sync_processes(name: str) -> None:
    """A barrier across processes (a no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def set_aside_uncommitted(checkpoints: epath.Path) -> None:
    """Step dirs without a commit marker, renamed out of Orbax's sight (it would count
    them as checkpoints and refuse to save that step again), never deleted:

    - newer than every committed step: a save that a crash cut short, renamed to
      `<step>.incomplete-<ns>`;
    - older than a committed step: a checkpoint whose deletion by retention (keep the
      newest KEEP_CHECKPOINTS) a crash cut short: its commit marker is already gone,
      so it is not restorable; retention's deletion is finished.
    """
    if jax.process_index() == 0:
        committed = [s for s, d in step_dirs(checkpoints).items() if is_committed(d)]
        newest = max(committed, default=None)
        for step, d in sorted(step_dirs(checkpoints).items()):
            if is_committed(d):
                continue
            if newest is not None and step < newest:
                log.info("checkpoint %s was being deleted by retention when the run "
                         "stopped (step %d is newer); finishing that", d, newest)
                d.rmtree()
                continue
            dest = checkpoints / f"{step}{_INCOMPLETE_MARK}{time.time_ns()}"
            log.warning("checkpoint %s was never committed (a crash mid-save?); moved to %s",
                        d, dest.name)
            d.rename(dest)
    sync_processes("t5lite_checkpoints_set_aside")


def set_aside_damaged(checkpoints: epath.Path, step: int) -> str:
    """Rename step `step` to `<step>.damaged-<ns>` (process 0; never deleted) so that
    Orbax and retention no longer see it. Returns the new name."""
    dest = checkpoints / f"{step}{_DAMAGED_MARK}{time.time_ns()}"
    if jax.process_index() == 0:
        (checkpoints / str(step)).rename(dest)
    sync_processes("t5lite_checkpoints_set_aside_damaged")
    return dest.name


def missing_checkpoint(path: PathLike, what: str) -> str:
    """The message for a checkpoint path that does not exist: when its parent holds
    checkpoints (a step that was never saved or was deleted), the steps that do exist."""
    parent = absolute(path).parent
    steps = complete_steps(parent, (PARAMS_ITEM, STATE_ITEM)) if parent.is_dir() else []
    if steps:
        return (f"{what} {path} does not exist: {parent} holds the checkpoints of steps "
                f"{', '.join(map(str, steps))}")
    return f"{what} {path} does not exist: no such checkpoint directory"


def resolve_item(path: PathLike, what: str = "INITIAL_CHECKPOINT_PATH"
                 ) -> Tuple[epath.Path, str]:
    """(item directory, item name) for a checkpoint path given by the user: a MODEL_DIR
    (latest complete step under path/checkpoints), a `checkpoints` directory, one step
    directory, or an item directory. The item is `params` (converted) or `state` (a
    training run). `what` names the setting in the FileNotFoundError messages."""
    p = absolute(path)
    if not p.exists():
        raise FileNotFoundError(missing_checkpoint(path, what))
    if not p.is_dir():
        raise FileNotFoundError(f"{what} {path} is not a directory")
    if p.name in (PARAMS_ITEM, STATE_ITEM) and (p / _ITEM_METADATA_FILE).exists():
        return p, p.name
    for item in (PARAMS_ITEM, STATE_ITEM):
        if (p / item).is_dir():
            if not is_committed(p):
                raise FileNotFoundError(
                    f"{what} {path} is an incomplete checkpoint (no commit marker: the save "
                    f"that wrote it did not finish)")
            return p / item, item
    for checkpoints in (p / CHECKPOINTS_DIR, p):
        steps = complete_steps(checkpoints, (PARAMS_ITEM, STATE_ITEM))
        if steps:
            d = checkpoints / str(steps[-1])
            item = PARAMS_ITEM if (d / PARAMS_ITEM).is_dir() else STATE_ITEM
            return d / item, item
    raise FileNotFoundError(
        f"{what} {path} holds no complete checkpoint (no checkpoint found: expected "
        f"{CHECKPOINTS_DIR}/<step>/{{{PARAMS_ITEM},{STATE_ITEM}}}, <step>/{{...}} or the "
        f"step directory itself)")


def checkpoint_step(path: PathLike, what: str = "CHECKPOINT_PATH") -> int:
    """The step number of the checkpoint that `path` resolves to (0 if it has none)."""
    try:
        item_dir, _ = resolve_item(path, what)
    except FileNotFoundError:
        return 0
    name = item_dir.parent.name
    return int(name) if name.isdigit() else 0
