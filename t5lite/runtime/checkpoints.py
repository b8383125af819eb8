"""Training checkpoints (Orbax): save, resume, and the finetuning restore.

The layout on disk and which steps count as complete: `t5lite.runtime.checkpoint_files`.
A training step holds the items `state` (TrainState.as_dict(), StandardSave) and `data`
(the data iterator position, JSON); a converted checkpoint holds `params` instead.

Restore order (`restore_or_init`): the latest complete checkpoint in MODEL_DIR (the whole
state and data position) -> else INITIAL_CHECKPOINT_PATH (parameters only, converted to
the model's fuse_qkv / scan_layers layout) -> else fresh initialization.

`CheckpointSettings` carries CHECKPOINT_PERIOD, KEEP_CHECKPOINTS and whether saves run in
the background. Nothing here imports TensorFlow, SeqIO or t5.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import re
import sys
import tempfile
import time
import types
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from t5lite.errors import CheckpointDamagedError, CheckpointMismatchError
from t5lite.models import layouts
from t5lite.runtime import data_iterator_item, periods
from t5lite.runtime.checkpoint_files import (CHECKPOINTS_DIR, DATA_ITEM, PARAMS_ITEM,
                                             STATE_ITEM, PathLike, absolute, complete_steps,
                                             resolve_item, set_aside_damaged,
                                             set_aside_uncommitted)
from t5lite.runtime.train_state import TrainState

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """CHECKPOINT_PERIOD (save every that many steps; the last step and a SIGTERM always
    save), KEEP_CHECKPOINTS (how many complete checkpoints to keep, None: all) and
    async_save (write in the background while training goes on)."""

    period: Optional[int] = 1000
    keep: Optional[int] = 2
    async_save: bool = True

    def __post_init__(self):
        periods.check_positive("CHECKPOINT_PERIOD", self.period, optional=True)
        periods.check_positive("KEEP_CHECKPOINTS", self.keep, optional=True)


# ----------------------------------------------------------------------------- tree checks


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _flat_shapes(tree: Any) -> Dict[str, Tuple[int, ...]]:
    """{"a/b/c": shape} over the leaves; None and empty containers have no leaves.
    Namedtuples (targets) and dicts (Orbax metadata of namedtuples) name fields alike."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_key_name(k) for k in path):
            tuple(leaf.shape if hasattr(leaf, "shape") else np.shape(leaf))
            for path, leaf in flat}


