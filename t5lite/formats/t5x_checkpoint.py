"""Read a T5X checkpoint as it lies on disk: T5X's own (pre-Orbax) layout.

    checkpoint_<step>/
      checkpoint                       flax msgpack: {"version": 3, "optimizer": state}
      target.encoder.layers_0.attention.query.kernel/   one zarr v2 array per
        .zarray, 0.0, 1.0, ...                           partitioned leaf

`state` is `{"target": params, "state": {"step": int32, "param_states": {...}}}` (and
`flax_mutables` when the model has them). A leaf is either an array stored in the msgpack
(flax's ext types: small arrays, Adafactor's factored rows and columns, the step) or a
TensorStore spec `{"driver": "zarr", "kvstore": {"path": "target.x.y/"}, ...}` whose path
is relative to the checkpoint directory. T5X writes bfloat16 natively since version 3;
version 2 stored it as uint16 bit patterns, read back here as bfloat16. Version 0 (a bare
flax state dict) and 1 are refused, as T5X refuses them.

    tree = read_checkpoint("/ckpt/checkpoint_1000000")   # {"target": ..., "state": ...}

T5X's later Orbax layout (`train.use_orbax=True`) holds the same state dict, without
`version` / `optimizer` around it, as an Orbax PyTree item (OCDBT, zarr v2):

    checkpoint_<step>/
      _CHECKPOINT_METADATA, dataset/
      state/   _METADATA (the tree), manifest.ocdbt, ocdbt.process_<i>/, d/

It is told apart by `state/_METADATA` whose tree has `target` and `state` at the top
(t5lite's own `state` item has `params`, `opt_state`, ...), and read with Orbax.

Every leaf comes back as a numpy array. Nothing here unpickles: msgpack, zarr and Orbax
only. The zarr arrays are read with TensorStore (installed with orbax-checkpoint).

Data that is not all there is refused, never read as zeros. TensorStore reads an absent
zarr chunk as the array's fill value, so before an array is read every chunk of its grid
(`.zarray`: shape / chunks, keys joined by its `dimension_separator`) must be a file of
the size it can have (not empty; exactly chunk size x item size when uncompressed), and
TensorStore reads with `fill_missing_data_reads=False` besides. No chunk of a checkpoint
T5X wrote may legitimately be absent: TensorStore leaves out only chunks equal to an
array's fill value, T5X's specs set none (`"fill_value": null` in every `.zarray`: its
metadata is `compressor`, `shape`, `chunks`, from `_get_param_info` or jax's
`_get_metadata`), and with no fill value TensorStore writes every chunk, all-zero ones
included; Orbax writes with `store_data_equal_to_fill_value=True`. So an absent chunk is
refused whatever the fill value (a writer that skips fill-valued chunks, e.g. zarr-python's
`write_empty_chunks=False`, is not T5X and cannot be told from a lost file). The Orbax
layout is read by Orbax, which reads with `fill_missing_data_reads=False` itself (OCDBT
keys and per-array directories alike); its "chunk ... is missing" becomes the same line.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Dict

import numpy as np

from t5lite.errors import CheckpointDamagedError, ConfigError

MSGPACK_NAME = "checkpoint"
SUPPORTED_VERSIONS = (2, 3)


def is_t5x_checkpoint(path) -> bool:
    """Whether `path` is a T5X checkpoint directory (or its `checkpoint` file): in T5X's
    own layout a flax msgpack whose top-level keys are `version` and `optimizer`, in the
    Orbax layout a `state` item whose tree has `target` and `state`."""
    if _orbax_state_dir(Path(path)) is not None:
        return True
    file = _msgpack_file(Path(path))
    if file is None or (file.parent / "_METADATA").exists():
        return False
    return _top_level_keys(file) == {"version", "optimizer"}


def _top_level_keys(file: Path) -> set:
    """The msgpack's top-level map keys, read without decoding the values (empty when the
    file is not a msgpack map)."""
    import msgpack
    try:
        with open(file, "rb") as f:
            unpacker = msgpack.Unpacker(f, raw=False)
            keys = set()
            for _ in range(unpacker.read_map_header()):
                keys.add(unpacker.unpack())
                unpacker.skip()
            return keys
    except Exception:  # noqa: BLE001 - not a msgpack map: not a T5X checkpoint
        return set()


def read_checkpoint(path, arrays: bool = True) -> Dict[str, Any]:
    """The state dict at `path` (a `checkpoint_<step>` directory or its `checkpoint`
    file), every leaf a numpy array (`arrays=False`: the zarr leaves stay TensorStore
    specs, nothing but the msgpack is read). ConfigError when it is not a T5X checkpoint,
    CheckpointDamagedError when a part is missing or unreadable; each names the path."""
    path = Path(path)
    orbax_dir = _orbax_state_dir(path)
    if orbax_dir is not None:
        return _read_orbax(orbax_dir, arrays)
    file = _msgpack_file(path)
    if file is None:
        raise ConfigError(f"{path} is not a T5X checkpoint: no '{MSGPACK_NAME}' file in it "
                          f"(point at a checkpoint_<step> directory)")
    if (file.parent / "_METADATA").exists():
        raise ConfigError(f"{file.parent} is an Orbax checkpoint but not T5X's (its tree has "
                          f"no 'target' and 'state'); point at a T5X checkpoint_<step> directory")
    from flax import serialization
    try:
        raw = serialization.msgpack_restore(file.read_bytes())
    except Exception as e:  # noqa: BLE001 - any decode failure is one kind of fault
        raise CheckpointDamagedError(f"{file} is not a readable T5X checkpoint file "
                                     f"({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict) or "optimizer" not in raw or "version" not in raw:
        raise ConfigError(f"{file} is not a T5X checkpoint: its msgpack has no 'version' and "
                          f"'optimizer' keys (a bare flax state dict, version 0, is not read)")
    version = int(raw["version"])
    if version not in SUPPORTED_VERSIONS:
        raise ConfigError(f"{file} is a T5X checkpoint of version {version}; t5lite reads "
                          f"versions {', '.join(map(str, SUPPORTED_VERSIONS))}")
    if not arrays:
        return raw["optimizer"]
    return _resolve(raw["optimizer"], file.parent, version, "")


def read_step(path) -> int:
    """The training step a T5X checkpoint was saved at (`state/step`), without reading its
    zarr arrays."""
    tree = read_checkpoint(path, arrays=False)
    return int(tree["state"]["step"])


def _orbax_state_dir(path: Path):
    """The `state` item directory of a T5X checkpoint in the Orbax layout at `path` (the
    step directory or the item itself), or None. Reads the tree's metadata file only."""
    import json
    for item in (path / "state", path):
        if item.name != "state" or not (item / "_METADATA").is_file():
            continue
        try:
            tree = json.loads((item / "_METADATA").read_text())["tree_metadata"]
            tops = {leaf["key_metadata"][0]["key"] for leaf in tree.values()}
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return None
        if {"target", "state"} <= tops and "params" not in tops:
            return item
    return None


