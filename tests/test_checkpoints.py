"""Checkpoints: exact round trips, retention, crash safety, resharding on restore, clear
mismatch errors, the finetuning restore (with layout conversion) and the restore order."""
import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

from t5lite.errors import CheckpointMismatchError
from t5lite.interop import checkpoint_format
from t5lite.runtime.checkpointing.checkpoints import Checkpointer, restore_or_init
from t5lite.runtime.checkpointing.finetune_restore import restore_params_for_finetuning
from t5lite.runtime.checkpointing.start import FRESH, Start
from t5lite.models import layouts
from t5lite.models.configs import T5Config
from t5lite.models.model import EncoderDecoderModel
from t5lite.optim.train_state import TrainState

T5_TINY = T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=2,
                   num_decoder_layers=2, mlp_dim=32, dtype="float32")


# ----------------------------------------------------------------------------- helpers


def make_state(kernel_shape=(8, 4), seed=0, step=7, extra_param=False):
    rng = np.random.RandomState(seed)
    p = {"dense": {"kernel": jnp.asarray(rng.randn(*kernel_shape), jnp.float32)},
         "scale": jnp.asarray(rng.randn(kernel_shape[1]), jnp.float32)}
    if extra_param:
        p["bias"] = jnp.zeros((kernel_shape[1],), jnp.float32)
    tx = optax.adam(1e-3)
    opt_state = tx.init(p)
    grads = jax.tree.map(lambda x: jnp.ones_like(x) * 0.5, p)
    _, opt_state = tx.update(grads, opt_state, p)  # non-zero moments, count 1
    return TrainState(step=jnp.asarray(step, jnp.int32), params={"params": p}, fp8={},
                      opt_state=opt_state, rng=jax.random.PRNGKey(seed))


def abstract(tree, sharding_fn):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding_fn(x)), tree)


def place(tree, sharding_fn):
    return jax.tree.map(lambda x: jax.device_put(x, sharding_fn(x)), tree)


def single(x=None):
    return SingleDeviceSharding(jax.devices()[0])


def assert_trees_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def random_variables(abstract_vars, seed=0):
    rng = np.random.RandomState(seed)
    return jax.tree.map(lambda s: rng.randn(*s.shape).astype(np.float32), abstract_vars)


@pytest.fixture(scope="module")
def t5_abstract():
    unfused = EncoderDecoderModel(T5_TINY)
    fused = EncoderDecoderModel(dataclasses.replace(T5_TINY, fuse_qkv=True, scan_layers=True))
    return unfused, unfused.abstract_variables(), fused, fused.abstract_variables()


# ----------------------------------------------------------------------------- 1-3


def test_round_trip_exact(tmp_path):
    state = make_state()
    with Checkpointer(tmp_path, keep=None) as ckpt:
        assert ckpt.latest_step() is None
        assert ckpt.save(7, state, {"epoch": 1, "position": [3, 4], "name": "a"})
        ckpt.wait()
        assert ckpt.latest_step() == 7
        restored, data = ckpt.restore(7, abstract(state, single))
    assert isinstance(restored, TrainState)
    assert data == {"epoch": 1, "position": [3, 4], "name": "a"}
    assert int(restored.step) == 7
    np.testing.assert_array_equal(restored.rng, state.rng)
    assert type(restored.opt_state[0]) is type(state.opt_state[0])
    assert_trees_equal(restored, state)
    assert (tmp_path / "checkpoints" / "7" / "state").is_dir()
    assert (tmp_path / "checkpoints" / "7" / "data").is_dir()


