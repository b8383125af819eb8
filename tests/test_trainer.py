"""The train step under the partitioner: the same update on 1 and 8 devices under every
mesh, the same update for 1, 2 and 4 microbatches (with and without FP8), FP8 state
kept out of the optimizer, and the learning rate the optimizer really used."""
import dataclasses
import functools
import math

import jax
import numpy as np
import optax
import pytest

import initial_states
from t5lite.optim import optimizers
from t5lite.runtime import partitioning, train_step
from t5lite.runtime.checkpointing.checkpoints import Checkpointer
from t5lite.data.synthetic import SyntheticTask
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.model import DecoderOnlyModel, EncoderDecoderModel
from t5lite.models.common.precision import FP8_COLLECTION

# Two layers a side where a test needs them (scan over layers stacks them; the count of
# activation constraints grows with them); one elsewhere: the meshes, microbatches, FP8
# and the learning rate do not depend on the depth, and each program compiles faster.
T5_TWO_LAYERS = T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8,
                         num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64,
                         relpos_num_buckets=8, relpos_max_distance=16, dtype="float32")
T5 = dataclasses.replace(T5_TWO_LAYERS, num_encoder_layers=1, num_decoder_layers=1)
LLAMA = DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                      num_layers=1, mlp_dim=64, dtype="float32")
BATCH = 16
STEPS = 3
# Tolerances measured on these models (float32, 3 Adam steps at lr 1e-2, which amplifies
# reordered sums in the gradients): loss within 1e-6 relative, parameters within 1e-4.
LOSS_RTOL, PARAM_ATOL = 1e-6, 1e-4


def _model(cfg):
    kind = "encoder_decoder" if isinstance(cfg, T5Config) else "decoder_only"
    model = (EncoderDecoderModel if kind == "encoder_decoder" else DecoderOnlyModel)(cfg)
    lengths = {"inputs": 12, "targets": 8} if kind == "encoder_decoder" else {"targets": 8}
    return model, SyntheticTask(lengths, cfg.vocab_size, kind, seed=3), lengths


def _run(cfg, mesh_shape, num_microbatches=1, steps=STEPS, optimizer_name="adam",
         shard_optimizer_over_data=False):
    """Losses, the host state and the device state after `steps` steps, and the step
    functions. Adam at 1e-2, or with `optimizer_name="adafactor"` t5lite's Adafactor
    (factored by the model's axis names). The initial state is made once per model and
    optimizer (tests/initial_states.py)."""
    model, task, lengths = _model(cfg)
    devices = jax.devices()[:int(np.prod(mesh_shape))]
    part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape, devices=devices),
                                    shard_optimizer_over_data=shard_optimizer_over_data)
    if optimizer_name == "adafactor":
        tx = optimizers.adafactor(1e-2).transformation(model.logical_axes()["params"])
    else:
        tx = optax.adam(1e-2)
    fns = train_step.make_train_step(model, tx, part, num_microbatches=num_microbatches,
                                     lengths=lengths)
    state = initial_states.get(fns, key=(cfg, optimizer_name))
    losses = []
    for step in range(steps):
        batch = part.host_to_global(task.global_batch(step, BATCH), part.data_layout(BATCH))
        state, metrics = fns.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(state), state, fns


@pytest.fixture(scope="module", params=[T5, LLAMA], ids=["t5", "llama"])
def single_device(request):
    return request.param, _run(request.param, (1, 1, 1))


def _assert_same(run, ref):
    np.testing.assert_allclose(run[0], ref[0], rtol=LOSS_RTOL)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=PARAM_ATOL),
                           run[1].params, ref[1].params)


@functools.lru_cache(maxsize=None)
def _data_parallel(cfg, optimizer_name="adam", shard_optimizer_over_data=False):
    """`_run` on eight data-parallel devices, run once per arguments for the tests that
    read it (the mesh test's data mesh, the sharded optimizer's reference)."""
    return _run(cfg, (8, 1, 1), optimizer_name=optimizer_name,
                shard_optimizer_over_data=shard_optimizer_over_data)


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2)])
def test_meshes_match_one_device(single_device, mesh_shape):
    cfg, ref = single_device
    run = _data_parallel(cfg) if mesh_shape == (8, 1, 1) else _run(cfg, mesh_shape)
    _assert_same(run, ref)
    # and the parameters really are sharded as the rules say
    kernel = run[2].params["params"]["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    n_shards = len({str(s.index) for s in kernel.addressable_shards})
    assert n_shards == mesh_shape[1] * mesh_shape[2]


def _bytes_per_device(tree):
    return sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
               for a in jax.tree_util.tree_leaves(tree))