def _read_orbax(item: Path, arrays: bool) -> Dict[str, Any]:
    """The state dict of a T5X Orbax checkpoint's `state` item as numpy arrays
    (`arrays=False`: `state/step` only, nothing else read)."""
    import jax
    import orbax.checkpoint as ocp
    from t5lite.formats import restore_noise
    from t5lite.formats.checkpoint_trees import item_metadata_tree
    try:
        with restore_noise.failure_output_dropped(str(item)):
            meta = item_metadata_tree(item)
            if not arrays:
                meta = {"state": {"step": meta["state"]["step"]}}
            request = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta)
            restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
            with ocp.PyTreeCheckpointer() as ckpt:
                tree = ckpt.restore(item, args=ocp.args.PyTreeRestore(
                    item=request, restore_args=restore_args, partial_restore=not arrays))
    except Exception as e:  # noqa: BLE001 - any unreadable part is one kind of fault
        missing = _missing_chunk(_all_text(e), item)
        if missing is not None:  # Orbax reads with fill_missing_data_reads=False
            array, chunk = missing
            name = array.replace(".", "/")
            raise CheckpointDamagedError(
                f"T5X checkpoint {item.parent} is missing data: parameter {name!r}"
                f"{_ours(name)} has no chunk {chunk} (key {array}/{chunk} of its Orbax "
                f"state); {COPY_AGAIN}") from None
        raise CheckpointDamagedError(f"T5X checkpoint {item.parent}: its Orbax state cannot "
                                     f"be read ({restore_noise.short_reason(e)}); copy the "
                                     f"whole checkpoint directory") from None
    return _resolve(tree, item, 3, "")