def test_one_process_saves_replicated_arrays_whole_without_slicing_them(tmp_path, caplog):
    """A state replicated over the 8 devices of this one process is written whole from
    one replica: no slice program is compiled to split it among the replicas (Orbax's
    replica-parallel save, which shares writing between hosts), and it restores exactly."""
    import logging
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = lambda x: NamedSharding(mesh, P())  # noqa: E731
    state = place(make_state(kernel_shape=(24, 40), seed=5), replicated)
    caplog.set_level(logging.WARNING, logger="jax._src.interpreters.pxla")

    def probe(x):  # a program compiled beside the save: the log is read
        return x + 1

    with jax.log_compiles(True):
        jax.jit(probe)(np.float32(1))
        with Checkpointer(tmp_path, keep=None, async_save=False) as ckpt:
            assert ckpt.save(3, state)
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()
                or "compilation of" in r.getMessage()]
    assert [m for m in compiled if "probe" in m], compiled
    assert not [m for m in compiled if "slice" in m], compiled
    with Checkpointer(tmp_path, keep=None) as ckpt:
        restored, _ = ckpt.restore(3, abstract(state, replicated))
    assert_trees_equal(restored, state)


def test_the_data_iterator_state_is_saved_per_shard(tmp_path):
    state, blob = make_state(), bytes(range(256)) * 3
    iterator = {"count": 2, "states": {0: blob, 1: blob[::-1]}}
    with Checkpointer(tmp_path, keep=None) as ckpt:
        ckpt.save(3, state, {"position": 3, "iterator": iterator})
        ckpt.save(4, state, {"position": 4})  # a stream that cannot be saved: no bytes
        ckpt.wait()
        _, data3 = ckpt.restore(3, abstract(state, single))
        _, data4 = ckpt.restore(4, abstract(state, single))
    assert data3 == {"position": 3, "iterator": iterator} and data4 == {"position": 4}
    item = tmp_path / "checkpoints" / "3" / "data_iterator"
    assert (item / "shard_00001-of-00002.process_00000").read_bytes() == blob[::-1]
    with Checkpointer(tmp_path, keep=None, iterator_shards=lambda count: [1]) as ckpt:
        _, data3 = ckpt.restore(3, abstract(state, single))  # the shards a process reads
    assert data3["iterator"] == {"count": 2, "states": {1: blob[::-1]}}
    json_item = (tmp_path / "checkpoints" / "3" / "data" / "metadata").read_text()
    assert "iterator" not in json_item  # the bytes are not in the JSON item


def test_keep_period_force(tmp_path):
    state = make_state()
    with Checkpointer(tmp_path, keep=2, period=10, async_save=True) as ckpt:
        saved = [s for s in range(1, 36) if ckpt.save(s, state, None)]
        assert saved == [10, 20, 30]
        assert ckpt.save(33, state, None, force=True)
        assert not ckpt.save(33, state, None, force=True)  # already saved: not again
        ckpt.wait()
        assert ckpt.all_steps() == [30, 33]
        assert ckpt.latest_step() == 33
        _, data = ckpt.restore(None, abstract(state, single))
        assert data == {}  # None is stored as {}
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert names == ["30", "33"]


def _uncommit(step_dir):
    """Make a step directory look like a save that never committed."""
    (step_dir / "commit_success.txt").unlink()
    meta = step_dir / "_CHECKPOINT_METADATA"
    m = json.loads(meta.read_text())
    m["commit_timestamp_nsecs"] = None
    meta.write_text(json.dumps(m))


def test_incomplete_checkpoint_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    good, bad = make_state(seed=0, step=10), make_state(seed=1, step=30)
    with Checkpointer(tmp_path, keep=None, async_save=False) as ckpt:
        ckpt.save(10, good, {"pos": 10})
        ckpt.save(30, bad, {"pos": 30})
        ckpt.wait()
        # crash 1: orbax's tmp directory of an interrupted save (both name forms)
        shutil.copytree(root / "30", root / "40.orbax-checkpoint-tmp")
        shutil.copytree(root / "30", root / "50.orbax-checkpoint-tmp-1234567")
        # crash 2: a step directory without its commit marker
        _uncommit(root / "30")
        assert ckpt.latest_step() == 10
        assert ckpt.all_steps() == [10]
        with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
            ckpt.restore(30, abstract(bad, single))
    ckpt = Checkpointer(tmp_path, keep=None, async_save=False)
    assert ckpt.latest_step() == 10
    state, data = ckpt.restore(None, abstract(good, single))
    assert_trees_equal(state, good)
    assert data == {"pos": 10}
    # the uncommitted step is set aside (not deleted) and can be saved again; the tmp
    # dirs are removed (by Orbax, in the background; a save waits for that)
    assert any(p.name.startswith("30.incomplete-") for p in root.iterdir())
    assert ckpt.save(30, bad, {"pos": 30})
    ckpt.wait()
    assert ckpt.latest_step() == 30
    names = sorted(p.name for p in root.iterdir())
    assert not any(".orbax-checkpoint-tmp" in n for n in names), names
    ckpt.close()


