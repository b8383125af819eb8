"""Checkpoints that prove their bytes (issue 47, part 1): the fingerprint catches every
changed bit and a swap (against a numpy reference); a tiny T5 run's checkpoint damaged on
disk in each kind of file (OCDBT data that still decodes and a frame that does not, its
manifest, the tree metadata, the data position, the fingerprint record, the data
iterator's bytes) is found by `info --verify`, skipped at the next start with one warning line naming it (the run resumes from the one before),
and refused in one line by INITIAL_CHECKPOINT_PATH, eval / infer's session and convert."""
from __future__ import annotations

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_helpers as th
from t5lite import convert, info, train
from t5lite.data.files.compressed import ZSTD_MAGIC
from t5lite.errors import CheckpointDamagedError
from t5lite.formats import fingerprints


# ----------------------------------------------------------------------------- the sums
def _reference(x: np.ndarray):
    """The two sums in numpy (uint64 arithmetic, reduced mod 2^32 by hand)."""
    m = 2**32 - 1
    w = (x.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[x.dtype.itemsize])
         .astype(np.uint64).ravel())
    i = np.arange(w.size, dtype=np.uint64)
    h = w ^ ((i * 0x9E3779B9) & m)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    h ^= h >> 16
    return int((w * (2 * i + 1)).sum() % 2**32), int(h.sum() % 2**32)


def test_the_fingerprint_is_the_two_sums_and_sees_every_bit_and_a_swap():
    rng = np.random.default_rng(0)
    tree = {"f32": rng.normal(size=(8, 5, 3)).astype(np.float32),
            "bf16": np.asarray(jnp.asarray(rng.normal(size=(6, 7)), jnp.bfloat16)),
            "s32": rng.integers(-9, 9, size=(11,)).astype(np.int32),
            "pred": rng.random(5) > 0.5, "scalar": np.float32(3.5)}
    record = fingerprints.array_fingerprints(tree)
    assert record["f32"] == "f32[8,5,3]:%08x:%08x" % _reference(tree["f32"])
    assert record["bf16"] == "bf16[6,7]:%08x:%08x" % _reference(tree["bf16"])
    assert record["scalar"].startswith("f32[]:")
    on_device = fingerprints.array_fingerprints(jax.tree.map(jnp.asarray, tree))
    assert on_device == record and fingerprints.first_damaged(record, tree) is None
    words = tree["f32"].view(np.uint32).reshape(-1)
    for index in (0, 57, words.size - 1):  # every bit of a few elements
        for bit in range(32):
            changed = tree["f32"].copy()
            changed.view(np.uint32).reshape(-1)[index] ^= np.uint32(1 << bit)
            said = fingerprints.first_damaged(record, {**tree, "f32": changed})
            assert said is not None and said.startswith("f32: recorded f32[8,5,3]:"), (index, bit)
    swapped = tree["s32"].copy()
    swapped[[2, 7]] = swapped[[7, 2]]
    assert swapped[2] != swapped[7]
    assert fingerprints.first_damaged(record, {**tree, "s32": swapped}) is not None
    signs = tree["f32"].copy().reshape(-1)  # x and -x swapped: 2^31 apart in their bits
    signs[4], signs[9] = 1.5, -1.5
    signed = fingerprints.array_fingerprints({"f32": signs})
    signs[4], signs[9] = -1.5, 1.5
    assert fingerprints.first_damaged(signed, {"f32": signs}) is not None
    reshaped = {**tree, "f32": tree["f32"].reshape(8, 15)}
    assert "read f32[8,15]" in fingerprints.first_damaged(record, reshaped)
    assert "not in the checkpoint's fingerprints" in fingerprints.first_damaged(
        record, {**tree, "new": np.zeros(2, np.float32)})


