"""Training checkpoints (Orbax): save, resume, and the finetuning restore.

The layout on disk and which steps count as complete: `t5lite.formats.checkpoint_files`.
A training step holds the items `state` (TrainState.as_dict(), StandardSave) and `data`
(the data iterator position, JSON); a converted checkpoint holds `params` instead.

Restore order (`restore_or_init`): the latest complete checkpoint in MODEL_DIR (the whole
state and data position) -> else INITIAL_CHECKPOINT_PATH (parameters only, converted to
the model's fuse_qkv / scan_layers layout: `t5lite.runtime.checkpointing.finetune_restore`) -> else
fresh initialization. A failed restore's Orbax noise is dropped
(`t5lite.formats.restore_noise`).

`CheckpointSettings` carries CHECKPOINT_PERIOD, KEEP_CHECKPOINTS and whether saves run in
the background. Nothing here imports TensorFlow, SeqIO or t5.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
from typing import Any, Callable, Iterable, List, Mapping, Optional, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from t5lite.errors import (CheckpointDamagedError, CheckpointMismatchError, ConfigError,
                           OutputWriteError, check_positive_int)
from t5lite.formats import fingerprints, restore_noise
from t5lite.formats.checkpoint_files import (CHECKPOINTS_DIR, DATA_ITEM, PARAMS_ITEM,
                                             STATE_ITEM, PathLike, absolute, complete_steps,
                                             set_aside_damaged, set_aside_uncommitted)
from t5lite.formats.checkpoint_trees import check_state_matches
from t5lite.formats.t5lite_step import T5liteStep
from t5lite.optim.train_state import TrainState
from t5lite.runtime.checkpointing import data_iterator_item, finetune_restore, upcycle
from t5lite.runtime.checkpointing.finetune_restore import restore_params_for_finetuning
from t5lite.runtime.checkpointing.start import FRESH, Start
from t5lite.runtime.process import disk_space
from t5lite.runtime.process.agreement import process_0_decides

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """CHECKPOINT_PERIOD (save every that many steps; the last step and a SIGTERM always
    save), KEEP_CHECKPOINTS (how many complete checkpoints to keep, None: all) and
    async_save (write in the background while training goes on)."""

    period: Optional[int]
    keep: Optional[int]
    async_save: bool = True

    def __post_init__(self):
        check_positive_int("CHECKPOINT_PERIOD", self.period, optional=True)
        check_positive_int("KEEP_CHECKPOINTS", self.keep, optional=True)


def _local_size(directory: epath.Path) -> int:
    """The bytes of the files under a local directory."""
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(str(directory)) for name in names)


def _nbytes(tree: Any) -> int:
    """The bytes of a tree's arrays (global shapes): what a checkpoint of it writes."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "dtype"))


def _save_replicas_whole_in_one_process() -> None:
    """Orbax's replica-parallel save (its default off GPU) splits each replicated array
    among its replicas, so that the hosts holding them share the writing; to split, it
    compiles a slice program for each array shape. In one process every replica is this
    host's: nothing is shared, and the compiles cost (tiny T5's first save: 64 of them,
    1.1 s of its 6.2 s of compiling). There each array is written whole from its first
    replica (the arrays saved are the same either way); with several processes Orbax
    keeps its default. Registered once a process, without Orbax's warning about
    replacing its handler (a line on every run, not the user's concern)."""
    if jax.process_count() != 1 or isinstance(
            ocp.type_handlers.get_type_handler(jax.Array), _WholeArrayHandler):
        return
    absl_log = logging.getLogger("absl")
    level = absl_log.level
    absl_log.setLevel(logging.ERROR)
    try:
        ocp.type_handlers.register_type_handler(jax.Array, _WholeArrayHandler(),
                                                override=True)
    finally:
        absl_log.setLevel(level)


class _WholeArrayHandler(ocp.type_handlers.ArrayHandler):
    """Orbax's array handler with replica-parallel saving off."""

    def __init__(self):
        super().__init__(use_replica_parallel=False)


# ----------------------------------------------------------------------------- manager


class _Manager(ocp.CheckpointManager):
    """Orbax's manager, less its own look at JAX's preemption sync point. The training
    loop asks it once a step, counting the steps since it started (runtime/loop.py);
    Orbax would ask too, with the step it saves and from its save thread after the loop
    has moved on, and JAX keeps one counter per process: the step agreed on for a stop
    could then be one the loop has passed, or reaches long after the signal."""

    def reached_preemption(self, step: int) -> bool:
        return False