# ----------------------------------------------------------------------------- 4


def test_restore_onto_other_shardings(tmp_path):
    devices = np.array(jax.devices())
    assert devices.size == 8
    mesh1 = Mesh(devices, ("x",))
    mesh2 = Mesh(devices.reshape(2, 4), ("a", "b"))

    def save_sharding(x):
        return NamedSharding(mesh1, P("x", None) if x.shape == (8, 4) else P())

    def mesh2_sharding(x):
        return NamedSharding(mesh2, P("b", "a") if x.shape == (8, 4) else P())

    state = make_state()
    sharded = place(state, save_sharding)
    assert sharded.params["params"]["dense"]["kernel"].sharding.spec == P("x", None)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(5, sharded, {"i": 5})
        ckpt.wait()
        for fn in (mesh2_sharding, lambda x: SingleDeviceSharding(jax.devices()[5])):
            target = abstract(state, fn)
            restored, data = ckpt.restore(5, target)
            assert_trees_equal(restored, state)
            for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
                assert got.sharding == want.sharding
            assert data == {"i": 5}
    kernel = restored.params["params"]["dense"]["kernel"]
    assert kernel.sharding.device_set == {jax.devices()[5]}


# ----------------------------------------------------------------------------- 5


def test_mismatch_is_one_clear_line(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(200, make_state(), None)
        ckpt.wait()
        with pytest.raises(CheckpointMismatchError) as e:
            ckpt.restore(200, abstract(make_state(kernel_shape=(8, 6)), single))
        msg = str(e.value)
        assert "\n" not in msg
        assert "params/dense/kernel" in msg
        assert "(8, 4)" in msg and "(8, 6)" in msg
        assert str(tmp_path / "checkpoints" / "200") in msg
        assert "another model size" in msg and "new MODEL_DIR" in msg

        with pytest.raises(CheckpointMismatchError) as e:
            ckpt.restore(200, abstract(make_state(extra_param=True), single))
        msg = str(e.value)
        assert "\n" not in msg
        assert "params/bias is in the model but not in the checkpoint" in msg
        assert "(1 missing)" in msg

        # same parameters, another optimizer
        state = make_state()
        sgd = state.replace(opt_state=optax.sgd(0.1, momentum=0.9).init(state.params["params"]))
        with pytest.raises(CheckpointMismatchError, match="optimizer differs"):
            ckpt.restore(200, abstract(sgd, single))


def test_mismatch_names_layout_change(tmp_path, t5_abstract):
    model, abs_vars, fused_model, abs_fused = t5_abstract
    variables = random_variables(abs_vars)

    def state_of(vars_):
        return TrainState(step=jnp.asarray(1, jnp.int32), params=vars_, fp8={},
                          opt_state=(), rng=jax.random.PRNGKey(0))

    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state_of(jax.tree.map(jnp.asarray, variables)), None)
        ckpt.wait()
        with pytest.raises(CheckpointMismatchError) as e:
            ckpt.restore(1, abstract(state_of(abs_fused), single))
    msg = str(e.value)
    assert "\n" not in msg
    assert "fuse_qkv=False, scan_layers=False" in msg
    assert "fuse_qkv=True, scan_layers=True" in msg
    assert "INITIAL_CHECKPOINT_PATH" in msg


# ----------------------------------------------------------------------------- 6