def _abstract(fns):
    return jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), fns.abstract_state,
        fns.state_shardings)


@pytest.mark.parametrize("cfg, optimizer_name", [(LLAMA, "adam"), (T5, "adafactor")],
                         ids=["llama-adam", "t5-adafactor"])
def test_optimizer_state_sharded_over_data_updates_as_replicated(tmp_path, cfg,
                                                                 optimizer_name):
    """SHARD_OPTIMIZER_OVER_DATA on data=8 (Adam's moments; T5X's Adafactor on the T5):
    three steps give the replicated optimizer's losses and parameters within 1e-6; each
    device holds 1/8 of the optimizer state (a leaf that 8 divides in no dimension stays
    whole) and every parameter whole; a checkpoint of either restores into the other,
    bit for bit, on the other's shardings."""
    replicated = _data_parallel(cfg, optimizer_name)
    sharded = _data_parallel(cfg, optimizer_name, shard_optimizer_over_data=True)
    np.testing.assert_allclose(sharded[0], replicated[0], rtol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                           sharded[1].params, replicated[1].params)
    whole = _bytes_per_device(replicated[2].opt_state)  # every device: the whole state
    assert whole / 8 <= _bytes_per_device(sharded[2].opt_state) < 1.05 * whole / 8
    assert _bytes_per_device(sharded[2].params) == _bytes_per_device(replicated[2].params)
    for name, (saved, into) in {"zero_to_whole": (sharded, replicated),
                                "whole_to_zero": (replicated, sharded)}.items():
        with Checkpointer(tmp_path / name) as ckpt:
            ckpt.save(STEPS, saved[2], {}, force=True)
            ckpt.wait()
            restored, _ = ckpt.restore(STEPS, _abstract(into[3]))
        for got, want, where in zip(jax.tree_util.tree_leaves(restored),
                                    jax.tree_util.tree_leaves(saved[1]),
                                    jax.tree_util.tree_leaves(into[3].state_shardings)):
            np.testing.assert_array_equal(np.asarray(got), want)
            assert got.sharding == where


def test_the_data_axis_goes_where_a_dimension_divides():
    """`optimizer_sharding.over_axis`: the dimension with the most elements a shard that
    divides, joined to the axes it has; nothing when data is one device, already there,
    or divides no dimension."""
    from jax.sharding import PartitionSpec as P
    from t5lite.runtime.optimizer_sharding import over_axis
    mesh = {"data": 8, "fsdp": 2, "tensor": 4}
    assert over_axis(P("fsdp", "tensor"), (512, 64), "data", mesh) == P(("fsdp", "data"), "tensor")
    assert over_axis(P(None, "tensor"), (16, 512), "data", mesh) == P(None, ("tensor", "data"))
    assert over_axis(P(), (6, 64), "data", mesh) == P(None, "data")
    assert over_axis(P(), (6,), "data", mesh) == P()  # 8 divides no dimension
    assert over_axis(P("data"), (64,), "data", mesh) == P("data")
    assert over_axis(P(), (64,), "data", {"data": 1}) == P()


