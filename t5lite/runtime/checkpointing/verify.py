"""`python -m t5lite.info --verify=DIR`: every committed checkpoint of a run (or of a
converted directory) read whole and checked against the fingerprints recorded when it
was saved (`formats/fingerprints.py`), one line each:

    checkpoint 2: ok (87 arrays, 24.3 MB; data position; iterator)
    checkpoint 4: DAMAGED: opt_state/1/v/decoder/...: recorded f32[...]:..., read f32[...]:...
    checkpoint 6: not checked (saved before t5lite recorded fingerprints)

The arrays are read to this machine's memory one checkpoint at a time and summed on its
CPU: no device is needed. Exit status 1 when one is damaged or unreadable.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import jax
import numpy as np
from etils import epath

from t5lite.errors import ConfigError
from t5lite.formats import checkpoint_files, restore_noise
from t5lite.formats.checkpoint_files import PARAMS_ITEM, STATE_ITEM
from t5lite.formats.t5lite_step import T5liteStep
from t5lite.runtime.checkpointing import data_iterator_item


def _steps(path: str) -> Tuple[epath.Path, List[int]]:
    p = checkpoint_files.absolute(path)
    if not p.is_dir():
        raise ConfigError(f"--verify {path}: no such directory (give a MODEL_DIR or a "
                          f"converted checkpoint's directory)")
    for directory in (p / checkpoint_files.CHECKPOINTS_DIR, p):
        steps = checkpoint_files.complete_steps(directory, (STATE_ITEM, PARAMS_ITEM))
        if steps:
            return directory, steps
    raise ConfigError(f"--verify {path}: no committed checkpoint under it (expected "
                      f"{checkpoint_files.CHECKPOINTS_DIR}/<step>/state or .../params)")


def verify_step(step_dir: epath.Path) -> Tuple[bool, str]:
    """(ok, what to say) for one committed step directory."""
    step = T5liteStep.at(step_dir)
    if step.record is None:
        return True, "not checked (saved before t5lite recorded fingerprints)"
    if "unreadable" in step.record:
        return False, f"DAMAGED: {step.record['unreadable']}"
    try:
        with restore_noise.failure_output_dropped(str(step_dir)):
            tree = step.read()
    except Exception as e:  # noqa: BLE001 - whatever stops Orbax reading it is damage
        return False, f"DAMAGED: unreadable ({restore_noise.short_reason(e)})"
    said = [f"{len(step.record['arrays'])} arrays, "
            f"{sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)) / 1e6:.1f} MB"]
    position = {}  # the data position, when the record has its sum
    if "data" in step.record:
        try:
            data = step.data_position()
        except ValueError as e:
            return False, f"DAMAGED: {e}"
        if data is not None:
            position = {"data": data}
            said.append("data position")
    damaged = step.damage_before_reading() or step.damage_in(tree, **position)
    iterators = step_dir / data_iterator_item.ITEM
    sums = sorted(iterators.glob(f"*{data_iterator_item.SUM_SUFFIX}")) if iterators.is_dir() else []
    for recorded in sums:
        damaged = damaged or data_iterator_item.damage(
            iterators / recorded.name[:-len(data_iterator_item.SUM_SUFFIX)])
    if damaged:
        return False, f"DAMAGED: {damaged}"
    if sums:
        said.append(f"iterator{'s' if len(sums) > 1 else ''}")
    return True, "ok (" + "; ".join(said) + ")"


def verify(path: str, out=print) -> int:
    """Check every committed checkpoint under `path`, one line each; 1 if one is not
    whole."""
    directory, steps = _steps(path)
    bad: Optional[int] = None
    for step in steps:
        ok, said = verify_step(directory / str(step))
        out(f"checkpoint {step}: {said}")
        bad = bad if ok else step
    return 0 if bad is None else 1