def test_finetune_from_converted_checkpoint(tmp_path, t5_abstract):
    model, abs_vars, _, _ = t5_abstract
    variables = random_variables(abs_vars)
    checkpoint_format.save_params(tmp_path / "conv", variables)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    target = abstract(abs_vars, lambda x: NamedSharding(mesh, P()))
    for path in (tmp_path / "conv", tmp_path / "conv" / "checkpoints",
                 tmp_path / "conv" / "checkpoints" / "0", str(tmp_path / "conv")):
        params = restore_params_for_finetuning(path, model, target)
        assert_trees_equal(params, variables)
        for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(target)):
            assert got.sharding == want.sharding


def test_finetune_from_training_checkpoint(tmp_path):
    state = make_state(step=300)
    with Checkpointer(tmp_path / "run") as ckpt:
        ckpt.save(100, make_state(seed=5), None)
        ckpt.save(300, state, {"pos": 1})
        ckpt.wait()
    target = abstract(state.params, single)
    for path in (tmp_path / "run", tmp_path / "run" / "checkpoints" / "300"):
        params = restore_params_for_finetuning(path, None, target)
        assert_trees_equal(params, state.params)
    older = restore_params_for_finetuning(tmp_path / "run" / "checkpoints" / "100", None, target)
    assert_trees_equal(older, make_state(seed=5).params)


@pytest.mark.parametrize("direction", ["to_fused_scanned", "to_unfused_unscanned"])
def test_finetune_converts_layout(tmp_path, t5_abstract, direction):
    model, abs_vars, fused_model, abs_fused = t5_abstract
    if direction == "to_fused_scanned":
        src_model, src_abs, dst_model, dst_abs = model, abs_vars, fused_model, abs_fused
    else:
        src_model, src_abs, dst_model, dst_abs = fused_model, abs_fused, model, abs_vars
    variables = random_variables(src_abs, seed=3)
    checkpoint_format.save_params(tmp_path / "conv", variables)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
    target = abstract(dst_abs, lambda x: NamedSharding(mesh, P("a") if x.shape[0] % 2 == 0
                                                         else P()))
    expected = layouts.convert_params(jax.tree.map(jnp.asarray, variables), src_model.config,
                                      dst_model.config)
    for m in (dst_model, None):  # without the model, the target's tree gives the layout
        params = restore_params_for_finetuning(tmp_path / "conv", m, target)
        assert layouts.detect_layout(params) == layouts.detect_layout(dst_abs)
        assert_trees_equal(params, expected)
        for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(target)):
            assert got.sharding == want.sharding


def test_detect_layout(t5_abstract):
    _, abs_vars, _, abs_fused = t5_abstract
    def layout(fused, stacked, runs=1):
        return {"fuse_qkv": fused, "scan_layers": stacked, "pipeline_repeats": runs}
    assert layouts.detect_layout(abs_vars) == layout(False, False)
    assert layouts.detect_layout(abs_fused) == layout(True, True)
    assert layouts.detect_layout(abs_fused["params"]) == layout(True, True)
    only_scan = layouts.scan_layers(random_variables(abs_vars)["params"])
    assert layouts.detect_layout(only_scan) == layout(False, True)
    runs = layouts.split_repeats(only_scan, 2)  # a circular pipeline's 2 runs of layers
    assert "repeats" in runs["encoder"] and "layers" not in runs["encoder"]
    assert layouts.detect_layout(runs) == layout(False, True, 2)
    assert layouts.detect_layout({"params": {"dense": {"kernel": 0}}}) == layout(False, False)


