"""Reading T5X checkpoints in T5X's own layout (issue 27, part 1). The fixtures are written
here in that layout: a flax msgpack `checkpoint` file, zarr v2 arrays beside it, one of
them by hand (gzip chunks, bfloat16, a padded edge chunk) and one through TensorStore, as
T5X writes them."""
import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from flax import serialization

from t5lite.errors import CheckpointDamagedError, ConfigError
from t5lite.formats import t5x_checkpoint

from t5x_helpers import spec as _spec, t5x_tree_from_hf  # noqa: E402
from t5x_helpers import write_zarr_by_hand as _write_zarr_by_hand  # noqa: E402
from t5x_helpers import write_zarr_with_tensorstore as _write_zarr_with_tensorstore  # noqa: E402

BF16 = ml_dtypes.bfloat16


@pytest.fixture()
def t5x_ckpt(tmp_path):
    """(msgpack_serialize, as T5X's registered TensorStore specs leave lists as lists.)
    A small T5 v1.1-shaped state: embedding (hand-written zarr, bf16), a query kernel
    (TensorStore zarr, float32), an inline relpos table and Adafactor state."""
    rng = np.random.default_rng(0)
    values = {
        "embedding": rng.normal(size=(5, 4)).astype(BF16),
        "query": rng.normal(size=(4, 6)).astype(np.float32),
        "rel_embedding": rng.normal(size=(2, 8)).astype(np.float32),
        "v_row": rng.random(4).astype(np.float32),
        "v_col": rng.random(6).astype(np.float32),
    }
    ckpt = tmp_path / "checkpoint_7"
    _write_zarr_by_hand(ckpt / "target.token_embedder.embedding", values["embedding"], (3, 4),
                        "bfloat16")
    _write_zarr_with_tensorstore(ckpt / "target.encoder.layers_0.attention.query.kernel",
                                 values["query"], (2, 6))
    placeholder = np.zeros((1,), np.float32)
    state = {
        "version": 3,
        "optimizer": {
            "target": {
                "token_embedder": {"embedding": _spec("target.token_embedder.embedding",
                                                      "bfloat16", (5, 4), (3, 4))},
                "encoder": {
                    "relpos_bias": {"rel_embedding": values["rel_embedding"]},
                    "layers_0": {"attention": {"query": {"kernel": _spec(
                        "target.encoder.layers_0.attention.query.kernel", "float32", (4, 6),
                        (2, 6))}}}}},
            "state": {
                "step": np.int32(7),
                "param_states": {"encoder": {"layers_0": {"attention": {"query": {"kernel": {
                    "m": placeholder, "v": placeholder, "v_row": values["v_row"],
                    "v_col": values["v_col"]}}}}}}}}}
    ckpt.mkdir(exist_ok=True)
    (ckpt / "checkpoint").write_bytes(serialization.msgpack_serialize(state))
    return ckpt, values


