"""Fingerprints of a checkpoint's contents, recorded at save and checked at every
restore, so that bytes changed on disk (bit rot, a bad copy, a partial rsync) are never
trained on, evaluated or converted as if nothing happened.

    record = array_fingerprints(tree)          # {"params/params/encoder/...": "f32[...]:a:b"}
    damaged = first_damaged(record, tree)      # None, or "path: recorded ..., read ..."
    data_fingerprint(json_able)                # "sha256:..." of a JSON item

An array's fingerprint is two 32-bit sums over its elements' bit patterns w_i (float32
and int32 as they are; 16- and 8-bit types zero-extended; bool as 0 / 1), i the element's
flat index in the global array:

    a = sum(w_i * (2 i + 1))                 mod 2^32
    b = sum(mix(w_i xor (i * 0x9E3779B9)))   mod 2^32

`mix` is MurmurHash3's 32-bit finalizer (xor-shifts and two odd multiplies: a bijection).
Recorded with the dtype and shape as "<dtype>[<shape>]:<a>:<b>" (hex). Integer sums mod
2^32 do not depend on the order they are added in, so the fingerprint is the same
whatever the mesh, or the library, that computes it. They are computed where the array
lives, sharded as it is (each device sums its shard, one all-reduce of two words per
array; one compiled program for each kind of array), so a save or a restore reads
nothing back but those words: the state is read once more where it lives (what that
costs: docs/checkpoints.md). A small array already in this process's memory (numpy, or
on CPU devices) is summed in numpy instead, to the same two words (HOST_ELEMENTS).

What it catches: any change to one element (for a fixed i both terms are bijections of
w_i, so the sums move), any change to a few elements or two elements swapped unless the
mixed terms happen to cancel (about one chance in 2^32 for b, independently of a, which a
swap of x and -x, a difference of 2^31, can leave unmoved), a shape or dtype read
otherwise, an array missing or added. What it cannot: damage made on purpose to agree (it
is a checksum, not a seal: a checkpoint's enemies are bit rot, bad copies and cut
transfers, not forgers). A file whose damage stops Orbax from decoding it never gets this
far: that checkpoint is unreadable, as before.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any, Dict, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from t5lite.formats.checkpoint_trees import key_name
from t5lite.models.layouts import in_host_memory

ITEM = "fingerprints"  # the checkpoint item (JSON): {"arrays": {...}, "data": "sha256:..."}

_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "s32",
          "uint32": "u32", "int8": "s8", "uint8": "u8", "bool": "pred", "int16": "s16",
          "uint16": "u16"}


def leaves(tree: Any) -> Dict[str, Any]:
    """{"a/b/c": leaf} over a tree's array leaves (the paths the record uses)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(key_name(k) for k in path): leaf for path, leaf in flat
            if hasattr(leaf, "dtype")}


def _words(x: jax.Array) -> jax.Array:
    """The elements' bit patterns as uint32 (same shape)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    width = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}.get(jnp.dtype(x.dtype).itemsize)
    if width is None:
        raise ValueError(f"no fingerprint for {x.dtype} arrays")
    return jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32)


def _mix(h, xp):
    """MurmurHash3's 32-bit finalizer (uint32 in, uint32 out; a bijection); `xp` is
    jax.numpy or numpy. In place for a numpy `h` (augmented assignments: a jax array is
    rebound instead), which the caller makes for it."""
    h ^= h >> 16
    h *= xp.uint32(0x85EBCA6B)
    h ^= h >> 13
    h *= xp.uint32(0xC2B2AE35)
    h ^= h >> 16
    return h


def _two_sums(w, index, xp):
    """(a, b) of the module docstring from the words w_i and their flat indices i (both
    uint32, same shape), in `xp`'s uint32 arithmetic (jax.numpy or numpy: mod 2^32)."""
    weight = index * xp.uint32(2) + xp.uint32(1)
    mixed = _mix(w ^ (index * xp.uint32(0x9E3779B9)), xp)
    return xp.sum(w * weight, dtype=xp.uint32), xp.sum(mixed, dtype=xp.uint32)


def checkpoint_fingerprints(x: jax.Array) -> jax.Array:
    """[a, b] (uint32) of one array on its devices (the program's name in the logs); no
    reshape, so no resharding."""
    index = jnp.zeros(x.shape, jnp.uint32)
    stride = 1
    for dim in reversed(range(x.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, dim) * jnp.uint32(
            stride % 2**32)
        stride *= x.shape[dim]
    return jnp.stack(_two_sums(_words(x), index, jnp))


HOST_ELEMENTS = 1 << 18
"""Arrays of at most this many elements whose bytes are in this process's memory (numpy,
or jax arrays on CPU devices, all of them in this process) are summed in numpy: no
program to compile, where compiling one costs more than summing them many times over."""


def _host_sums(x: Any) -> tuple:
    """(a, b) of one array in host memory, in numpy (1-d, so that numpy wraps without
    warnings)."""
    x = np.asarray(x).reshape(-1)
    if x.dtype == np.bool_:
        w = x.astype(np.uint32)
    else:
        width = {4: np.uint32, 2: np.uint16, 1: np.uint8}.get(x.dtype.itemsize)
        if width is None:
            raise ValueError(f"no fingerprint for {x.dtype} arrays")
        w = x.view(width).astype(np.uint32)
    a, b = _two_sums(w, np.arange(w.size, dtype=np.uint32), np)
    return int(a), int(b)


_device_sums = jax.jit(checkpoint_fingerprints)
"""Compiled once for each kind of array (shape, dtype, sharding) and called for each
array: T5 large's state is 2,236 arrays of 14 kinds. (One program holding every array's
sums took 7.3 s to compile on a CPU, and its peak memory was twice the state's.)"""


@functools.lru_cache(maxsize=None)
def _replicated_sums(mesh: jax.sharding.Mesh):
    """`_device_sums` with its two words replicated over `mesh`, so that every process
    reads them."""
    return jax.jit(checkpoint_fingerprints, out_shardings=jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec()))