def test_finetune_errors(tmp_path, t5_abstract):
    model, abs_vars, _, _ = t5_abstract
    target = abstract(abs_vars, single)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        restore_params_for_finetuning(tmp_path / "nope", model, target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
        restore_params_for_finetuning(tmp_path / "empty", model, target)
    bigger = EncoderDecoderModel(dataclasses.replace(T5_TINY, mlp_dim=48))
    checkpoint_format.save_params(tmp_path / "big", random_variables(bigger.abstract_variables()))
    with pytest.raises(CheckpointMismatchError) as e:
        restore_params_for_finetuning(tmp_path / "big", model, target)
    msg = str(e.value)
    assert "\n" not in msg and "(16, 48)" in msg and "(16, 32)" in msg
    assert "params/decoder/layers_0/mlp/wi_0/kernel" in msg


# ----------------------------------------------------------------------------- 7


def test_restore_or_init_order(tmp_path):
    target = abstract(make_state(), single)
    fresh = make_state(seed=9, step=0)
    fresh = fresh.replace(opt_state=optax.adam(1e-3).init(fresh.params["params"]))
    calls = []

    def init_fn():
        calls.append(1)
        return fresh

    # nothing anywhere: init
    with Checkpointer(tmp_path / "a") as ckpt:
        state, data, source = restore_or_init(ckpt, target, init_fn)
    assert source == FRESH and str(source) == "init" and data is None
    assert_trees_equal(state, fresh)

    # an initial checkpoint (a training run elsewhere): its params, the rest fresh
    pretrained = make_state(seed=4, step=500)
    with Checkpointer(tmp_path / "pre") as ckpt:
        ckpt.save(500, pretrained, {"pos": 9})
        ckpt.wait()
    initial = str(tmp_path / "pre")
    with Checkpointer(tmp_path / "b") as ckpt:
        state, data, source = restore_or_init(ckpt, target, init_fn, initial)
    assert source == Start("initial", path=initial) and str(source) == f"initial:{initial}"
    assert data is None
    assert int(state.step) == 0
    assert_trees_equal(state.params, pretrained.params)
    assert_trees_equal(state.opt_state, fresh.opt_state)
    assert int(state.opt_state[0].count) == 0

    # a checkpoint in MODEL_DIR wins over the initial path
    own = make_state(seed=6, step=40)
    with Checkpointer(tmp_path / "b") as ckpt:
        ckpt.save(40, own, {"pos": 40})
        ckpt.wait()
        n = len(calls)
        state, data, source = restore_or_init(ckpt, target, init_fn, initial)
    assert source == Start("resume", step=40) and str(source) == "resume:40"
    assert data == {"pos": 40}
    assert len(calls) == n  # no initialization on resume
    assert_trees_equal(state, own)

    # an initial checkpoint that cannot be read is refused before the model is
    # initialized: a run that cannot start compiles and allocates nothing for it
    with Checkpointer(tmp_path / "c") as ckpt, pytest.raises(FileNotFoundError):
        restore_or_init(ckpt, target, init_fn, str(tmp_path / "nope"))
    assert len(calls) == n


def test_a_start_says_where_the_state_came_from_in_the_start_line_and_in_words():
    """The typed start `restore_or_init` returns: its start-line form (the log line the
    run prints, `start: resume:40 at step 40`), its words (the non-finite-loss message's),
    and the kinds' fields held to what each kind has."""
    cases = [(Start("resume", step=40), "resume:40", "MODEL_DIR's checkpoint 40"),
             (Start("initial", path="/b"), "initial:/b", "INITIAL_CHECKPOINT_PATH /b"),
             (Start("t5x_continue", path="/t"), "initial:/t",
              "INITIAL_CHECKPOINT_PATH /t (a T5X run continued)"),
             (Start("upcycle", path="/d"), "upcycle:/d", "INITIAL_CHECKPOINT_PATH /d (upcycled)"),
             (FRESH, "init", "a fresh init")]
    for start, line, words in cases:
        assert (str(start), start.in_words()) == (line, words)
    for bad in (dict(kind="resume"), dict(kind="init", step=3), dict(kind="initial"),
                dict(kind="resume", step=3, path="/x"), dict(kind="continue", path="/x")):
        with pytest.raises(ValueError):
            Start(**bad)


def test_converted_dir_is_not_a_model_dir(tmp_path):
    checkpoint_format.save_params(tmp_path, {"params": {"w": np.ones((2,), np.float32)}})
    with pytest.raises(ValueError, match="INITIAL_CHECKPOINT_PATH"):
        Checkpointer(tmp_path)
