"""The checkpoint item that holds every process's data iterator state (bytes).

    MODEL_DIR/checkpoints/<step>/data_iterator/
        process_00000-of-00002     process 0's tf.data iterator state
        process_00001-of-00002     process 1's

Each process writes its own file (an input pipeline's state is per process, a few MB:
its shuffle buffer and open-file positions), with its SHA-256 beside it
(`process_...-of-....sha256`), and reads back only its own: bytes that no longer match
are CheckpointDamagedError (a file without its fingerprint, written before t5lite
recorded them, is read unchecked); a checkpoint
written by another number of processes has no file for this one, which `restore`
reports as None (the data pipeline then refuses the resume, naming the process count).
Nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import future

from t5lite.errors import CheckpointDamagedError
from t5lite.formats import fingerprints

ITEM = "data_iterator"
SUM_SUFFIX = ".sha256"
STATE_KEY = "iterator"  # where a data state (dict) carries this process's bytes


def file_name(process_index: int, process_count: int) -> str:
    return f"process_{process_index:05d}-of-{process_count:05d}"


def damage(path: epath.Path, state: Optional[bytes] = None) -> Optional[str]:
    """What is wrong with a process's iterator file (`state`: its bytes, read here when
    not given), None when it matches the SHA-256 saved beside it or has none (written
    before t5lite recorded them)."""
    recorded = path.parent / f"{path.name}{SUM_SUFFIX}"
    if not recorded.exists():
        return None
    if state is None and not path.exists():
        return f"{ITEM}/{path.name} is missing"
    state = path.read_bytes() if state is None else state
    if recorded.read_text().strip() == fingerprints.bytes_fingerprint(state):
        return None
    return f"{ITEM}/{path.name}: its bytes are not the ones saved (SHA-256)"


class DataIteratorHandler(ocp.AsyncCheckpointHandler):
    """Writes this process's bytes (or nothing, for None) into the item directory."""

    def _write(self, directory: epath.Path, state: Optional[bytes]) -> None:
        if state is not None:
            name = file_name(jax.process_index(), jax.process_count())
            (directory / name).write_bytes(state)
            (directory / f"{name}{SUM_SUFFIX}").write_text(fingerprints.bytes_fingerprint(state))

    async def async_save(self, directory: epath.Path, args: "DataIteratorSave"
                         ) -> Optional[List[future.Future]]:
        state = args.state  # already bytes: the iterator was read when save() was called

        async def write():
            self._write(directory, state)
        return [future.CommitFutureAwaitingContractedSignals(write(),
                                                             name="data_iterator_save")]

    def save(self, directory: epath.Path, args: "DataIteratorSave") -> None:
        self._write(directory, args.state)

    def restore(self, directory: epath.Path, args: Optional["DataIteratorRestore"] = None
                ) -> Optional[bytes]:
        path = directory / file_name(jax.process_index(), jax.process_count())
        if not path.exists():
            return None
        state = path.read_bytes()
        damaged = damage(path, state)
        if damaged:
            raise CheckpointDamagedError(f"checkpoint {directory.parent.name} is damaged: "
                                         f"{damaged}")
        return state


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    state: Optional[bytes]


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    pass