@pytest.mark.parametrize("k", [2, 4])
def test_microbatches_match_whole_batch(single_device, k):
    cfg, ref = single_device
    _assert_same(_run(cfg, (1, 1, 1), num_microbatches=k), ref)


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_microbatches_match_whole_batch_fp8():
    """The FP8 T5's two steps on a 2x2x2 mesh in 2 microbatches: the whole batch's loss
    and amax histories. (4 microbatches on one device, parameters and FP8 state after a
    step: test_te_backend.py's test_fp8_microbatches_give_the_same_update[native].)"""
    cfg = dataclasses.replace(T5, fp8=True)  # FP8 matmuls, float32 everywhere else
    ref = _run(cfg, (2, 2, 2), steps=2)
    run = _run(cfg, (2, 2, 2), num_microbatches=2, steps=2)
    np.testing.assert_allclose(run[0], ref[0], rtol=1e-4)
    # FP8 amax histories combine with max across microbatches: identical to whole batch
    fp8_ref, fp8_run = ref[1].fp8[FP8_COLLECTION], run[1].fp8[FP8_COLLECTION]
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-2),
                           fp8_run, fp8_ref)


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_fp8_state_is_overwritten_not_optimized():
    cfg = dataclasses.replace(T5, fp8=True)
    model, task, lengths = _model(cfg)
    part = partitioning.Partitioner(partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    # a huge weight decay and learning rate would wreck anything the optimizer touched
    opt = optimizers.adamw(10.0, weight_decay=0.5, clip_norm=1e-3)
    fns = train_step.make_train_step(model, opt.tx, part, lengths=lengths)
    state = fns.init(jax.random.PRNGKey(0))
    assert set(state.fp8) == {FP8_COLLECTION}
    assert FP8_COLLECTION not in jax.tree_util.tree_structure(state.opt_state).__repr__()
    batch = part.host_to_global(task.global_batch(0, BATCH), part.data_layout(BATCH))
    # the loss's gradient, one jitted program (op by op it dispatched and compiled every
    # primitive of the model's backward apart, the slowest part of this test)
    grad = jax.jit(jax.grad(lambda v, b: model.loss_sums(v, b)[0]))
    expected = jax.device_get(grad(state.variables, batch)[FP8_COLLECTION])
    new_state, _ = fns.train_step(state, batch)
    # equal up to rounding (two programs); an optimizer step with lr 10 and weight
    # decay 0.5 would have moved them far more
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5),
                           jax.device_get(new_state.fp8[FP8_COLLECTION]), expected)
    hist = new_state.fp8[FP8_COLLECTION]["encoder"]["layers_0"]["mlp"]["wo"]["fp8"]
    assert float(hist["input_amax_history"][0]) > 0  # the amax of this step was recorded