def test_on_devices_the_sums_are_one_program_per_kind_of_array_and_agree_with_numpy():
    """Where the arrays live (host_elements=0: none summed in numpy), one program is
    compiled for each kind of array (shape, dtype, sharding: T5 large's 2,236 arrays are
    14 kinds; docs/performance.md) and called for each array, each with its own value;
    the words are numpy's, on one device and sharded over eight, and the numpy path's
    (the default for small arrays in host memory)."""
    from jax.sharding import NamedSharding, PartitionSpec
    rng = np.random.default_rng(1)
    kinds = [((4, 8), np.float32)] * 5 + [((7,), jnp.bfloat16)] * 3 + [((), np.int32)] * 2
    tree = {f"x{i}": np.asarray(jnp.asarray(rng.normal(size=shape) * 50, dtype))
            for i, (shape, dtype) in enumerate(kinds)}
    tree["pred"] = rng.random(6) > 0.5
    tree["u8"] = rng.integers(0, 255, size=(3, 5)).astype(np.uint8)
    on_host = fingerprints.array_fingerprints(tree)
    for name in ("x0", "x5", "x9", "u8"):
        assert on_host[name].endswith(":%08x:%08x" % _reference(tree[name])), name
    before = fingerprints._device_sums._cache_size()
    on_device = fingerprints.array_fingerprints(jax.tree.map(jnp.asarray, tree),
                                                host_elements=0)
    assert fingerprints._device_sums._cache_size() - before == 5  # kinds, not arrays
    assert on_device == on_host
    assert len({on_host[f"x{i}"] for i in range(5)}) == 5
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    sharded = {"x0": jax.device_put(tree["x0"], NamedSharding(mesh, PartitionSpec("a", "b"))),
               "u8": jax.device_put(tree["u8"], NamedSharding(mesh, PartitionSpec()))}
    assert fingerprints.array_fingerprints(sharded, host_elements=0) == {
        k: on_host[k] for k in sharded}
    assert fingerprints.array_fingerprints(sharded) == {k: on_host[k] for k in sharded}


def test_the_data_iterators_bytes_carry_their_sum(tmp_path, monkeypatch):
    from etils import epath
    from t5lite.runtime.checkpointing import data_iterator_item as item
    handler = item.DataIteratorHandler()
    directory = epath.Path(tmp_path / "7" / item.ITEM)
    directory.mkdir(parents=True)
    saved = b"tf.data state \x00\x01" * 50
    handler.save(directory, item.DataIteratorSave({"count": 1, "states": {0: saved}}))
    assert handler.restore(directory)["states"] == {0: saved}
    path = directory / item.file_name(0, 1)
    data = bytearray(path.read_bytes())
    data[100] ^= 0x10  # still bytes tf.data may well read
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamagedError) as e:
        handler.restore(directory)
    assert str(e.value) == (f"checkpoint 7 is damaged: {item.ITEM}/{path.name}: its bytes are "
                            f"not the ones saved (SHA-256)")
    (directory / f"{path.name}{item.SUM_SUFFIX}").unlink()  # saved before the sums: unchecked
    assert handler.restore(directory)["states"] == {0: bytes(data)}


# ----------------------------------------------------------------------------- a run
# The tiny T5 cut to one layer a side and a 512-entry vocabulary (the synthetic task draws
# its tokens below it): every command that reads the checkpoint is given the same.
SMALL = ["T5Config.vocab_size = 512", "T5Config.num_encoder_layers = 1",
         "T5Config.num_decoder_layers = 1"]
SMALL_FLAGS = ["--gin." + binding.replace(" ", "") for binding in SMALL]
COMMON = [f"--gin_file={th.SYNTHETIC}", "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
          *SMALL_FLAGS, "--gin.LOG_PERIOD=1", "--gin.CHECKPOINT_PERIOD=2", "--gin.KEEP_CHECKPOINTS=None",
          "--gin.RANDOM_SEED=0", "--gin.ACTIVATION_DTYPE='float32'", th.SYNC_CHECKPOINTS]


