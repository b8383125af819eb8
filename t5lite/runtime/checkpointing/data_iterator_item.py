"""The checkpoint item that holds the data iterator state of every data shard (bytes).

    MODEL_DIR/checkpoints/<step>/data_iterator/
        shard_00000-of-00002.process_00000     shard 0's tf.data iterator state
        shard_00001-of-00002.process_00001     shard 1's, written by process 1

The global stream is cut into data shards (t5lite/data/sharding/shards.py); each shard's
state is written by the process whose rows begin it (the file names that process), with
its SHA-256 beside it (`<name>.sha256`), and read back by every process that reads that
shard, whatever the process count of the run that resumes: `restore` reads the shards
the run asks for (`DataIteratorRestore.shards`: the shard count -> the shards this
process reads; None: all). Bytes that no longer match their SHA-256 are
CheckpointDamagedError (a file without it, written before t5lite recorded them, is read
unchecked). A checkpoint written before data shards existed holds
`process_0000i-of-0000P`: shard i of P. Nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import future

from t5lite.errors import CheckpointDamagedError
from t5lite.formats import fingerprints

ITEM = "data_iterator"
SUM_SUFFIX = ".sha256"
STATE_KEY = "iterator"  # where a data state (dict) carries {"count": S, "states": {shard: bytes}}
_NAME = re.compile(r"(?:shard_(\d+)-of-(\d+)\.process_\d+|process_(\d+)-of-(\d+))")


def file_name(shard: int, count: int) -> str:
    """The file this process writes `shard`'s state to."""
    return f"shard_{shard:05d}-of-{count:05d}.process_{jax.process_index():05d}"


def shard_of(name: str) -> Optional[Tuple[int, int]]:
    """(shard, count) a state file holds; None for another file."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    shard, count, index, processes = match.groups()
    return (int(shard), int(count)) if shard is not None else (int(index), int(processes))


def damage(path: epath.Path, state: Optional[bytes] = None) -> Optional[str]:
    """What is wrong with a shard's iterator file (`state`: its bytes, read here when
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


def _stored(directory: epath.Path) -> Dict[int, Dict[int, epath.Path]]:
    """{count: {shard: the first file that holds it}} of an item directory."""
    found: Dict[int, Dict[int, epath.Path]] = {}
    for path in sorted(directory.iterdir(), key=lambda p: p.name):
        held = shard_of(path.name)
        if held is not None:
            found.setdefault(held[1], {}).setdefault(held[0], path)
    return found


class DataIteratorHandler(ocp.AsyncCheckpointHandler):
    """Writes this process's shards' bytes (nothing, for None) into the item directory."""

    def _write(self, directory: epath.Path, state: Optional[dict]) -> None:
        if not state:
            return
        for shard, data in sorted(state["states"].items()):
            name = file_name(shard, state["count"])
            (directory / name).write_bytes(data)
            (directory / f"{name}{SUM_SUFFIX}").write_text(fingerprints.bytes_fingerprint(data))

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
                ) -> Optional[dict]:
        """{"count": S, "states": {shard: bytes}} of the shards asked for that the
        checkpoint holds; None when it holds none (or another shard count per file set)."""
        stored = _stored(directory)
        if len(stored) != 1:
            return None
        (count, files), = stored.items()
        wanted: Optional[Iterable[int]] = files
        if args is not None and args.shards is not None:
            wanted = args.shards(count)
        if wanted is None:
            return None
        states = {}
        for shard in wanted:
            if shard in files:
                data = files[shard].read_bytes()
                damaged = damage(files[shard], data)
                if damaged:
                    raise CheckpointDamagedError(f"checkpoint {directory.parent.name} is "
                                                 f"damaged: {damaged}")
                states[shard] = data
        return {"count": count, "states": states}


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    state: Optional[dict]  # {"count": S, "states": {shard: bytes}}


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    shards: Optional[Callable[[int], Optional[Iterable[int]]]] = None
