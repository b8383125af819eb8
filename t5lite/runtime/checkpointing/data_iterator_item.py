"""The checkpoint item that holds every process's data iterator state (bytes).

    MODEL_DIR/checkpoints/<step>/data_iterator/
        process_00000-of-00002     process 0's tf.data iterator state
        process_00001-of-00002     process 1's

Each process writes its own file (an input pipeline's state is per process, a few MB:
its shuffle buffer and open-file positions) and reads back only its own; a checkpoint
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

ITEM = "data_iterator"
STATE_KEY = "iterator"  # where a data state (dict) carries this process's bytes


def file_name(process_index: int, process_count: int) -> str:
    return f"process_{process_index:05d}-of-{process_count:05d}"


class DataIteratorHandler(ocp.AsyncCheckpointHandler):
    """Writes this process's bytes (or nothing, for None) into the item directory."""

    def _write(self, directory: epath.Path, state: Optional[bytes]) -> None:
        if state is not None:
            (directory / file_name(jax.process_index(), jax.process_count())).write_bytes(state)

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
        return path.read_bytes() if path.exists() else None


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    state: Optional[bytes]


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    pass