def _natural(path: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def _first_difference(ckpt: Dict[str, tuple], model: Dict[str, tuple]) -> Optional[str]:
    """The first difference as a clause, shapes first, then missing, then extra."""
    for path in sorted(model, key=_natural):
        if path in ckpt and tuple(ckpt[path]) != tuple(model[path]):
            return (f"{path} has shape {tuple(ckpt[path])} in the checkpoint but "
                    f"{tuple(model[path])} in the model")
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


def _layout_str(layout: Mapping[str, bool]) -> str:
    return f"fuse_qkv={layout['fuse_qkv']}, scan_layers={layout['scan_layers']}"


def _state_groups(tree: Mapping[str, Any]) -> Dict[str, Dict[str, tuple]]:
    """Flat shapes of a state dict by group; params paths shown as variables paths
    (`params/encoder/...`), the others prefixed by their field."""
    groups = {}
    for field in ("params", "fp8", "opt_state"):
        flat = _flat_shapes(tree.get(field, {}) if isinstance(tree, Mapping) else {})
        groups[field] = flat if field == "params" else {f"{field}/{k}": v for k, v in flat.items()}
    rest = {k: v for k, v in tree.items() if k not in groups} if isinstance(tree, Mapping) else {}
    groups["other"] = _flat_shapes(rest)
    return groups


def check_state_matches(ckpt_tree: Mapping[str, Any], target: Mapping[str, Any],
                        where: str) -> None:
    """Raise CheckpointMismatchError (one line) when a training checkpoint's state tree
    (Orbax metadata) does not fit the abstract target state dict."""
    ck, md = _state_groups(ckpt_tree), _state_groups(target)
    head = f"checkpoint {where} does not match the model: "
    diff = _first_difference(ck["params"], md["params"])
    if diff:
        ck_layout = layouts.detect_layout(ckpt_tree.get("params", {}))
        md_layout = layouts.detect_layout(target.get("params", {}))
        if ck_layout != md_layout:
            cause = (f"the checkpoint has the parameter layout {_layout_str(ck_layout)} but the "
                     f"model {_layout_str(md_layout)} — resume with the same switches, or start "
                     f"a new MODEL_DIR with INITIAL_CHECKPOINT_PATH={where} (converts layouts)")
        elif " has shape " in diff:
            cause = ("MODEL_DIR probably holds a run of another model size — use a new "
                     "MODEL_DIR")
        else:
            cause = ("MODEL_DIR probably holds a run of another model or architecture — use a "
                     "new MODEL_DIR")
        raise CheckpointMismatchError(head + diff + "; " + cause)
    diff = _first_difference(ck["fp8"], md["fp8"])
    if diff:
        raise CheckpointMismatchError(
            head + diff + "; the FP8 setting (or the FP8-using layers) differs from the run "
            f"that wrote it — keep the same precision, or start a new MODEL_DIR with "
            f"INITIAL_CHECKPOINT_PATH={where} (parameters only)")
    diff = _first_difference(ck["opt_state"], md["opt_state"])
    if diff:
        raise CheckpointMismatchError(
            head + diff + "; the optimizer differs from the one that wrote it — use the same "
            f"optimizer, or start a new MODEL_DIR with INITIAL_CHECKPOINT_PATH={where} "
            "(parameters only, fresh optimizer)")
    diff = _first_difference(ck["other"], md["other"])
    if diff:
        raise CheckpointMismatchError(head + diff + "; it was not written by this version of "
                                      "t5lite's trainer — use a new MODEL_DIR")


def item_metadata_tree(item_dir: epath.Path) -> Any:
    handler = ocp.PyTreeCheckpointHandler()
    try:
        return handler.metadata(item_dir).tree
    finally:
        handler.close()


# ----------------------------------------------------------------------------- manager


class Checkpointer:
    """Saves and restores the TrainState and the data position under MODEL_DIR.

    keep: how many complete checkpoints to keep (None: all). period: `save` writes when
    step % period == 0 (None: every call) or when forced. async_save: `save` returns once
    the arrays are copied off the devices and writes in the background (`wait` blocks).
    """

    def __init__(self, model_dir: PathLike, keep: Optional[int] = 2,
                 period: Optional[int] = None, async_save: bool = True):
        self.model_dir = absolute(model_dir)
        self.directory = self.model_dir / CHECKPOINTS_DIR
        self.keep, self.period = keep, period
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}")
        if period is not None and period < 1:
            raise ValueError(f"period must be >= 1 or None (every call), got {period}")
        foreign = [s for s in complete_steps(self.directory, (PARAMS_ITEM,))
                   if s not in complete_steps(self.directory, (STATE_ITEM,))]
        if foreign:
            raise CheckpointMismatchError(
                f"{self.directory / str(foreign[0])} holds a converted parameter checkpoint, "
                f"not a training run (its old steps would be deleted as new ones are kept) — "
                f"give {self.model_dir} as INITIAL_CHECKPOINT_PATH and use a new MODEL_DIR")
        set_aside_uncommitted(self.directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(
            self.directory, item_names=(STATE_ITEM, DATA_ITEM, data_iterator_item.ITEM),
            item_handlers={data_iterator_item.ITEM: data_iterator_item.DataIteratorHandler()},
            options=options)
        # Orbax removes a crashed save's tmp dirs in a background thread that it awaits only
        # before the next save (not in close): a run that ends before saving (an error, no
        # steps left) would exit with it running ("cannot schedule new futures after
        # interpreter shutdown"). Wait for it here.
        await_cleanup = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)
        if await_cleanup is not None:
            await_cleanup()

    # -- saving -----------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """Whether `save` writes `step` without being forced (every call when period is
        None)."""
        return self.period is None or periods.due(int(step), self.period)

    def save(self, step: int, state: TrainState, data_state: Optional[dict] = None,
             force: bool = False) -> bool:
        """Save `state` and `data_state` (JSON-able but for its bytes under "iterator",
        this process's data iterator state, stored per process; None is stored as {}) as
        `step` if the period says so or `force`. Returns whether a save started. A step
        that is already saved (or being saved) is not written again."""
        step = int(step)
        if not (force or self.should_save(step)):
            return False
        if step in self._manager.all_steps() or step in self.all_steps():
            log.info("checkpoint %d already saved; not saving it again", step)
            return False
        data_state = dict(data_state or {})
        iterator = data_state.pop(data_iterator_item.STATE_KEY, None)
        try:
            json.dumps(data_state)
        except (TypeError, ValueError) as e:  # fail here, not in the background writer
            raise TypeError(f"data_state for checkpoint {step} is not JSON-able: {e}") from None
        args = ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(state.as_dict()),
            DATA_ITEM: ocp.args.JsonSave(data_state),
            data_iterator_item.ITEM: data_iterator_item.DataIteratorSave(iterator)})
        return bool(self._manager.save(step, args=args, force=True))

    def wait(self) -> None:
        """Block until background saves are committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def reload(self) -> None:
        """Re-read the steps on disk (after some were moved aside)."""
        self._manager.reload()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reading ----------------------------------------------------------------------
    def all_steps(self) -> List[int]:
        """Complete (committed) training checkpoints, oldest first."""
        return complete_steps(self.directory)

    def latest_step(self) -> Optional[int]:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> epath.Path:
        return self.directory / str(int(step))

    def restore(self, step: Optional[int], abstract_state: TrainState
                ) -> Tuple[TrainState, dict]:
        """Restore checkpoint `step` (None: the latest) into the shapes, dtypes and
        shardings of `abstract_state` (a TrainState of jax.ShapeDtypeStruct with
        `.sharding`); any mesh or device count works. Returns (state, data_state).
        Raises CheckpointMismatchError before reading any array when the trees differ."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"{self.directory}: no complete checkpoint to restore")
        step = int(step)
        if step not in self.all_steps():
            raise FileNotFoundError(
                f"{self.step_dir(step)}: no complete checkpoint (complete steps: "
                f"{self.all_steps() or 'none'})")
        target = abstract_state.as_dict()
        check_state_matches(item_metadata_tree(self.step_dir(step) / STATE_ITEM), target,
                            str(self.step_dir(step)))
        items = {STATE_ITEM: ocp.args.StandardRestore(target)}
        has_data = (self.step_dir(step) / DATA_ITEM).is_dir()
        if has_data:
            items[DATA_ITEM] = ocp.args.JsonRestore()
        has_iterator = (self.step_dir(step) / data_iterator_item.ITEM).is_dir()
        if has_iterator:
            items[data_iterator_item.ITEM] = data_iterator_item.DataIteratorRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        data = dict(restored[DATA_ITEM] or {}) if has_data else {}
        iterator = restored[data_iterator_item.ITEM] if has_iterator else None
        if iterator is not None:
            data[data_iterator_item.STATE_KEY] = iterator
        return TrainState(**restored[STATE_ITEM]), data


# ----------------------------------------------------------------------------- finetuning


def _layout_cfg(model, layout: Mapping[str, bool]):
    if model is not None and dataclasses.is_dataclass(getattr(model, "config", None)):
        return dataclasses.replace(model.config, **layout)
    return types.SimpleNamespace(**layout)


def _place(x: np.ndarray, like: Any) -> Any:
    x = np.asarray(x, dtype=like.dtype)
    sharding = getattr(like, "sharding", None)
    if sharding is None:
        return x
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def restore_params_for_finetuning(path: PathLike, model: Any, abstract_params: Mapping[str, Any],
                                  what: str = "INITIAL_CHECKPOINT_PATH") -> Dict[str, Any]:
    """The parameters of the checkpoint at `path` (INITIAL_CHECKPOINT_PATH, or the setting
    `what` names; see `checkpoint_files.resolve_item`), as `abstract_params`
    (`{"params": ...}` of jax.ShapeDtypeStruct with shardings) describes them. A training
    checkpoint gives its `params` only. A stored layout other than the model's (fused /
    unfused QKV, scanned / unscanned layers) is converted (on the host); then the shapes
    are checked (CheckpointMismatchError)."""
    item_dir, item = resolve_item(path, what)
    where = str(item_dir.parent if item_dir.name in (PARAMS_ITEM, STATE_ITEM) else item_dir)
    meta = item_metadata_tree(item_dir)
    stored = meta.get("params", {}) if item == STATE_ITEM else meta  # {"params": ...}
    if not isinstance(stored, Mapping) or "params" not in stored:
        raise FileNotFoundError(f"{what} {path}: {item_dir} holds no 'params' collection")
    bare = "params" not in abstract_params  # a bare params tree: return one alike
    target = {"params": abstract_params if bare else abstract_params["params"]}
    src_layout = layouts.detect_layout(stored)
    if model is not None and hasattr(model, "config"):
        dst_layout = {"fuse_qkv": bool(model.config.fuse_qkv),
                      "scan_layers": bool(model.config.scan_layers)}
    else:
        dst_layout = layouts.detect_layout(target)
    head = f"checkpoint {where} does not match the model: "
    cause = (f"{what} probably holds another model size or architecture — "
             "point it at a checkpoint of this model (or fix the model config)")

    if src_layout == dst_layout:
        diff = _first_difference(_flat_shapes(stored), _flat_shapes(target))
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
    log.info("converting %s from %s to %s", where, _layout_str(src_layout), _layout_str(dst_layout))
    host = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), stored)
    request = {"params": host} if item == STATE_ITEM else host
    with ocp.PyTreeCheckpointer() as ckpt:
        loaded = ckpt.restore(item_dir, args=ocp.args.PyTreeRestore(
            item=request, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(
                restore_type=np.ndarray), request), partial_restore=True))
    loaded = loaded["params"] if item == STATE_ITEM else loaded
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        converted = layouts.convert_params({"params": loaded["params"]},
                                           _layout_cfg(model, src_layout),
                                           _layout_cfg(model, dst_layout))
        converted = jax.tree.map(np.asarray, converted)
    diff = _first_difference(_flat_shapes(converted), _flat_shapes(target))
    if diff:
        raise CheckpointMismatchError(
            head + diff + f" (after converting from {_layout_str(src_layout)} to "
            f"{_layout_str(dst_layout)}); " + cause)
    placed = jax.tree.map(_place, converted, target)
    return placed["params"] if bare else placed


# ----------------------------------------------------------------------------- order


_ABANDONED_READ_MARKS = ("read_array_index", "Encountered error while reading array",
                         "Event loop is closed")


def _mentions_abandoned_read(text: str) -> bool:
    return any(mark in text for mark in _ABANDONED_READ_MARKS)


def _is_abandoned_read(unraisable) -> bool:
    """An array read Orbax abandoned when another read of the same restore failed: its
    coroutine (or the closed event loop it reports to) complains when collected, later."""
    name = getattr(getattr(unraisable, "object", None), "__qualname__", "")
    return _mentions_abandoned_read(f"{name} {getattr(unraisable, 'exc_value', '')}")


def _drop_abandoned_reads() -> None:
    """From now on, the reports of abandoned reads (unraisable exceptions, asyncio's
    never-retrieved task errors) are dropped."""
    previous = sys.unraisablehook
    if getattr(previous, "_t5lite_filter", False):
        return

    def hook(unraisable):
        if not _is_abandoned_read(unraisable):
            previous(unraisable)

    hook._t5lite_filter = True
    sys.unraisablehook = hook
    # asyncio reports a failed read nobody awaited ("Task exception was never retrieved")
    logging.getLogger("asyncio").addFilter(lambda record: not _mentions_abandoned_read(
        f"{record.msg} {record.args} {record.exc_info[1] if record.exc_info else ''}"))


@contextlib.contextmanager
def _failure_output_dropped():
    """A restore whose stderr is kept only if it succeeds. A damaged checkpoint makes
    Orbax and TensorStore print hundreds of lines (a traceback per array, asyncio's
    "Event loop is closed" from their reader threads) besides raising; the raised error
    is what the user gets, in one line."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        quiet = logging.root.manager.disable
        logging.disable(logging.ERROR)
        failed = True
        try:
            yield
            failed = False
        finally:
            if failed:
                _drop_abandoned_reads()
                gc.collect()      # abandoned reads report now, into the capture
                time.sleep(0.2)
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            logging.disable(quiet)
            if not failed:
                captured.seek(0)
                sys.stderr.write(captured.read().decode(errors="replace"))