def _train(run, steps, *extra):
    return train.main([f"--gin_file={th.MODEL_FILES['t5']}"] + COMMON + [
        f'--gin.MODEL_DIR="{run}"', f"--gin.TRAIN_STEPS={steps}", *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny T5 (SMALL) trained to step 4, checkpoints 2 and 4."""
    path = tmp_path_factory.mktemp("fingerprinted") / "run"
    assert _train(path, 4) == 0
    assert th.complete_steps(path) == [2, 4]
    return path


def _stored_chunks(step):
    """(data file, offset, length, array) of each chunk stored in a data file, read from the
    step's OCDBT b-tree: which data file holds which array varies from save to save."""
    import tensorstore as ts
    state = step / "state"
    kv = ts.KvStore.open({"driver": "file", "path": f"{state}/"}).result()
    root = ts.ocdbt.dump(kv).result()["versions"][0]["root"]["location"]
    for entry in ts.ocdbt.dump(kv, root).result()["entries"]:
        where = entry.get("indirect_value", "")
        if where:
            directory, name, offset, length = where[len("value:"):].split(":")
            yield (state / directory.rstrip("/") / name, int(offset), int(length),
                   entry["key"].decode().rsplit("/", 1)[0])


def _zstd_blocks(frame: bytes):
    """(type, start, size) of each block of one zstd frame (RFC 8878, 3.1.1; it starts
    with ZSTD_MAGIC); type 2 is a compressed block, whose middle lies far from every
    header."""
    descriptor = frame[4]
    single = descriptor >> 5 & 1
    at = 5 + (not single) + (0, 1, 2, 4)[descriptor & 3] + (single, 2, 4, 8)[descriptor >> 6]
    while at + 3 <= len(frame):
        header = int.from_bytes(frame[at:at + 3], "little")
        kind, size = header >> 1 & 3, header >> 3
        yield kind, at + 3, size
        at += 3 + (1 if kind == 1 else size)
        if header & 1:
            return


def _read(step, array):
    import tensorstore as ts
    return ts.open({"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": f"file://{step}/state/",
                                                  "path": f"{array}/"}}).result().read().result()


def _invert_still_decoding(step, chunks):
    """Inverts 64 bytes in the middle of a compressed block of the first of `chunks` whose
    array still decodes afterwards, to other values: damage only a fingerprint can see.
    Where 64 bytes land decides whether zstd sees them too (a header does; CI once hit one
    in the middle of a file), so the decoder says which place qualifies."""
    for path, offset, length, array in chunks:
        frame = path.read_bytes()[offset:offset + length]
        if not frame.startswith(ZSTD_MAGIC):
            continue
        blocks = [b for b in _zstd_blocks(frame) if b[0] == 2 and b[2] >= 1024]
        before = _read(step, array) if blocks else None
        for _, start, size in sorted(blocks, key=lambda b: abs(2 * b[1] + b[2] - length))[:3]:
            at = offset + start + size // 2 - 32
            _invert(path, at)
            try:
                if not np.array_equal(_read(step, array).view(np.uint8), before.view(np.uint8)):
                    return
            except ValueError:  # zstd saw it
                pass
            _invert(path, at)  # inverted twice: as saved
    raise AssertionError(f"no chunk of {step} still decodes with 64 bytes inverted")


def _damage_mid_file(step):
    """The issue's damage: 64 bytes inverted in the middle of the largest data file, in
    the chunk nearest that middle that still decodes."""
    chunks = list(_stored_chunks(step))
    largest = max({c[0] for c in chunks}, key=lambda f: f.stat().st_size)
    size = largest.stat().st_size  # a chunk's middle, doubled, against the file's size
    _invert_still_decoding(step, sorted((c for c in chunks if c[0] == largest),
                                        key=lambda c: abs(2 * c[1] + c[2] - size)))


def _damage_params(step):
    """The same in the largest chunk of a parameter (not of the optimizer state): what
    every command reads, where the largest file may hold no parameter."""
    _invert_still_decoding(step, sorted((c for c in _stored_chunks(step)
                                         if c[3].startswith("params.params.")),
                                        key=lambda c: -c[2]))


def _break_a_frame(step):
    """64 bytes inverted at the start of the largest chunk: its zstd frame does not decode."""
    path, offset, _, _ = max(_stored_chunks(step), key=lambda c: c[2])
    _invert(path, offset)


def _invert(path, start=None, count=64):
    data = bytearray(path.read_bytes())
    start = len(data) // 2 if start is None else start
    for i in range(start, min(start + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _rename_in_tree_metadata(step):
    path = step / "state" / "_METADATA"
    meta = json.loads(path.read_text())
    tree = meta["tree_metadata"]
    key = next(k for k in tree if "'query'" in k and "'params'" in k)
    entry = tree.pop(key)
    entry["key_metadata"][-1]["key"] = "kernel_"
    tree[key.replace("'kernel'", "'kernel_'")] = entry
    path.write_text(json.dumps(meta))


def _change_a_recorded_sum(step):
    path = step / fingerprints.ITEM / "metadata"
    record = json.loads(path.read_text())
    key = sorted(record["arrays"])[0]
    value = record["arrays"][key]
    record["arrays"][key] = value[:-1] + ("0" if value[-1] != "0" else "1")
    path.write_text(json.dumps(record))


DAMAGE = {  # what is done to checkpoint 4, and what `info --verify` says of it
    "ocdbt data": (_damage_mid_file, "DAMAGED: "),
    "ocdbt frame": (_break_a_frame, "DAMAGED: unreadable"),
    "manifest": (lambda s: _invert(s / "state" / "manifest.ocdbt", count=1),
                 "DAMAGED: unreadable"),
    "tree metadata": (_rename_in_tree_metadata, "DAMAGED: unreadable"),
    "data position": (lambda s: (s / "data" / "metadata").write_text('{"step": 3}'),
                      "DAMAGED: the data position (item data) differs from the one saved"),
    "fingerprint record": (_change_a_recorded_sum, "DAMAGED: "),
    "record not json": (lambda s: (s / fingerprints.ITEM / "metadata").write_text("{"),
                        "DAMAGED: fingerprints/metadata is not JSON"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_verify_finds_each_kind_of_damage(run, tmp_path, capsys, kind):
    damaged = tmp_path / "run"
    shutil.copytree(run, damaged)
    damage, said = DAMAGE[kind]
    damage(th.checkpoints_dir(damaged) / "4")
    capsys.readouterr()
    assert info.main([f"--verify={damaged}"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("checkpoint 2: ok (") and len(lines) == 2, lines
    assert lines[1].startswith("checkpoint 4: " + said), lines
    if kind == "ocdbt data":  # the bytes: 64 inverted mid-file, still decoding
        assert " recorded " in lines[1] and ", read " in lines[1], lines


@pytest.mark.parametrize("kind", ["ocdbt data", "ocdbt frame", "data position"])
def test_a_damaged_checkpoint_is_skipped_at_the_next_start(run, tmp_path, capsys, kind):
    damaged = tmp_path / "run"
    shutil.copytree(run, damaged)
    DAMAGE[kind][0](th.checkpoints_dir(damaged) / "4")
    capsys.readouterr()
    assert _train(damaged, 5) == 0
    err = capsys.readouterr().err
    warned = [l for l in err.splitlines() if "skipped damaged checkpoint 4" in l]
    assert len(warned) == 1 and "start: resume:2 at step 2" in err, err[-3000:]
    if kind == "ocdbt data":
        assert ": recorded " in warned[0] and "(its bytes changed on disk" in warned[0]
    if kind == "ocdbt frame":  # the array (its dotted name: "opt_state.1.v.decoder...")
        # and zstd's own words, not a path or a spec
        assert re.search(r'Error reading "[a-z0-9_.]+/[0-9.]+": ZSTD_decompressStream\(\) failed: '
                         r"\w", warned[0]) and "OCDBT database" not in warned[0], warned[0]
    assert th.complete_steps(damaged) == [2, 4, 5]
    assert any(p.name.startswith("4.damaged-") for p in th.checkpoints_dir(damaged).iterdir())


def test_every_command_refuses_a_damaged_checkpoint_in_one_line(run, tmp_path, capsys):
    from t5lite.config import parsing
    from t5lite.inference import session
    from t5lite.runtime.partitioning import MeshSettings
    damaged = tmp_path / "run"
    shutil.copytree(run, damaged)
    step = th.checkpoints_dir(damaged) / "4"
    _damage_params(step)  # what every command reads (the largest file may hold no parameter)
    capsys.readouterr()
    assert _train(tmp_path / "new", 5, f'--gin.INITIAL_CHECKPOINT_PATH="{step}"') == 1
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and f"INITIAL_CHECKPOINT_PATH {step} is damaged: " in lines[0], lines
    assert f"python -m t5lite.info --verify {damaged}" in lines[0], lines
    out = tmp_path / "hf"
    assert convert.main(["--to=hf", f"--input={step}", f"--output={out}",
                         f"--gin_file={th.MODEL_FILES['t5']}", *SMALL_FLAGS]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if l]
    assert len(lines) == 1 and f"--input {step} is damaged: " in lines[0], lines
    assert not out.exists() or not any(out.iterdir())
    parsing.parse_gin([th.MODEL_FILES["t5"]], ["ACTIVATION_DTYPE = 'float32'", *SMALL])
    model = parsing.resolve_macro("MODEL")
    with pytest.raises(CheckpointDamagedError) as e:  # what eval and infer load through
        session.load_session(model, str(step), batch_size=8,
                             feature_lengths={"inputs": 16, "targets": 8},
                             mesh=MeshSettings.data_parallel())
    assert str(e.value).startswith(f"CHECKPOINT_PATH {step} is damaged: ")
    session.load_session(model, str(th.checkpoints_dir(damaged) / "2"), batch_size=8,
                         feature_lengths={"inputs": 16, "targets": 8},
                         mesh=MeshSettings.data_parallel())  # the whole one loads