def test_reads_every_leaf_with_its_dtype(t5x_ckpt):
    ckpt, values = t5x_ckpt
    tree = t5x_checkpoint.read_checkpoint(ckpt)
    target = tree["target"]
    embedding = target["token_embedder"]["embedding"]
    assert embedding.dtype == BF16 and embedding.shape == (5, 4)
    np.testing.assert_array_equal(embedding.view(np.uint16), values["embedding"].view(np.uint16))
    query = target["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    assert query.dtype == np.float32
    np.testing.assert_array_equal(query, values["query"])
    np.testing.assert_array_equal(target["encoder"]["relpos_bias"]["rel_embedding"],
                                  values["rel_embedding"])
    state = tree["state"]
    assert int(state["step"]) == 7 and state["step"].dtype == np.int32
    adafactor = state["param_states"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    np.testing.assert_array_equal(adafactor["v_row"], values["v_row"])
    np.testing.assert_array_equal(adafactor["v_col"], values["v_col"])
    assert adafactor["v"].shape == (1,) and adafactor["m"].shape == (1,)
    # the checkpoint file itself is accepted too
    again = t5x_checkpoint.read_checkpoint(ckpt / "checkpoint")
    np.testing.assert_array_equal(again["target"]["encoder"]["layers_0"]["attention"]["query"]
                                  ["kernel"], values["query"])


def test_reads_the_orbax_layout_alike(t5x_ckpt, tmp_path):
    """T5X's Orbax layout (train.use_orbax=True) gives the same tree as its own layout;
    t5lite's own Orbax checkpoints are not taken for T5X's; a damaged one is one line."""
    import orbax.checkpoint as ocp
    from t5x_helpers import write_t5x_orbax_checkpoint
    ckpt, values = t5x_ckpt
    legacy = t5x_checkpoint.read_checkpoint(ckpt)
    orbax = write_t5x_orbax_checkpoint(tmp_path / "orbax_run", legacy["target"], step=7,
                                       param_states=legacy["state"]["param_states"])
    for path in (orbax, orbax / "state"):
        assert t5x_checkpoint.is_t5x_checkpoint(path)
        assert t5x_checkpoint.read_step(path) == 7
        tree = t5x_checkpoint.read_checkpoint(path)
        jax_tree = __import__("jax").tree
        assert jax_tree.structure(tree["target"]) == jax_tree.structure(legacy["target"])
        jax_tree.map(lambda a, b: (a.dtype == b.dtype) and np.testing.assert_array_equal(
            np.asarray(a, np.float32), np.asarray(b, np.float32)), tree, legacy)
    assert tree["target"]["token_embedder"]["embedding"].dtype == BF16
    assert not t5x_checkpoint.is_t5x_checkpoint(tmp_path / "orbax_run")  # the MODEL_DIR

    ours = tmp_path / "t5lite_run" / "checkpoints" / "5" / "state"
    with ocp.PyTreeCheckpointer() as writer:
        writer.save(ours, {"step": np.int32(5), "params": {"params": {"w": np.ones(3)}},
                           "opt_state": [np.zeros(3)]})
    for path in (ours, ours.parent, ours.parent.parent.parent):
        assert not t5x_checkpoint.is_t5x_checkpoint(path)

    shutil.rmtree(orbax / "state" / "ocdbt.process_0")
    shutil.rmtree(orbax / "state" / "d", ignore_errors=True)
    with pytest.raises(CheckpointDamagedError) as e:
        t5x_checkpoint.read_checkpoint(orbax)
    assert str(orbax) in _one_line(e)


def test_version_2_bfloat16_bits_read_back_as_bfloat16(tmp_path):
    bits = np.arange(12, dtype=np.float32).reshape(3, 4).astype(BF16)
    ckpt = tmp_path / "checkpoint_1"
    _write_zarr_by_hand(ckpt / "target.w", bits.view(np.uint16), (2, 4), "<u2")
    (ckpt / "checkpoint").write_bytes(serialization.msgpack_serialize(
        {"version": 2, "optimizer": {"target": {"w": _spec("target.w", "uint16", (3, 4), (2, 4)),
                                                "b": bits[0].view(np.uint16)},
                                     "state": {"step": np.int32(1), "param_states": {}}}}))
    tree = t5x_checkpoint.read_checkpoint(ckpt)
    assert tree["target"]["w"].dtype == BF16 and tree["target"]["b"].dtype == BF16
    np.testing.assert_array_equal(tree["target"]["w"].astype(np.float32), bits.astype(np.float32))


def test_tells_t5x_checkpoints_apart(t5x_ckpt, tmp_path):
    ckpt, _ = t5x_ckpt
    assert t5x_checkpoint.is_t5x_checkpoint(ckpt)
    assert t5x_checkpoint.is_t5x_checkpoint(ckpt / "checkpoint")
    assert not t5x_checkpoint.is_t5x_checkpoint(tmp_path / "nothing")
    other = tmp_path / "t5lite_run" / "checkpoints" / "10"
    other.mkdir(parents=True)
    assert not t5x_checkpoint.is_t5x_checkpoint(other.parent.parent)


def _one_line(error):
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_bad_input_is_one_line_naming_the_path_or_parameter(t5x_ckpt, tmp_path):
    ckpt, _ = t5x_ckpt
    with pytest.raises(ConfigError) as e:  # not a checkpoint directory
        t5x_checkpoint.read_checkpoint(tmp_path)
    assert str(tmp_path) in _one_line(e) and "checkpoint_<step>" in str(e.value)

    orbax = tmp_path / "orbax_7"  # an Orbax aggregate file beside a tree that is not T5X's
    shutil.copytree(ckpt, orbax)
    (orbax / "_METADATA").write_text("{}")
    with pytest.raises(ConfigError, match="not T5X's") as e:
        t5x_checkpoint.read_checkpoint(orbax)
    _one_line(e)
    assert not t5x_checkpoint.is_t5x_checkpoint(orbax)

    missing = tmp_path / "missing_7"
    shutil.copytree(ckpt, missing)
    shutil.rmtree(missing / "target.encoder.layers_0.attention.query.kernel")
    with pytest.raises(CheckpointDamagedError) as e:
        t5x_checkpoint.read_checkpoint(missing)
    assert "encoder/layers_0/attention/query/kernel" in _one_line(e)

    chunk = tmp_path / "chunk_7"
    shutil.copytree(ckpt, chunk)
    (chunk / "target.token_embedder.embedding" / "1.0").write_bytes(b"not gzip")
    with pytest.raises(CheckpointDamagedError) as e:
        t5x_checkpoint.read_checkpoint(chunk)
    assert "token_embedder/embedding" in _one_line(e)

    shape = tmp_path / "shape_7"
    shutil.copytree(ckpt, shape)
    zarray = shape / "target.token_embedder.embedding" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["shape"] = [6, 4]
    zarray.write_text(json.dumps(meta))
    with pytest.raises(CheckpointDamagedError, match=r"\[6, 4\] on disk but \[5, 4\]") as e:
        t5x_checkpoint.read_checkpoint(shape)
    _one_line(e)

    garbage = tmp_path / "garbage_7"
    garbage.mkdir()
    (garbage / "checkpoint").write_bytes(b"\xc1\xc1 not msgpack")
    with pytest.raises(CheckpointDamagedError) as e:
        t5x_checkpoint.read_checkpoint(garbage)
    assert str(garbage) in _one_line(e)

    for version, content in ((1, {"version": 1, "optimizer": {}}),
                             (0, {"target": {"w": np.zeros(2, np.float32)}})):
        old = tmp_path / f"v{version}"
        old.mkdir()
        (old / "checkpoint").write_bytes(serialization.msgpack_serialize(content))
        with pytest.raises(ConfigError) as e:
            t5x_checkpoint.read_checkpoint(old)
        assert str(old) in _one_line(e)


# --------------------------------------------------------------- the parameter tree


def test_t5x_tree_maps_onto_the_model_hugging_face_imports(hf_t5, tmp_path):
    """A T5X v1.1 checkpoint of the same weights gives exactly the parameters the Hugging
    Face import gives (whose logits match transformers', tests/test_hf.py)."""
    from t5lite.interop import hf
    from t5lite.formats import t5x_params
    transformers = pytest.importorskip("transformers")
    model, variables = hf.load_pretrained(hf_t5, dtype="float32")
    state = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_t5)).state_dict()
    target = t5x_tree_from_hf(state, num_layers=2)
    ckpt = tmp_path / "checkpoint_100"
    query = target["encoder"]["layers_1"]["attention"]["query"]["kernel"]
    _write_zarr_with_tensorstore(ckpt / "target.encoder.layers_1.attention.query.kernel", query,
                                 (16, 32))
    target["encoder"]["layers_1"]["attention"]["query"]["kernel"] = _spec(
        "target.encoder.layers_1.attention.query.kernel", "float32", query.shape, (16, 32))
    (ckpt / "checkpoint").write_bytes(serialization.msgpack_serialize(
        {"version": 3, "optimizer": {"target": target,
                                     "state": {"step": np.int32(100), "param_states": {}}}}))
    params = t5x_params.params_from_t5x(t5x_checkpoint.read_checkpoint(ckpt)["target"], model)
    import jax
    got = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
    want = {jax.tree_util.keystr(p): x
            for p, x in jax.tree_util.tree_leaves_with_path(variables["params"])}
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], np.asarray(want[name]), err_msg=name)

    # another network, a missing parameter, a wrong size: one line naming the parameter
    from t5lite.errors import CheckpointMismatchError
    bad = t5x_tree_from_hf(state, num_layers=2)
    bad["encoder"]["layers_0"]["mlp"]["wi"] = bad["encoder"]["layers_0"]["mlp"].pop("wi_0")
    with pytest.raises(CheckpointMismatchError, match="'encoder/layers_0/mlp/wi/kernel'") as e:
        t5x_params.params_from_t5x(bad, model)
    _one_line(e)
    bad = t5x_tree_from_hf(state, num_layers=2)
    del bad["decoder"]["logits_dense"]
    with pytest.raises(CheckpointMismatchError, match="lacks parameter 'decoder/logits_dense"):
        t5x_params.params_from_t5x(bad, model)
    bad = t5x_tree_from_hf(state, num_layers=2)
    bad["decoder"]["decoder_norm"]["scale"] = np.ones(33, np.float32)
    with pytest.raises(CheckpointMismatchError, match=r"decoder_norm/scale' has shape \[33\]"):
        t5x_params.params_from_t5x(bad, model)