def test_learning_rate_used_is_the_schedule():
    """The logged learning rate equals the schedule at the step, and the update the
    optimizer applied has exactly that size (Adam with constant gradients moves each
    parameter by lr)."""
    schedule = optimizers.linear_decay(0.1, warmup_steps=2, decay_steps=6)
    opt = optimizers.adamw(schedule, eps=1e-12)
    model, task, lengths = _model(LLAMA)
    part = partitioning.Partitioner(partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    fns = train_step.make_train_step(model, opt.tx, part, learning_rate_fn=schedule,
                                  lengths=lengths)
    state = fns.init(jax.random.PRNGKey(0))
    # by hand: warmup 0 -> 0.1 over 2 steps, then linear to 0 at step 6
    expected = [0.0, 0.05, 0.1, 0.075, 0.05]
    batch = part.host_to_global(task.global_batch(0, BATCH), part.data_layout(BATCH))
    for step, lr in enumerate(expected):
        before = jax.device_get(state.params["params"]["decoder"]["decoder_norm"]["scale"])
        state, metrics = fns.train_step(state, batch)
        np.testing.assert_allclose(float(metrics["learning_rate"]), lr, atol=1e-7)
        after = jax.device_get(state.params["params"]["decoder"]["decoder_norm"]["scale"])
        if step == 0:  # Adam's first step: |update| = lr exactly for every nonzero gradient
            assert np.allclose(np.abs(after - before), lr, atol=1e-6)
    assert int(state.step) == len(expected)


def test_state_is_created_sharded_donated_and_constrained(monkeypatch):
    """The two-layer T5's train step on a 2x2x2 mesh, built, initialised and lowered once for what
    two tests checked apart (test_state_is_created_sharded_and_donated and
    test_the_models_activation_constraints_reach_the_compiled_step): the state is created
    sharded, the optimizer moments following the params; the old state is donated by the
    step; and the layers' `with_logical_constraint`s are in the lowered train step, more
    than 20 more of them than with `Layout.constrain` a no-op. (Under the deprecated
    `with mesh:` Flax sees no mesh and drops every one of them, silently.)"""
    from t5lite.models.common import layers

    def build():
        model, task, lengths = _model(T5_TWO_LAYERS)
        part = partitioning.Partitioner(partitioning.make_mesh((2, 2, 2)))
        fns = train_step.make_train_step(model, optax.adam(1e-3), part, lengths=lengths)
        state = fns.init(jax.random.PRNGKey(0))
        batch = part.host_to_global(task.global_batch(0, BATCH), part.data_layout(BATCH))
        return fns, state, batch

    def constraints(fns, state, batch):
        return fns.train_step.lower(state, batch).as_text().count("sharding_constraint")

    fns, state, batch = build()
    emb = state.params["params"]["token_embedder"]["embedding"]
    assert emb.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    mu = state.opt_state[0].mu["token_embedder"]["embedding"]
    assert mu.sharding.spec == emb.sharding.spec  # optimizer moments follow the params
    with_model = constraints(fns, state, batch)
    new_state, _ = fns.train_step(state, batch)
    assert emb.is_deleted()  # the old state was donated
    monkeypatch.setattr(layers.Layout, "constrain", lambda self, x, *rest: x)
    without = constraints(*build())
    assert with_model > without + 20, (with_model, without)


def test_batch_size_must_divide_data_shards():
    part = partitioning.Partitioner(partitioning.make_mesh((4, 2, 1)))
    with pytest.raises(partitioning.PartitioningError, match="multiple of 8"):
        part.data_layout(12)
    with pytest.raises(partitioning.PartitioningError, match="NUM_MICROBATCHES"):
        part.data_layout(16, num_microbatches=3)
    with pytest.raises(partitioning.PartitioningError, match="devices"):
        partitioning.make_mesh((3, 1, 1))
    assert dict(partitioning.make_mesh((-1, 2, 2)).shape) == {"data": 2, "fsdp": 2, "tensor": 2,
                                                             "expert": 1, "stage": 1, "context": 1}
    assert dict(partitioning.make_mesh((1, 2, 1, -1)).shape) == {"data": 1, "fsdp": 2,
                                                                 "tensor": 1, "expert": 4,
                                                                 "stage": 1, "context": 1}
    assert dict(partitioning.make_mesh((1, 2, 1, 1, 1, -1)).shape)["context"] == 4
    assert dict(partitioning.make_mesh((1, 2, 1, 1, -1)).shape) == {
        "data": 1, "fsdp": 2, "tensor": 1, "expert": 1, "stage": 4, "context": 1}
    part = partitioning.Partitioner(partitioning.make_mesh((1, 2, 1, 4)))
    assert part.data_shards == 8  # the batch is split over the expert axis too
    with pytest.raises(partitioning.PartitioningError, match="data x fsdp x expert = 1 x 2 x 4"):
        part.data_layout(12)


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_scan_remat_fused_switches_train_like_the_plain_model():
    """Remat, scan over layers and fused QKV in training: starting from the same weights
    (converted between layouts), two Adam steps give the same losses and parameters."""
    from t5lite.models import layouts
    plain = T5_TWO_LAYERS  # two layers a side: scan stacks them
    switched = dataclasses.replace(plain, scan_layers=True, remat_policy="full", fuse_qkv=True)
    part = partitioning.Partitioner(partitioning.make_mesh((2, 2, 2)))

    def train_two_steps(cfg, start_params=None):
        """Two Adam steps from a fresh init, or from `start_params` (plain layout)."""
        model, task, lengths = _model(cfg)
        tx = optax.adam(1e-2)
        fns = train_step.make_train_step(model, tx, part, lengths=lengths)
        state = fns.init(jax.random.PRNGKey(0))
        if start_params is not None:
            params = jax.device_put(layouts.convert_params(start_params, plain, cfg),
                                    fns.state_shardings.params)
            state = state.replace(params=params, opt_state=tx.init(params["params"]))
        start = jax.device_get(state.params)
        losses = []
        for step in range(2):
            batch = part.host_to_global(task.global_batch(step, BATCH), part.data_layout(BATCH))
            state, metrics = fns.train_step(state, batch)
            losses.append(float(metrics["loss"]))
        return start, losses, layouts.convert_params(jax.device_get(state.params), cfg, plain)

    plain_start, plain_losses, plain_params = train_two_steps(plain)
    _, losses, params = train_two_steps(switched, plain_start)
    results = [(plain_losses, plain_params), (losses, params)]
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=LOSS_RTOL)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=PARAM_ATOL),
                           results[1][1], results[0][1])