def _msgpack_file(path: Path):
    if path.is_file() and path.name == MSGPACK_NAME:
        return path
    if (path / MSGPACK_NAME).is_file():
        return path / MSGPACK_NAME
    if (path / "state" / MSGPACK_NAME).is_file():  # T5X also saves under state/
        return path / "state" / MSGPACK_NAME
    return None


def _is_tensorstore_spec(node) -> bool:
    return isinstance(node, dict) and "driver" in node and "metadata" in node and \
        ("kvstore" in node or "path" in node)


def _resolve(node, directory: Path, version: int, name: str):
    if _is_tensorstore_spec(node):
        return _read_zarr(node, directory, version, name)
    if isinstance(node, dict):
        return {k: _resolve(v, directory, version, f"{name}/{k}" if name else k)
                for k, v in node.items()}
    if node is None:
        return None
    array = np.asarray(node)
    if version == 2 and array.dtype == np.uint16:
        array = _bf16_from_bits(array)
    return array


def _relative_path(spec) -> str:
    kvstore = spec.get("kvstore")
    if isinstance(kvstore, dict) and kvstore.get("path"):
        return kvstore["path"]
    return spec.get("path") or ""


COPY_AGAIN = "the checkpoint was copied incompletely: copy the whole checkpoint directory again"


def _read_zarr(spec, directory: Path, version: int, name: str) -> np.ndarray:
    """One partitioned leaf: its zarr directory, every chunk checked present, read whole
    (the on-disk `.zarray` is the authority for chunks and compressor, as in T5X)."""
    relative = _relative_path(spec)
    array_dir = (directory / relative.rstrip("/")) if relative else None
    if array_dir is None or not (array_dir / ".zarray").is_file():
        raise CheckpointDamagedError(
            f"T5X checkpoint {directory}: the array of parameter {name!r} is missing "
            f"(no {array_dir or relative!s}/.zarray); copy the whole checkpoint directory")
    meta = _zarray(array_dir, directory, name)
    _check_chunks(meta, array_dir, directory, name)
    import tensorstore as ts
    try:
        store = ts.open({"driver": "zarr", "fill_missing_data_reads": False,
                         "kvstore": {"driver": "file", "path": os.fspath(array_dir) + "/"}},
                        open=True, read=True).result()
        array = np.asarray(store.read().result())
    except Exception as e:  # noqa: BLE001
        missing = _missing_chunk(_all_text(e), array_dir)
        if missing is not None:  # gone between the check and the read
            raise CheckpointDamagedError(
                f"T5X checkpoint {directory} is missing data: parameter {name!r}{_ours(name)} "
                f"has no chunk {missing[1].replace('.', meta.get('dimension_separator') or '.')}"
                f" in {array_dir.name}/; {COPY_AGAIN}") from None
        raise CheckpointDamagedError(f"T5X checkpoint {directory}: cannot read the array of "
                                     f"parameter {name!r} in {array_dir} "
                                     f"({' '.join(str(e).split())})") from None
    expected = _as_list(spec.get("metadata", {}).get("shape"))
    if expected is not None and list(array.shape) != expected:
        raise CheckpointDamagedError(
            f"T5X checkpoint {directory}: parameter {name!r} has shape {list(array.shape)} "
            f"on disk but {list(expected)} in the checkpoint file")
    if array.dtype == np.uint16 and (version == 2 or spec.get("dtype") == "bfloat16"):
        array = _bf16_from_bits(array)
    return array


def _zarray(array_dir: Path, directory: Path, name: str) -> Dict[str, Any]:
    """The zarr v2 metadata of an array directory, its grid fields checked."""
    try:
        meta = json.loads((array_dir / ".zarray").read_text())
        shape, chunks = [int(n) for n in meta["shape"]], [int(c) for c in meta["chunks"]]
        ok = meta.get("zarr_format", 2) == 2 and len(shape) == len(chunks) and \
            all(n >= 0 for n in shape) and all(c >= 1 for c in chunks)
    except (OSError, ValueError, KeyError, TypeError) as e:
        ok, meta = False, f"{type(e).__name__}: {' '.join(str(e).split())}"
    if not ok:
        raise CheckpointDamagedError(
            f"T5X checkpoint {directory}: the metadata of parameter {name!r} "
            f"({array_dir.name}/.zarray) is not zarr v2 array metadata ({str(meta)[:200]}); "
            f"{COPY_AGAIN}")
    return meta