# --------------------------------------------------------------- data not all there


def _copy(ckpt, tmp_path, name):
    out = tmp_path / name
    shutil.copytree(ckpt, out)
    return out


QUERY = "target.encoder.layers_0.attention.query.kernel"
EMBEDDING = "target.token_embedder.embedding"


def test_a_lost_chunk_is_refused_naming_the_parameter_and_the_chunk(t5x_ckpt, tmp_path):
    """TensorStore reads an absent chunk as the fill value: a chunk file deleted, emptied
    or cut short is one line naming the parameter (T5X's and t5lite's name) and the chunk,
    never zeros."""
    ckpt, _ = t5x_ckpt
    deleted = _copy(ckpt, tmp_path, "deleted_7")  # the query kernel: a 2 x 1 grid
    (deleted / QUERY / "0.0").unlink()
    with pytest.raises(CheckpointDamagedError) as e:
        t5x_checkpoint.read_checkpoint(deleted)
    line = _one_line(e)
    for part in (str(deleted), "'target/encoder/layers_0/attention/query/kernel'",
                 "params/encoder/layers_0/attention/query/kernel", "no chunk 0.0",
                 f"in {QUERY}/", "1 of its 2 x 1 = 2 chunks missing", "copy"):
        assert part in line, (part, line)

    both = _copy(ckpt, tmp_path, "both_7")  # the hand-written embedding, every chunk gone
    (both / EMBEDDING / "0.0").unlink()
    (both / EMBEDDING / "1.0").unlink()
    with pytest.raises(CheckpointDamagedError, match=r"embedding'.*no chunk 0\.0 .*"
                       r"2 of its 2 x 1 = 2 chunks missing: 0\.0, 1\.0"):
        t5x_checkpoint.read_checkpoint(both)

    empty = _copy(ckpt, tmp_path, "empty_7")  # a chunk of zero bytes
    (empty / QUERY / "1.0").write_bytes(b"")
    with pytest.raises(CheckpointDamagedError, match=r"chunk 1\.0 of parameter "
                       r"'target/encoder/layers_0/attention/query/kernel'.* is empty \(0 bytes"):
        t5x_checkpoint.read_checkpoint(empty)

    # the steps and nothing else of the same checkpoints still read without their arrays
    assert t5x_checkpoint.read_step(deleted) == 7 == t5x_checkpoint.read_step(empty)