def _label(x) -> str:
    name = jnp.dtype(x.dtype).name
    return f"{_SHORT.get(name, name)}[{','.join(str(d) for d in x.shape)}]"


def _sums_of(x: Any, host_elements: int):
    """[a, b] of one array: on the host (numpy) when it is in host memory and small, else
    where it lives (a numpy array too large: on the CPU device)."""
    if in_host_memory(x) and np.size(x) <= host_elements:
        return _host_sums(x)
    if isinstance(x, np.ndarray) or np.isscalar(x):
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            return _device_sums(jnp.asarray(x))
    mesh = getattr(x.sharding, "mesh", None)
    if isinstance(mesh, jax.sharding.Mesh):
        return _replicated_sums(mesh)(x)
    return _device_sums(x)


def array_fingerprints(tree: Any, host_elements: int = HOST_ELEMENTS) -> Dict[str, str]:
    """{path: "<dtype>[<shape>]:<a>:<b>"} for every array of `tree` (on devices, sharded
    or not, or numpy on the host), read back replicated so that every process records
    the same. An array of at most `host_elements` elements in host memory is summed in
    numpy (HOST_ELEMENTS); the others where they live, each kind of array by one
    compiled program. (Both give the same sums: the module docstring's.)"""
    named = leaves(tree)
    sums = jax.device_get([_sums_of(x, host_elements) for x in named.values()])
    return {path: f"{_label(a)}:{int(s[0]):08x}:{int(s[1]):08x}"
            for (path, a), s in zip(named.items(), sums)}


def first_damaged(recorded: Mapping[str, str], tree: Any, prefix: str = "") -> Optional[str]:
    """None when every array of `tree` (paths under `prefix` in the record) has its
    recorded fingerprint; else a clause naming the first that does not ("<path>: recorded
    <fp>, read <fp>"), or one the record lacks. Arrays the record holds but `tree` does
    not are not read here (a partial restore)."""
    now = array_fingerprints(tree)
    for path in sorted(now):
        key = prefix + path
        if key not in recorded:
            return f"{key}: not in the checkpoint's fingerprints (an array added on disk)"
        if recorded[key] != now[path]:
            return f"{key}: recorded {recorded[key]}, read {now[path]}"
    return None


def metadata_disagrees(recorded: Mapping[str, str], metadata: Any, prefix: str = ""
                       ) -> Optional[str]:
    """None when an item's Orbax metadata (`metadata`: its tree of shapes and dtypes, the
    record's paths under `prefix`) describes the arrays the record says were saved; else
    a clause naming the first it does not (the metadata file was changed on disk)."""
    described = {prefix + path: _label(m) for path, m in leaves(metadata).items()}
    saved = {k: v.rsplit(":", 2)[0] for k, v in recorded.items() if k.startswith(prefix)}
    for path in sorted(set(described) | set(saved)):
        if path not in saved:
            return f"its metadata names {path}, which was not saved"
        if path not in described:
            return f"its metadata lacks {path}, which was saved"
        if described[path] != saved[path]:
            return f"its metadata says {path} is {described[path]}, saved as {saved[path]}"
    return None


def metadata_damage(record: Optional[Mapping[str, Any]], metadata: Any, prefix: str = ""
                    ) -> Optional[str]:
    """What is wrong with a checkpoint before its arrays are read (None: nothing, or no
    record to check against): its record unreadable, or its Orbax metadata describing
    other arrays than the record says were saved (`metadata_disagrees`)."""
    if record is None:
        return None
    return record.get("unreadable") or metadata_disagrees(record["arrays"], metadata, prefix)


_NO_DATA = object()


def content_damage(record: Optional[Mapping[str, Any]], tree: Any, prefix: str = "",
                   data: Any = _NO_DATA) -> Optional[str]:
    """What is wrong with the arrays read (`tree`, under `prefix` in the record) and, when
    given, the data position read (None: nothing, or no record to check against)."""
    if record is None:
        return None
    damaged = record.get("unreadable") or first_damaged(record["arrays"], tree, prefix)
    if damaged is None and data is not _NO_DATA and record.get("data") not in (
            None, data_fingerprint(data)):
        damaged = "the data position (item data) differs from the one saved"
    return damaged


def data_fingerprint(value: Any) -> str:
    """"sha256:<hex>" of a JSON item's canonical text (sorted keys)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def bytes_fingerprint(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_record(step_dir) -> Optional[Dict[str, Any]]:
    """The record a checkpoint step holds ({"arrays": ..., "data": ...}; the file Orbax's
    JsonSave writes), None when it has none (saved before t5lite recorded them). A record
    that is not JSON is damage: {"unreadable": reason}."""
    f = step_dir / ITEM / "metadata"
    if not f.exists():
        return None
    try:
        record = json.loads(f.read_text())
    except (ValueError, OSError, UnicodeDecodeError) as e:
        return {"unreadable": f"{ITEM}/metadata is not JSON ({type(e).__name__})"}
    if not isinstance(record, dict) or not isinstance(record.get("arrays"), dict) or any(
            not isinstance(v, str) or not re.fullmatch(r"\S+\[[\d,]*\]:[0-9a-f]{8}:[0-9a-f]{8}", v)
            for v in record["arrays"].values()):
        return {"unreadable": f"{ITEM}/metadata does not hold fingerprints"}
    return record