def chunk_grid(meta: Dict[str, Any]):
    """The number of chunks along each axis of a zarr v2 array (`.zarray` fields)."""
    return [-(-int(n) // int(c)) for n, c in zip(meta["shape"], meta["chunks"])]


def chunk_keys(meta: Dict[str, Any]):
    """Every chunk key of a zarr v2 array, in C order: '0.0', '0.1', ... (its
    `dimension_separator`, '.' by default, joins the indices; a 0-d array has chunk '0')."""
    grid = chunk_grid(meta)
    if not grid:
        return ["0"]
    separator = meta.get("dimension_separator") or "."
    return [separator.join(map(str, index)) for index in np.ndindex(*grid)]


def _raw_chunk_bytes(meta: Dict[str, Any]):
    """The size of every chunk file of an uncompressed, unfiltered array, else None."""
    if meta.get("compressor") is not None or meta.get("filters"):
        return None
    dtype = meta.get("dtype")
    try:
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    except TypeError:
        return None
    return int(np.prod([int(c) for c in meta["chunks"]])) * itemsize


def _check_chunks(meta: Dict[str, Any], array_dir: Path, directory: Path, name: str) -> None:
    """CheckpointDamagedError naming the parameter and its first absent, empty or
    wrong-sized chunk file, unless every chunk of the grid is there."""
    raw = _raw_chunk_bytes(meta)
    missing, bad = [], []
    for key in chunk_keys(meta):
        try:
            size = os.stat(array_dir / key).st_size
        except OSError:
            missing.append(key)
            continue
        if size == 0 or (raw is not None and size != raw):
            bad.append((key, size))
    grid = " x ".join(map(str, chunk_grid(meta))) or "1"
    total = int(np.prod(chunk_grid(meta)))
    where = f"in {array_dir.name}/"
    if missing:
        more = f": {', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}" \
            if len(missing) > 1 else ""
        raise CheckpointDamagedError(
            f"T5X checkpoint {directory} is missing data: parameter {name!r}{_ours(name)} "
            f"has no chunk {missing[0]} {where} ({len(missing)} of its {grid} = {total} "
            f"chunks missing{more}); {COPY_AGAIN}")
    if bad:
        key, size = bad[0]
        what = "is empty (0 bytes)" if size == 0 else \
            f"has {size} bytes where an uncompressed chunk has {raw}"
        raise CheckpointDamagedError(
            f"T5X checkpoint {directory} is missing data: chunk {key} of parameter "
            f"{name!r}{_ours(name)} {where} {what} ({len(bad)} of its {total} chunks cut "
            f"short); {COPY_AGAIN}")


def _ours(name: str) -> str:
    """t5lite's name of a T5X parameter (its `target` subtree maps name for name)."""
    return f" (t5lite's params/{name[len('target/'):]})" if name.startswith("target/") else ""


_MISSING_CHUNK = re.compile(r'chunk \{([^}]*)\} stored at (?:local file )?"([^"]+)"'
                            r'( in OCDBT database at local file "[^"]+")? is missing')


def _all_text(e: BaseException) -> str:
    """An error's message and those of its causes, on one line."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(str(e))
        e = e.__cause__ or e.__context__
    return " ".join(" ".join(parts).split())


def _missing_chunk(message: str, item: Path = None):
    """(array, chunk key) of TensorStore's "chunk {i, j} stored at ... is missing" (a
    read with fill_missing_data_reads=False), or None. The array is the zarr directory's
    name (an OCDBT key's first part, or a local file's first directory under `item`); the
    chunk key is written with '.' (Orbax's and T5X's separator)."""
    found = _MISSING_CHUNK.search(" ".join(message.split()))
    if found is None:
        return None
    indices, stored, ocdbt = found.groups()
    chunk = ".".join(i.strip() for i in indices.split(",") if i.strip()) or "0"
    if ocdbt:
        return stored.partition("/")[0], chunk
    path = Path(stored)
    if item is not None and path.is_relative_to(item) and path != item:
        return path.relative_to(item).parts[0], chunk
    return path.parent.name, chunk


def _as_list(value):
    """A shape as written: a list, or flax's state-dict form of one ({"0": .., "1": ..})."""
    if isinstance(value, dict):
        return [int(value[k]) for k in sorted(value, key=int)]
    return None if value is None else [int(v) for v in value]


def _bf16_from_bits(array: np.ndarray) -> np.ndarray:
    import ml_dtypes
    return np.ascontiguousarray(array).view(ml_dtypes.bfloat16)