def test_tensorstore_itself_refuses_an_absent_chunk(t5x_ckpt, tmp_path, monkeypatch):
    """Without the grid check (a chunk lost between the check and the read) TensorStore
    reads with fill_missing_data_reads=False: still one line naming the chunk."""
    ckpt, _ = t5x_ckpt
    monkeypatch.setattr(t5x_checkpoint, "_check_chunks", lambda *a: None)
    lost = _copy(ckpt, tmp_path, "lost_7")
    (lost / QUERY / "1.0").unlink()
    with pytest.raises(CheckpointDamagedError, match=r"query/kernel'.*has no chunk 1\.0") as e:
        t5x_checkpoint.read_checkpoint(lost)
    _one_line(e)


def test_chunk_grids_of_every_layout_are_checked(tmp_path):
    """'/'-separated keys, uncompressed chunks (their exact size), a 0-d array; and the
    premise of refusing every absent chunk: written as T5X writes (no fill_value), an
    all-zero array keeps every chunk file."""
    import tensorstore as ts
    value = np.arange(24, dtype=np.float32).reshape(4, 6)

    def write(name, **metadata):
        store = ts.open({"driver": "zarr", "kvstore": {"driver": "file",
                                                       "path": f"{tmp_path / name}/"},
                         "metadata": {"shape": list(value.shape), "chunks": [2, 3],
                                      "dtype": "<f4", **metadata}}, create=True).result()
        store.write(value if name != "zeros" else np.zeros_like(value)).result()
        return _spec(name, "float32", value.shape, (2, 3))

    target = {"nested": write("nested", dimension_separator="/", compressor={"id": "zstd"}),
              "raw": write("raw", compressor=None),
              "zeros": write("zeros", compressor={"id": "gzip"})}
    (tmp_path / "checkpoint").write_bytes(serialization.msgpack_serialize(
        {"version": 3, "optimizer": {"target": target, "state": {"step": np.int32(1)}}}))
    assert json.loads((tmp_path / "zeros" / ".zarray").read_text())["fill_value"] is None
    assert sorted(p.name for p in (tmp_path / "zeros").iterdir()) == [
        ".zarray", "0.0", "0.1", "1.0", "1.1"]
    tree = t5x_checkpoint.read_checkpoint(tmp_path)["target"]
    np.testing.assert_array_equal(tree["nested"], value)
    np.testing.assert_array_equal(tree["raw"], value)
    assert t5x_checkpoint.chunk_keys({"shape": [], "chunks": []}) == ["0"]
    assert t5x_checkpoint.chunk_keys({"shape": [0, 3], "chunks": [2, 3]}) == []

    (tmp_path / "nested" / "1" / "1").unlink()
    with pytest.raises(CheckpointDamagedError,
                       match=r"'target/nested' .*has no chunk 1/1 in nested/ \(1 of its 2 x 2 = 4"):
        t5x_checkpoint.read_checkpoint(tmp_path)
    shutil.rmtree(tmp_path / "nested")
    (tmp_path / "checkpoint").write_bytes(serialization.msgpack_serialize(
        {"version": 3, "optimizer": {"target": {"raw": target["raw"]}, "state": {}}}))
    chunk = tmp_path / "raw" / "0.1"
    chunk.write_bytes(chunk.read_bytes()[:10])
    with pytest.raises(CheckpointDamagedError, match=r"chunk 0\.1 of parameter 'target/raw' "
                       r".*in raw/ has 10 bytes where an uncompressed chunk has 24"):
        t5x_checkpoint.read_checkpoint(tmp_path)
    (tmp_path / "raw" / ".zarray").write_text('{"shape": [4, 6]}')
    with pytest.raises(CheckpointDamagedError, match=r"raw/\.zarray\) is not zarr v2") as e:
        t5x_checkpoint.read_checkpoint(tmp_path)
    _one_line(e)


def test_the_orbax_layout_refuses_a_chunk_its_database_lacks(t5x_ckpt, tmp_path):
    """T5X's Orbax layout keeps chunks as OCDBT keys; one the database lacks (Orbax reads
    with fill_missing_data_reads=False) is the same one line."""
    import tensorstore as ts
    from t5x_helpers import write_t5x_orbax_checkpoint
    ckpt, _ = t5x_ckpt
    legacy = t5x_checkpoint.read_checkpoint(ckpt)
    orbax = write_t5x_orbax_checkpoint(tmp_path / "orbax_run", legacy["target"], step=7)
    store = ts.KvStore.open({"driver": "ocdbt",
                             "base": f"file://{orbax / 'state'}/"}).result()
    key = f"{QUERY}/0.0".encode()
    assert key in store.list().result()
    store.delete_range(ts.KvStore.KeyRange(key, key + b"\0")).result()
    with pytest.raises(CheckpointDamagedError) as e:
        t5x_checkpoint.read_checkpoint(orbax)
    line = _one_line(e)
    for part in (str(orbax), "missing data", "'target/encoder/layers_0/attention/query/kernel'",
                 "no chunk 0.0", f"{QUERY}/0.0"):
        assert part in line, (part, line)