class Checkpointer:
    """Saves and restores the TrainState and the data position under MODEL_DIR.

    keep: how many complete checkpoints to keep (None: all). period: `save` writes when
    step % period == 0 (None: every call) or when forced. async_save: `save` returns once
    the arrays are copied off the devices and writes in the background (`wait` blocks).
    iterator_shards: the shard count of a saved data stream -> the shards whose iterator
    states this process reads back (None: all the checkpoint holds).
    """

    def __init__(self, model_dir: PathLike, keep: Optional[int] = 2,
                 period: Optional[int] = None, async_save: bool = True,
                 iterator_shards: Optional[Callable[[int], Optional[Iterable[int]]]] = None):
        self.model_dir = absolute(model_dir)
        self.iterator_shards = iterator_shards  # shard count -> the data shards read here
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
        self._async = async_save
        disk_space.quiet_background_writers()  # a failed save is reported once, by save/wait
        _save_replicas_whole_in_one_process()
        self._manager = _Manager(
            self.directory, item_names=(STATE_ITEM, DATA_ITEM, data_iterator_item.ITEM,
                                        fingerprints.ITEM),
            item_handlers={data_iterator_item.ITEM: data_iterator_item.DataIteratorHandler()},
            options=options)
        # Orbax removes a crashed save's tmp dirs in a background thread that it awaits only
        # before the next save (not in close): a run that ends before saving (an error, no
        # steps left) would exit with it running ("cannot schedule new futures after
        # interpreter shutdown"). Wait for it here.
        await_cleanup = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)
        if await_cleanup is not None:
            await_cleanup()
        self._in_flight: Optional[Tuple[int, str]] = None  # the save being written
        self._failed = False  # a save failed: Orbax would raise it again on every wait

    # -- saving -----------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """Whether `save` writes `step` without being forced (every call when period is
        None)."""
        return self.period is None or int(step) % self.period == 0

    def save(self, step: int, state: TrainState, data_state: Optional[dict] = None,
             force: bool = False) -> bool:
        """Save `state` and `data_state` (JSON-able but for "iterator": {"count", "states":
        {shard: bytes}}, the data shards' iterator states this process saves, stored per
        shard; None is stored as {}) as
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
        tree = state.as_dict()
        record = {"arrays": fingerprints.array_fingerprints(tree),
                  "data": fingerprints.data_fingerprint(data_state)}
        args = ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(tree),
            DATA_ITEM: ocp.args.JsonSave(data_state),
            data_iterator_item.ITEM: data_iterator_item.DataIteratorSave(iterator),
            fingerprints.ITEM: ocp.args.JsonSave(record)})
        self.wait()  # Orbax waits for the previous save anyway; its failure is reported here
        expected = self._expected_size()
        if expected is not None:
            self._check_room(step, *expected)
            needs = expected[1]
        else:
            needs = f"up to {disk_space.human(_nbytes(state.as_dict()))}, its arrays uncompressed"
        with self._writing(step, needs):
            started = bool(self._manager.save(step, args=args, force=True))
        self._in_flight = (step, needs) if started else None
        if not self._async:
            self.wait()
        return started

    def _expected_size(self) -> Optional[Tuple[int, str]]:
        """(bytes, in words) the next checkpoint should take: the size on disk
        of the newest complete one (the same shapes; Orbax compresses, so the arrays' own
        size would overstate it). None before the first."""
        latest = self.latest_step()
        if latest is None or "://" in str(self.directory):  # no free space to compare
            return None
        size = _local_size(self.step_dir(latest))
        return size, f"about {disk_space.human(size)}, the size of checkpoint {latest}"

    def _check_room(self, step: int, needed: int, needs: str) -> None:
        """DiskFullError before writing a byte when MODEL_DIR's disk has less room than
        the checkpoint should need; process 0 decides for every process (compression
        varies from save to save: refuse only the sure cases)."""
        what = f"checkpoint {step}"
        process_0_decides(
            lambda: disk_space.check_room(what, self.directory, needed, needs, margin=0.9),
            lambda: disk_space.disk_full_error(what, self.directory, needs))

    @contextlib.contextmanager
    def _writing(self, step: int, needs: str):
        """A save (or the wait for one) of `step`: when it fails, what it half wrote is
        removed (never counted: Orbax commits a step by renaming it into place) and the
        error becomes one line: DiskFullError for a full disk, OutputWriteError else."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - every write failure ends in one line
            self._failed, self._in_flight = True, None
            self._remove_partial(step)
            if disk_space.is_disk_full(e):
                raise disk_space.disk_full_error(f"checkpoint {step}", self.directory,
                                                 needs) from None
            raise OutputWriteError(f"checkpoint {step} could not be written to "
                                   f"{self.directory}: {restore_noise.short_reason(e)}") from None

    def _remove_partial(self, step: int) -> None:
        """Remove what a failed save of `step` left (its tmp directory), freeing its room."""
        if jax.process_index() != 0:
            return
        for d in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
            try:
                d.rmtree()
            except OSError as e:
                log.warning("could not remove the partial checkpoint %s: %s", d, e)

    def wait(self) -> None:
        """Block until background saves are committed (OutputWriteError / DiskFullError
        when the save in flight failed; nothing after a failure was reported)."""
        if self._failed:
            return
        with self._writing(*self._in_flight) if self._in_flight else contextlib.nullcontext():
            self._manager.wait_until_finished()
        self._in_flight = None

    def close(self) -> None:
        if not self._failed:
            self.wait()
            self._manager.close()
            return
        try:  # Orbax raises the failed save's error again; it was reported once
            self._manager.close()
        except Exception:  # noqa: BLE001
            pass

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
        reader = T5liteStep(self.step_dir(step) / STATE_ITEM)
        damaged = reader.damage_before_reading()
        if damaged:  # what the record says was saved is the truth, not the model
            raise CheckpointDamagedError(f"checkpoint {step} is damaged: {damaged}")
        check_state_matches(reader.metadata, target, str(self.step_dir(step)))
        state = reader.read(target)
        data = reader.data_position() or {}
        damaged = reader.damage_in(state, data=data)
        if damaged:  # (checkpoints saved before fingerprints: unchecked)
            raise CheckpointDamagedError(f"checkpoint {step} is damaged: {damaged} (its bytes "
                                         f"changed on disk since it was saved)")
        iterators = self.step_dir(step) / data_iterator_item.ITEM
        if iterators.is_dir():
            iterator = data_iterator_item.DataIteratorHandler().restore(
                iterators, data_iterator_item.DataIteratorRestore(self.iterator_shards))
            if iterator is not None:
                data[data_iterator_item.STATE_KEY] = iterator
        return TrainState(**state), data


# ----------------------------------------------------------------------------- order


def restore_or_init(checkpointer: Checkpointer, abstract_state: TrainState,
                    init_fn: Callable[[], TrainState],
                    initial_checkpoint_path: Optional[PathLike] = None, model: Any = None,
                    initial_checkpoint_state: str = "params",
                    factoring: Optional[Mapping[str, Any]] = None
                    ) -> Tuple[TrainState, Optional[dict], Start]:
    """The restore order: the latest complete checkpoint in MODEL_DIR that restores (state
    and data position; newer ones that do not are renamed `<step>.damaged-<ns>`, kept,
    and named in a warning; CheckpointDamagedError when none restores) -> else
    `initial_checkpoint_path`: its parameters only (step 0, fresh optimizer and FP8 state
    from `init_fn()`), or with `initial_checkpoint_state` 'train_state' a T5X run's
    parameters, step and Adafactor state (`finetune_restore.continue_t5x_run`; `factoring`: the run's
    Adafactor options), or with 'upcycle' a dense checkpoint's parameters as a mixture of
    experts (`upcycle`) -> else `init_fn()`.

    Returns (state, data_state or None, the `Start` that says which of these it was)."""
    damaged: List[Tuple[int, str]] = []
    for step in reversed(checkpointer.all_steps()):
        try:
            with restore_noise.failure_output_dropped(str(checkpointer.step_dir(step))):
                state, data = checkpointer.restore(step, abstract_state)
        except CheckpointDamagedError as e:  # its bytes changed on disk: the one before
            damaged.append((step, str(e).split(" is damaged: ", 1)[-1]))
            continue
        except (CheckpointMismatchError, ConfigError):
            raise  # another model or setting: every step would say the same
        except Exception as e:  # noqa: BLE001 - unreadable metadata, missing or cut files
            damaged.append((step, restore_noise.short_reason(e)))
            continue
        for bad, reason in damaged:  # kept, out of the way of Orbax and retention
            name = set_aside_damaged(checkpointer.directory, bad)
            log.warning("skipped damaged checkpoint %d (%s); kept as %s", bad, reason, name)
        if damaged:
            checkpointer.reload()
        return state, data, Start("resume", step=step)
    if damaged:
        raise CheckpointDamagedError(
            f"no checkpoint in {checkpointer.directory} restores: "
            + "; ".join(f"step {s}: {r}" for s, r in damaged)
            + " — nothing was moved or deleted; repair or remove them, or use a new MODEL_DIR")
    if initial_checkpoint_path and initial_checkpoint_state == "train_state":
        state = finetune_restore.continue_t5x_run(initial_checkpoint_path, model,
                                                     abstract_state, init_fn, factoring)
        return state, None, Start("t5x_continue", path=str(initial_checkpoint_path))
    # the init runs (once) after the initial checkpoint is read and checked, or when its
    # reader asks for fresh weights: a refused checkpoint costs no initialization
    fresh = functools.lru_cache(maxsize=None)(init_fn)
    if initial_checkpoint_path and initial_checkpoint_state == "upcycle":
        params = upcycle.restore_upcycled(initial_checkpoint_path, model,  # the routers'
                                          abstract_state.params,          # weights fresh
                                          lambda: fresh().params)
        return fresh().replace(params=params), None, Start("upcycle", path=str(initial_checkpoint_path))
    if initial_checkpoint_path:
        params = restore_params_for_finetuning(initial_checkpoint_path, model,
                                               abstract_state.params,  # LoRA's adapters
                                               fresh=lambda: fresh().params)  # fresh
        return fresh().replace(params=params), None, Start("initial", path=str(initial_checkpoint_path))
    return init_fn(), None, FRESH