def _short_reason(e: BaseException) -> str:
    """The first sentence of an error, on one line (TensorStore appends its whole spec)."""
    def first(x):
        return " ".join(str(x).split()).split(". See full TensorStore")[0].split(" [source")[0]
    text = first(e)
    cause = e.__cause__ or e.__context__
    if cause is not None and first(cause) and first(cause) not in text:
        text += f": {first(cause)}"
    return f"{type(e).__name__}: {text}"[:300]


def restore_or_init(checkpointer: Checkpointer, abstract_state: TrainState,
                    init_fn: Callable[[], TrainState],
                    initial_checkpoint_path: Optional[PathLike] = None, model: Any = None
                    ) -> Tuple[TrainState, Optional[dict], str]:
    """The restore order: the latest complete checkpoint in MODEL_DIR that restores (state
    and data position; newer ones that do not are renamed `<step>.damaged-<ns>`, kept,
    and named in a warning; CheckpointDamagedError when none restores) -> else `initial_checkpoint_path` (parameters only; step 0, fresh optimizer
    and FP8 state from `init_fn()`) -> else `init_fn()`.

    Returns (state, data_state or None, source) with source "resume:<step>",
    "initial:<path>" or "init"."""
    damaged: List[Tuple[int, str]] = []
    for step in reversed(checkpointer.all_steps()):
        try:
            with _failure_output_dropped():
                state, data = checkpointer.restore(step, abstract_state)
        except CheckpointMismatchError:
            raise  # another model or setting: every step would say the same
        except Exception as e:  # noqa: BLE001 - unreadable metadata, missing or cut files
            damaged.append((step, _short_reason(e)))
            continue
        for bad, reason in damaged:  # kept, out of the way of Orbax and retention
            name = set_aside_damaged(checkpointer.directory, bad)
            log.warning("skipped damaged checkpoint %d (%s); kept as %s", bad, reason, name)
        if damaged:
            checkpointer.reload()
        return state, data, f"resume:{step}"
    if damaged:
        raise CheckpointDamagedError(
            f"no checkpoint in {checkpointer.directory} restores: "
            + "; ".join(f"step {s}: {r}" for s, r in damaged)
            + " — nothing was moved or deleted; repair or remove them, or use a new MODEL_DIR")
    if initial_checkpoint_path:
        params = restore_params_for_finetuning(initial_checkpoint_path, model,
                                               abstract_state.params)
        state = init_fn()
        return state.replace(params=params), None, f"initial:{initial_checkpoint_path}"
    return init_fn(), None, "init"
