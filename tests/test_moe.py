"""Mixture of experts (decoder-only): the routing against a hand-written NumPy dispatch,
the MoE block against a per-expert loop, the router's losses at their known values, the
router in float32 under bf16 and FP8, the expert axis and microbatches giving the
one-device, whole-batch update (router losses included), and the settings that cannot
work refused in one line."""
import dataclasses
import math
import re

import flax.linen as nn
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import initial_states
from t5lite.data.synthetic import SyntheticTask
from t5lite.models import moe
from t5lite.models.moe import routing
from t5lite.models.configs import DecoderConfig
from t5lite.models.common.layers import ACTIVATIONS
from t5lite.models.model import DecoderOnlyModel
from t5lite.runtime import partitioning, train_step

MOE = DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                    num_layers=2, mlp_dim=48, dtype="float32", num_experts=8, moe_top_k=2,
                    moe_every=1, moe_group_size=8, routing="capacity", capacity_factor=1.0,
                    eval_capacity_factor=1.0, router_aux_loss=0.1, router_z_loss=0.01)


# ----------------------------------------------------------------------------- routing

def _hand_dispatch(probs, top_k, capacity):
    """Priority routing written out token by token: every first choice in token order,
    then every second choice; a choice whose expert is full is dropped."""
    groups, tokens, experts = probs.shape
    dispatch = np.zeros((groups, tokens, experts, capacity), bool)
    combine = np.zeros((groups, tokens, experts, capacity), np.float32)
    for g in range(groups):
        order = [sorted(range(experts), key=lambda e: (-probs[g, s, e], e))[:top_k]
                 for s in range(tokens)]
        gates = [probs[g, s, order[s]] for s in range(tokens)]
        if top_k > 1:
            gates = [w / w.sum() for w in gates]
        count = [0] * experts
        for j in range(top_k):
            for s in range(tokens):
                e = order[s][j]
                if count[e] < capacity:
                    dispatch[g, s, e, count[e]] = True
                    combine[g, s, e, count[e]] = gates[s][j]
                    count[e] += 1
    return dispatch, combine


@pytest.mark.parametrize("top_k", [1, 2])
def test_capacity_routing_matches_hand_dispatch(top_k):
    rng = np.random.default_rng(top_k)
    logits = rng.normal(size=(3, 16, 4)).astype(np.float32)
    logits[..., 0] += 1.5  # expert 0 popular: its slots run out
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    capacity = routing.expert_capacity(16, 4, 1.0)
    assert capacity == 4
    # jitted, each call one program (op by op, one a primitive)
    got = jax.jit(routing.capacity_routing, static_argnums=(1, 2))(
        jnp.asarray(probs), top_k, capacity)
    dispatch, combine = _hand_dispatch(probs, top_k, capacity)
    # the indices written out as GShard's one-hot tensors [group, token, expert, slot]
    slot, gates = np.asarray(got.slot), np.asarray(got.gates)
    got_dispatch = np.zeros((3, 16, 4 * capacity + 1), bool)
    got_combine = np.zeros((3, 16, 4 * capacity + 1), np.float32)
    for g, s, j in np.ndindex(slot.shape):
        got_dispatch[g, s, slot[g, s, j]] = True
        got_combine[g, s, slot[g, s, j]] += gates[g, s, j]
    assert not np.any(gates[slot == 4 * capacity])  # a dropped choice weighs nothing
    np.testing.assert_array_equal(got_dispatch[..., :-1].reshape(dispatch.shape), dispatch)
    np.testing.assert_allclose(got_combine[..., :-1].reshape(combine.shape), combine,
                               rtol=1e-6, atol=0)
    kept = np.asarray(got.kept)
    assert 0 < kept.mean() < 1  # some choices were dropped, some kept
    assert dispatch.sum() == kept.sum() == np.sum(slot < 4 * capacity)
    # the slots gathered and scattered back: each kept token lands in its slot and
    # returns weighted by its gate
    x = jnp.asarray(rng.normal(size=(3, 16, 5)), jnp.float32)
    slots_x = np.asarray(jax.jit(routing.dispatch, static_argnums=2)(x, got.slot,
                                                                      4 * capacity))
    np.testing.assert_allclose(slots_x, np.einsum("gsec,gsd->gecd", dispatch, x).reshape(
        3, 4 * capacity, 5), rtol=1e-6, atol=1e-6)
    back = jax.jit(routing.combine)(jnp.asarray(slots_x), got.slot, got.gates)
    np.testing.assert_allclose(np.asarray(back), np.einsum(
        "gsec,gecd->gsd", combine, slots_x.reshape(3, 4, capacity, 5)), rtol=1e-5, atol=1e-6)


def test_capacity_rule():
    assert routing.expert_capacity(8192, 64, 2.0) == 256  # GLaM 126M/64E's
    assert routing.expert_capacity(1000, 64, 1.0) == 16  # int(15.6) = 15, up to 16
    assert routing.expert_capacity(16, 64, 1.0) == 4  # at least 4
    assert routing.expert_capacity(2, 4, 8.0) == 2  # never more than the group


def test_zero_router_losses():
    @jax.jit  # one program (op by op, one a primitive)
    def losses(logits):
        probs = jax.nn.softmax(logits)
        first = routing.top_k_choices(probs, 2)[0][..., 0]
        return routing.load_balancing_loss(probs, first), routing.z_loss(logits)

    balance, z = losses(jnp.zeros((2, 8, 16), jnp.float32))
    assert float(balance) == 1.0
    np.testing.assert_allclose(float(z), math.log(16) ** 2, rtol=1e-6)


# ----------------------------------------------------------------------------- the block

def _block(routing_kind, top_k, cf=64.0, activations=("silu", "linear"), experts=4):
    return moe.MoeMLP(num_experts=experts, top_k=top_k, mlp_dim=12,
                      activations=tuple(ACTIVATIONS[a] for a in activations),
                      routing_kind=routing_kind, capacity_factor=cf, eval_capacity_factor=cf,
                      group_size=8, dtype=jnp.float32)


def _init_apply(block):
    """The block's init and its apply (with its statistics), jitted: one program each
    (op by op, flax compiled one a primitive)."""
    return (jax.jit(block.init),
            jax.jit(lambda p, x: block.apply(p, x, mutable=[moe.STATS_COLLECTION])))


def _expert_loop(params, x, top_k, kept=None):
    """Each token: its top-k experts' MLPs, weighted by the (renormalized) gates."""
    p = jax.tree_util.tree_map(np.asarray, params["params"])
    flat = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
    logits = flat @ p["router"]["kernel"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(flat)
    for t in range(flat.shape[0]):
        chosen = sorted(range(probs.shape[1]), key=lambda e: (-probs[t, e], e))[:top_k]
        gates = probs[t, chosen] / (probs[t, chosen].sum() if top_k > 1 else 1.0)
        for j, e in enumerate(chosen):
            if kept is not None and not kept[t, j]:
                continue
            names = sorted(n for n in p if n.startswith("wi"))
            hidden = None
            for n, act in zip(names, ("silu", "linear") if len(names) == 2 else ("relu",)):
                h = np.asarray(ACTIVATIONS[act](flat[t] @ p[n]["kernel"][e]))
                hidden = h if hidden is None else hidden * h
            out[t] += gates[j] * (hidden @ p["wo"]["kernel"][e])
    return out.reshape(x.shape)


@pytest.mark.parametrize("routing_kind,top_k", [("capacity", 1), ("capacity", 2),
                                                ("dropless", 2)])
def test_block_without_drops_equals_expert_loop(routing_kind, top_k):
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 16), jnp.float32)
    init, apply = _init_apply(_block(routing_kind, top_k))
    params = nn.meta.unbox(init(jax.random.PRNGKey(2), x))
    y, state = apply(params, x)
    np.testing.assert_allclose(np.asarray(y), _expert_loop(params, x, top_k), atol=1e-6)
    stats = moe.layer_stats(state[moe.STATS_COLLECTION])
    assert float(stats["dropped_fraction"][0]) == 0.0


def test_block_with_drops_equals_hand_dispatch():
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 8, 16), jnp.float32)
    init, apply = _init_apply(_block("capacity", 2, cf=1.0, activations=("relu",), experts=8))
    params = nn.meta.unbox(init(jax.random.PRNGKey(4), x))
    # a router that favours expert 0, so its 4 slots of each 8-token group overflow
    params["params"]["router"]["kernel"] = params["params"]["router"]["kernel"].at[:, 0].add(
        jnp.sign(x.reshape(-1, 16).mean(0)) * 2.0)
    y, state = apply(params, x)
    flat = np.asarray(x).reshape(2, 8, 16)
    logits = flat @ np.asarray(params["params"]["router"]["kernel"])
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    dispatch, _ = _hand_dispatch(probs, 2, 4)
    kept = np.zeros((16, 2), bool)
    for g in range(2):
        for s in range(8):
            chosen = sorted(range(8), key=lambda e: (-probs[g, s, e], e))[:2]
            for j, e in enumerate(chosen):
                kept[g * 8 + s, j] = dispatch[g, s, e].any()
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(np.asarray(y), _expert_loop(params, x, 2, kept), atol=1e-6)
    stats = moe.layer_stats(state[moe.STATS_COLLECTION])
    np.testing.assert_allclose(float(stats["dropped_fraction"][0]), 1 - kept.mean(), rtol=1e-6)


def _dot_dtypes(jaxpr, experts, found):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out = eqn.outvars[0].aval
            if out.shape and out.shape[-1] == experts:
                found.append((out.dtype, tuple(v.aval.dtype for v in eqn.invars)))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _dot_dtypes(sub, experts, found)
    return found


@pytest.mark.parametrize("fp8", [False, True])
def test_router_is_float32_under_bf16_and_fp8(fp8):
    cfg = dataclasses.replace(MOE, dtype="bfloat16", fp8=fp8, num_experts=5)
    model = DecoderOnlyModel(cfg)
    variables = model.abstract_variables(2, {"targets": 8})
    batch = model.dummy_batch(2, {"targets": 8})
    jaxpr = jax.make_jaxpr(lambda v: model.logits(v, batch))(variables)
    found = _dot_dtypes(jaxpr.jaxpr, 5, [])
    assert len(found) == cfg.num_layers  # one router matmul a layer
    assert all(out == jnp.float32 and ins == (jnp.float32, jnp.float32) for out, ins in found)


# ----------------------------------------------------------------------------- training

def _run(cfg, mesh_shape, num_microbatches=1, steps=1, rules=(), length=8):
    model = DecoderOnlyModel(cfg)
    lengths = {"targets": length}
    task = SyntheticTask(lengths, cfg.vocab_size, "decoder_only", seed=3)
    devices = jax.devices()[:int(np.prod(mesh_shape))]
    part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape, devices=devices),
                                    extra_rules=tuple(rules))
    fns = train_step.make_train_step(model, optax.sgd(0.1), part,
                                     num_microbatches=num_microbatches, lengths=lengths)
    # the initial state of a model made once, whatever the mesh, rules and microbatches,
    # placed anew for each run (tests/initial_states.py)
    state = initial_states.get(fns, key=(cfg, "sgd"))
    for step in range(steps):
        batch = part.host_to_global(task.global_batch(step, 16), part.data_layout(16))
        state, metrics = fns.train_step(state, batch)
    return jax.device_get(metrics), jax.device_get(state), state


_ONE_DEVICE = {}


def _one_device_run(routing):
    """One step of MOE (with `routing`) on one device, run once for the module: the
    reference of the mesh and microbatch tests and the base of the router-loss test."""
    if routing not in _ONE_DEVICE:
        cfg = dataclasses.replace(MOE, routing=routing)
        _ONE_DEVICE[routing] = (cfg, _run(cfg, (1, 1, 1)))
    return _ONE_DEVICE[routing]


@pytest.fixture(scope="module", params=["capacity", "dropless"])
def one_device(request):
    return _one_device_run(request.param)


def _assert_same(run, ref):
    for name in ("loss", "grad_norm", "moe/aux_loss", "moe/z_loss", "moe/dropped_fraction"):
        np.testing.assert_allclose(run[0][name], ref[0][name], rtol=1e-5, err_msg=name)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                                   atol=1e-5),
                           run[1].params, ref[1].params)


@pytest.mark.parametrize("mesh_shape,rules", [
    ((1, 1, 1, 8), ()), ((1, 2, 1, 4), ()),
    # tensor x expert, the residual stream split over tensor (T5X's
    # activation_partitioning_dims=2, as Pax's GLaM 64B runs)
    ((1, 1, 2, 4), (("activation_embed", "tensor"),))])
def test_expert_meshes_match_one_device(one_device, mesh_shape, rules):
    cfg, ref = one_device
    if cfg.routing == "capacity":  # drops happen, and the router losses are in the step
        assert 0 < ref[0]["moe/dropped_fraction"] < 1
        assert ref[0]["moe/aux_loss"] > 1
    run = _run(cfg, mesh_shape, rules=rules)
    _assert_same(run, ref)
    kernel = run[2].params["params"]["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("expert", "fsdp", "tensor")
    assert len({str(s.index) for s in kernel.addressable_shards}) == 8


@pytest.mark.parametrize("routing", ["capacity", "dropless"])
def test_a_scan_over_blocks_of_dense_and_sparse_layers_is_the_loop(routing):
    """GLaM's stack (MOE_EVERY=2: sparse, dense, sparse, dense) scanned as blocks of two
    layers (`layers/block_0`, `layers/block_1`), with full remat, on fsdp 2 x expert 4:
    the same step as the layer loop on one device (the parameters compared through the
    layout conversion, which round-trips bit for bit)."""
    from t5lite.models import layouts
    cfg = dataclasses.replace(MOE, routing=routing, num_layers=4, moe_every=2)
    ref = _run(cfg, (1, 1, 1))
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True, remat_policy="full")
    run = _run(scanned_cfg, (1, 2, 1, 4))
    for name in ("loss", "grad_norm", "moe/aux_loss", "moe/z_loss", "moe/dropped_fraction",
                 "moe/dropped_fraction/layer_2"):
        np.testing.assert_allclose(run[0][name], ref[0][name], rtol=1e-5, err_msg=name)
    blocks = run[1].params["params"]["decoder"]["layers"]
    assert blocks["block_0"]["mlp"]["wi_0"]["kernel"].shape == (2, 8, 32, 48)  # sparse
    assert blocks["block_1"]["mlp"]["wi_0"]["kernel"].shape == (2, 32, 48)  # dense
    loop = layouts.convert_params(run[1].params, scanned_cfg, cfg)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-5),
                           loop, ref[1].params)
    back = layouts.convert_params(loop, cfg, scanned_cfg)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, run[1].params)


def test_microbatches_match_whole_batch(one_device):
    cfg, ref = one_device
    _assert_same(_run(cfg, (1, 1, 1), num_microbatches=2), ref)


def _shipped(gin_file):
    """A model file's config as shipped (its MOE_GROUP_SIZE, routing and router losses),
    in float32 so that microbatch sums compare at 1e-5."""
    from t5lite.config import parsing
    parsing.parse_gin([f"configs/{gin_file}"], ["ACTIVATION_DTYPE = 'float32'"])
    try:
        return parsing.resolve_macro("MODEL").config
    finally:
        import gin
        gin.clear_config()


@pytest.mark.parametrize("gin_file", ["models/glam/tiny.gin", "models/mixtral/tiny.gin"])
def test_shipped_moe_settings_give_the_one_microbatch_step(gin_file):
    """GLaM's capacity top-2 and Mixtral's dropless routing with their shipped groups of
    1,024 tokens, one step on 16 sequences of 256 tokens: 2 and 4 microbatches each hold
    whole groups of the whole batch (nothing to warn of), and 4, each exactly one group,
    give its step (loss, router losses, drops, gradient norm, parameters after SGD: the
    gradients; 2 microbatches of two groups each run the same code, a microbatch's whole
    groups routed alone). With 32-token sequences a microbatch holds less than a group:
    the start-up line says what changes and which MOE_GROUP_SIZE gives the same step,
    and the steps do differ."""
    cfg = _shipped(gin_file)
    assert cfg.moe_group_size == 1024 and cfg.num_experts > 1
    cfg = dataclasses.replace(cfg, vocab_size=512)  # the routing's settings kept; a small head
    whole = _run(cfg, (1, 1, 1), length=256)
    for k in (2, 4):
        assert DecoderOnlyModel(cfg).microbatch_routing_change(16, {"targets": 256}, k) is None
    run = _run(cfg, (1, 1, 1), num_microbatches=4, length=256)
    for name in ("loss", "grad_norm", "moe/aux_loss", "moe/z_loss", "moe/dropped_fraction",
                 "moe/dropped_fraction/layer_0"):
        np.testing.assert_allclose(run[0][name], whole[0][name], rtol=1e-5, err_msg=name)
    # each parameter array within 3e-3 of its largest value after the SGD step
    # (measured: Mixtral 1.7e-6; GLaM 4.8e-4 when written, 1.3e-3 on jax 0.12.0.1,
    # in its first layer's experts and the embedding below them, its drops, losses
    # and router losses the same to 1e-7: float reordering through capacity top-2;
    # the unnested case: 8.5e-2, 28 times the bound)
    for a, b in zip(jax.tree_util.tree_leaves(run[1].params),
                    jax.tree_util.tree_leaves(whole[1].params)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 3e-3 * np.max(np.abs(b)), a.shape
    said = DecoderOnlyModel(cfg).microbatch_routing_change(16, {"targets": 32}, 2)
    assert said is not None and "\n" not in said
    for needle in ("NUM_MICROBATCHES=2", "256 tokens are routed in groups of 256",
                   "groups of 512", "MOE_GROUP_SIZE=1024", "MOE_GROUP_SIZE=256"):
        assert needle in said, said
    if cfg.routing == "dropless":  # no capacity: the load-balancing loss is what differs
        one, two = (_run(cfg, (1, 1, 1), num_microbatches=k, length=32) for k in (1, 2))
        assert abs(one[0]["moe/aux_loss"] - two[0]["moe/aux_loss"]) > 1e-3
        fixed = dataclasses.replace(cfg, moe_group_size=256)
        assert DecoderOnlyModel(fixed).microbatch_routing_change(16, {"targets": 32}, 2) is None


def test_switch_groups_nest_in_its_shipped_microbatches():
    """Switch-Base's groups of 8,192 tokens (shape arithmetic only): T5X's finetuning
    batch of 256 x (512, 128) tokens nests them in 2 and 4 microbatches, decoder too; at
    8 microbatches the decoder's 4,096 tokens hold half a group, and the line names it."""
    cfg = _shipped("models/switch/base_8.gin")
    assert cfg.moe_group_size == 8192
    from t5lite.models.model import EncoderDecoderModel
    model, lengths = EncoderDecoderModel(cfg), {"inputs": 512, "targets": 128}
    assert [model.microbatch_routing_change(256, lengths, k) for k in (1, 2, 4)] == [None] * 3
    said = model.microbatch_routing_change(256, lengths, 8)
    assert "4096 decoder tokens are routed in groups of 4096" in said, said
    assert "MOE_GROUP_SIZE=4096" in said


def test_router_losses_reach_the_gradient():
    """With the router's losses weighted up, the router's update changes (and only its
    and the layers' below it): the objective really holds them."""
    cfg, base = _one_device_run("capacity")
    assert cfg == MOE  # MOE's own routing: the step the mesh tests compare against
    heavy = _run(dataclasses.replace(MOE, router_aux_loss=10.0), (1, 1, 1))
    np.testing.assert_allclose(heavy[0]["loss"], base[0]["loss"], rtol=1e-6)
    router = lambda r: np.asarray(r[1].params["params"]["decoder"]["layers_1"]["mlp"]
                                  ["router"]["kernel"])
    assert np.abs(router(heavy) - router(base)).max() > 1e-4
    np.testing.assert_allclose(heavy[0]["moe/objective"],
                               10.0 * heavy[0]["moe/aux_loss"] + 0.01 * heavy[0]["moe/z_loss"],
                               rtol=1e-6)


# ----------------------------------------------------------------------------- settings

@pytest.mark.parametrize("changes,needle", [
    ({"moe_top_k": 9}, "MOE_TOP_K=9 exceeds NUM_EXPERTS=8"),
    ({"capacity_factor": 0.0}, "CAPACITY_FACTOR (capacity_factor) must be a number > 0"),
    ({"eval_capacity_factor": -1.0}, "EVAL_CAPACITY_FACTOR"),
    ({"routing": "sinkhorn"}, "ROUTING (routing) must be one of capacity, dropless"),
    ({"expert_mlp": "swish"}, "EXPERT_MLP (expert_mlp) must be one of"),
    ({"scan_layers": True, "moe_every": 3}, "SCAN_LAYERS=True repeats a block of MOE_EVERY=3"),
    ({"scan_layers": True, "moe_every": 2, "moe_first": 2}, "the first sparse one"),
    ({"lora_rank": 4, "lora_targets": ("query",)}, "LoRA (LORA_RANK > 0) does not adapt"),
    ({"fp8": True, "fp8_backend": "te"}, "FP8_BACKEND='te' does not run mixture-of-experts"),
])
def test_bad_settings_are_one_line(changes, needle):
    with pytest.raises(ValueError) as err:
        dataclasses.replace(MOE, **changes)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_expert_axis_must_divide_the_experts():
    settings = partitioning.MeshSettings((1, 1, 1, 3), (1, 1, 1), ())
    with pytest.raises(partitioning.PartitioningError) as err:
        settings.partitioner(jax.devices()[:3], model=DecoderOnlyModel(MOE))
    assert "NUM_EXPERTS=8" in str(err.value) and "expert axis of 3" in str(err.value)


def test_routing_groups_depend_on_the_tokens_alone():
    assert moe.group_size_for(1024, 8 * 2048) == 1024  # a multiple: groups of exactly that
    assert moe.group_size_for(1024, 3) == 3  # a decoding step: one group
    assert moe.group_size_for(6, 16) == 4  # 3 groups would not split 16: 4 of 4
    assert moe.group_size_for(1024, 12000) == 1000  # 12 groups of 1000
    assert moe.group_size_for(4, 7) == 1  # a prime: single tokens
    cfg = dataclasses.replace(MOE, moe_group_size=6, num_layers=1)  # one layer routes them
    model = DecoderOnlyModel(cfg)
    # compiled, the init and the forward (op by op they took seconds of CPU)
    variables = jax.jit(lambda key: model.init(key, 2, {"targets": 8}))(jax.random.PRNGKey(0))
    batch = model.dummy_batch(2, {"targets": 8})
    assert jax.jit(model.logits)(variables, batch).shape == (2, 8, 64)


def test_too_many_drops_warn_once(caplog):
    from t5lite.runtime.step_duties import DropWarning
    warning = DropWarning(share=0.1)
    with caplog.at_level("WARNING"):
        warning.check(1, {"loss": 1.0})  # a dense model: nothing to say
        warning.check(2, {"moe/dropped_fraction": 0.05})
        warning.check(3, {"moe/dropped_fraction": 0.25})
        warning.check(4, {"moe/dropped_fraction": 0.5})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "step 3" in lines[0] and "25.0%" in lines[0]
    assert "CAPACITY_FACTOR" in lines[0]


# ----------------------------------------------------------------------------- configs

def _glam_by_hand(layers, d, ff, heads, hd, experts, vocab=50304):
    """Pax's GLaM layout: shared embedding, per layer q/k/v/o, a relative-bias table
    [heads, 32] and two RMSNorm scales; odd layers a gated GELU MLP (3 d ff), even ones 64
    two-matrix ReLU experts and a router; a final norm."""
    attention = 4 * d * heads * hd + heads * 32 + 2 * d
    dense = attention + 3 * d * ff
    sparse = attention + experts * 2 * d * ff + d * experts
    total = vocab * d + layers // 2 * (dense + sparse) + d
    active = total - layers // 2 * (experts - 2) * 2 * d * ff
    return total, active


def _mixtral_by_hand(layers=32, d=4096, ff=14336, heads=32, kv=8, hd=128, experts=8,
                     vocab=32000):
    attention = d * heads * hd * 2 + d * kv * hd * 2
    layer = attention + experts * 3 * d * ff + d * experts + 2 * d
    total = 2 * vocab * d + layers * layer + d
    return total, total - layers * (experts - 2) * 3 * d * ff


@pytest.mark.parametrize("gin_file,by_hand,published", [
    ("models/glam/126m_64e.gin", _glam_by_hand(12, 768, 3072, 12, 64, 64), 1_921_670_400),
    ("models/glam/64b_64e.gin", _glam_by_hand(64, 8192, 32768, 64, 128, 64),
     1_142_891_356_160),
    ("models/mixtral/8x7b.gin", _mixtral_by_hand(), 46_702_792_704),
])
def test_moe_parameter_counts(gin_file, by_hand, published):
    from t5lite.config import parsing
    from t5lite.tools import footprint
    parsing.parse_gin([gin_file], [])
    model = parsing.resolve_macro("MODEL")
    params = footprint.abstract_params(model)
    assert footprint.param_count(params) == by_hand[0] == published
    assert footprint.active_param_count(model, params) == by_hand[1]
    if "mixtral" in gin_file:
        assert by_hand[1] == 12_879_925_248  # Mistral's published active count


def test_moe_flops_count_the_active_experts():
    from t5lite.models import flops
    dense = dataclasses.replace(MOE, num_experts=0)
    per_token = flops.decoder_only_train_flops_per_token
    d, ff = MOE.emb_dim, MOE.mlp_dim
    extra = MOE.num_layers * 3 * ((2 - 1) * 2 * d * ff * 3 + 2 * d * MOE.num_experts)
    assert per_token(MOE, 8) - per_token(dense, 8) == extra


MOE_WRONG = {
    "NUM_EXPERTS": ["'x'", "-1", "1.5"], "MOE_EVERY": ["0", "'x'"], "MOE_TOP_K": ["0", "9"],
    "EXPERT_MLP": ["'swish'"], "ROUTING": ["'sinkhorn'", "3"],
    "CAPACITY_FACTOR": ["0.0", "-1", "'x'"], "EVAL_CAPACITY_FACTOR": ["0"],
    "MOE_GROUP_SIZE": ["0", "'x'"], "ROUTER_AUX_LOSS": ["-1", "'x'"], "ROUTER_Z_LOSS": ["-0.5"],
}


def test_moe_macros_wrong_in_type_or_range_are_one_line(tmp_path):
    """The run macros of a mixture of experts (on the tiny Mixtral), each wrong, and an
    expert count the mesh's expert axis does not divide: one `error:` line each, naming
    the macro, status 2, no traceback (all in one process, with 8 devices, as
    test_bad_input's cases)."""
    import train_helpers as th
    cases = [(m, v) for m, values in MOE_WRONG.items() for v in values]

    def argv(i, *extra):
        return th.train_command(tmp_path / f"run{i}", "--gin.TASK_FEATURE_LENGTHS={'targets': 16}",
                                *extra, model="mixtral", steps=2)[3:]

    *runs, proc = th.run_mains(
        [argv(i, f"--gin.{m}={v}")
         for i, (m, v) in enumerate(cases)]
        # 6 experts over an expert axis of 4 (8 devices: data 2 x expert 4)
        + [argv("e", "--gin.NUM_EXPERTS=6", "--gin.ICI_MESH_SHAPE=[2,1,1,4]")], devices=8)
    bad = [(m, v, p.returncode, p.stderr[-300:]) for (m, v), p in zip(cases, runs)
           if p.returncode != 2 or len(th.error_lines(p.stderr)) != 1
           or "Traceback" in p.stderr or m not in th.error_lines(p.stderr)[0]]
    assert not bad, bad
    lines = th.error_lines(proc.stderr)
    assert proc.returncode in (1, 2) and len(lines) == 1 and "Traceback" not in proc.stderr, \
        proc.stderr[-500:]
    assert "NUM_EXPERTS=6 does not divide over the mesh's expert axis of 4" in lines[0]


# ----------------------------------------------------------------------------- checkpoints

def test_checkpoint_saved_on_8_restores_on_1_and_4_with_factored_adafactor(tmp_path):
    """Two Adafactor steps on data 1 x fsdp 2 x expert 4 (each expert's kernel factored:
    the expert axis is a batch axis), saved; restored onto one device and onto an expert
    axis of 4, every array equal to what was saved, and one more step on the expert axis
    of 4 equal to the step taken on the 8 (float reordering only). (One device's step
    equal to an expert mesh's: test_expert_meshes_match_one_device.)"""
    from t5lite.optim import optimizers
    from t5lite.runtime.checkpointing.checkpoints import Checkpointer
    cfg = dataclasses.replace(MOE, moe_every=2, num_layers=2)
    model = DecoderOnlyModel(cfg)
    tx = optimizers.adafactor(0.01, min_dim_size_to_factor=8).transformation(
        model.logical_axes()["params"])
    lengths = {"targets": 8}
    task = SyntheticTask(lengths, cfg.vocab_size, "decoder_only", seed=3)

    def setup(mesh_shape):
        devices = jax.devices()[:int(np.prod(mesh_shape))]
        part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape, devices=devices))
        return part, train_step.make_train_step(model, tx, part, lengths=lengths)

    def step(part, fns, state, i):
        batch = part.host_to_global(task.global_batch(i, 16), part.data_layout(16))
        return fns.train_step(state, batch)

    part8, fns8 = setup((1, 2, 1, 4))
    state = fns8.init(jax.random.PRNGKey(0))
    for i in range(2):
        state, _ = step(part8, fns8, state, i)
    saved = jax.device_get(state)
    factored = {jax.tree_util.keystr(p).split("[")[1]: x.shape for p, x in
                jax.tree_util.tree_leaves_with_path(saved.opt_state)
                if "['layers_0']['mlp']['wi_0']" in jax.tree_util.keystr(p)}
    # [expert 8, embed 32, mlp 48]: per expert, a row [32] and a column [48] statistic
    assert factored == {"1].v_row": (8, 32), "1].v_col": (8, 48), "1].v": (1,)}, factored
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(2, state, {"i": 2})
        ckpt.wait()
        after8 = jax.device_get(step(part8, fns8, state, 2)[0])  # the step donates `state`
        for mesh_shape in [(1, 1, 1), (1, 1, 1, 4)]:
            part, fns = setup(mesh_shape)
            target = jax.tree_util.tree_map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                fns.abstract_state, fns.state_shardings)
            restored, data = ckpt.restore(2, target)
            assert data == {"i": 2}
            jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(restored),
                                   saved)
            if mesh_shape == (1, 1, 1):
                continue
            after = jax.device_get(step(part, fns, restored, 2)[0])
            jax.tree_util.tree_map(
                lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                after.params, after8.params)


def test_dense_weights_are_split_over_the_expert_axis_too():
    """FSDP over the experts (Pax's GPU GLaM, MaxText): a dense kernel's embed over fsdp x
    expert; an expert kernel's expert dim takes the expert axis, its embed fsdp alone; an
    activation's batch claims data, fsdp and expert, leaving its embed whole."""
    part = partitioning.Partitioner(partitioning.make_mesh((1, 2, 1, 4)))
    P = jax.sharding.PartitionSpec
    assert part.spec_for(("embed", "mlp"), (32, 48)) == P(("fsdp", "expert"), "tensor")
    assert part.spec_for(("expert", "embed", "mlp"), (8, 32, 48)) == P("expert", "fsdp", "tensor")
    assert part.spec_for(("batch", "length", "embed"), (16, 8, 32)) == P(
        ("data", "fsdp", "expert"), None, None)
    assert part.spec_for(("batch", "length", "activation_embed"), (16, 8, 32)) == P(
        ("data", "fsdp", "expert"), None, None)
    split = partitioning.Partitioner(part.mesh, extra_rules=(("activation_embed", "tensor"),))
    assert split.spec_for(("batch", "length", "activation_embed"), (16, 8, 32)) == P(
        ("data", "fsdp", "expert"), None, "tensor")
    # without an expert axis, the rule is plain FSDP, spelled as it always was
    part = partitioning.Partitioner(partitioning.make_mesh((1, 8, 1)))
    assert part.spec_for(("embed", "mlp"), (32, 48)) == P("fsdp", "tensor")


def test_the_expert_axis_moves_tokens_with_all_to_all():
    """Capacity routing over an expert axis of 8: the dispatched tokens cross the axis in
    all-to-alls (one each way a layer, forward and backward), and the tokens are never
    gathered whole onto every device."""
    model = DecoderOnlyModel(MOE)
    part = partitioning.Partitioner(partitioning.make_mesh((1, 1, 1, 8)))
    fns = train_step.make_train_step(model, optax.sgd(0.1), part, lengths={"targets": 8})
    batch = {k: jax.ShapeDtypeStruct((16, 8), v.dtype)
             for k, v in model.dummy_batch(16, {"targets": 8}).items()}
    state = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                   fns.abstract_state, fns.state_shardings)
    text = fns.train_step.lower(state, batch).compile().as_text()
    # the all-to-alls that carry tokens: their arrays end in the embed dim (32)
    moved = [m.group(1) for m in re.finditer(r"= \(?f32\[([\d,]+)\]\S*.*? all-to-all\(", text)]
    assert sum(shape.endswith(",32") for shape in moved) == 4 * MOE.num_layers, moved
    # all the groups' tokens (or the slots' padded copy), gathered onto every device
    assert not re.search(r"f32\[16,\d+,32\]\S* all-gather\(", text)


# ----------------------------------------------------------------------------- a run

RESUME_RUNS = {  # devices: [(gin_file, feature lengths, a router statistic logged)]
    8: [("configs/models/glam/tiny.gin", "{'targets': 16}", "moe/dropped_fraction/layer_2"),
        ("configs/models/switch/tiny.gin", "{'inputs': 16, 'targets': 16}",
         "moe/dropped_fraction/encoder/layer_1")],
    1: [("configs/models/switch/tiny.gin", "{'inputs': 16, 'targets': 16}",
         "moe/dropped_fraction/decoder/layer_1")]}


@pytest.mark.parametrize("devices", [8, 1])
def test_a_moe_run_resumes_bit_exact_on_an_expert_mesh(tmp_path, devices):
    """`python -m t5lite.train` on the tiny GLaM (decoder-only) and the tiny Switch T5
    (capacity routing, dense and sparse layers; both with 512 vocabulary entries, the
    GLaM with 3 layers) over data 2 x expert 4 (and the Switch on one device): 4 steps
    saved at 2 and 4; a second run, from a copy holding only step 2, resumes there and
    ends at step 4 with the very same state, and the log line shows the routers'
    statistics.

    All the runs of a device count share one interpreter (th.run_mains): the first runs,
    then (th.Between) the copies made, then the second runs. (A process of its own for
    each run proves nothing more here: test_train_cli.py's crash and preemption tests
    resume real subprocesses.)"""
    import train_helpers as th
    mesh = "[2, 1, 1, 4]" if devices == 8 else "[1, 1, 1, 1]"
    runs = RESUME_RUNS[devices]
    cmds = []
    for i, (gin_file, lengths, _) in enumerate(runs):
        # a 512-entry vocabulary: the real ones (50,304 / 32,128) would be most of each
        # step and save, and what is under test is the routers' state and the resume;
        # GLaM's stack cut to 3 layers (sparse, dense, sparse: layer_2 still routes), the
        # Switch's 2 + 2 as shipped (its sparse layer_1s)
        vocab = (("--gin.DecoderConfig.vocab_size=512", "--gin.DecoderConfig.num_layers=3")
                 if "glam" in gin_file else ("--gin.T5Config.vocab_size=512",))
        args = (f"--gin.ICI_MESH_SHAPE={mesh}", "--gin.CHECKPOINT_PERIOD=2",
                "--gin.LOG_PERIOD=1", f"--gin.TASK_FEATURE_LENGTHS={lengths}",
                "--gin.MOE_GROUP_SIZE=16", "--gin.CAPACITY_FACTOR=1.0", *vocab)
        cmd = th.train_command(tmp_path / f"a{i}", *args, steps=4)
        cmd[3] = f"--gin_file={gin_file}"
        cmds.append(cmd[3:])
    seconds = [[c.replace(str(tmp_path / f"a{i}"), str(tmp_path / f"b{i}")) for c in cmd]
               for i, cmd in enumerate(cmds)]
    # each first run's directory copied, without its step 4 (a first run that left no
    # checkpoint to copy fails the run_mains call, which then says why)
    copies = [(str(tmp_path / f"a{i}"), str(tmp_path / f"b{i}"),
               str(th.checkpoints_dir(tmp_path / f"b{i}") / "4")) for i in range(len(runs))]
    copies = th.Between(f"import shutil\nfor a, b, step_4 in {copies!r}:\n"
                        "    shutil.copytree(a, b)\n    shutil.rmtree(step_4)\n")
    done = th.run_mains(cmds + [copies] + seconds, devices=devices,
                        timeout=2 * len(cmds) * th.DEFAULT_TIMEOUT)
    firsts, seconds = done[:len(cmds)], done[len(cmds):]
    for i, ((_, _, layer_stat), first) in enumerate(zip(runs, firsts)):
        assert first.returncode == 0, th.describe(first)
        assert th.complete_steps(tmp_path / f"a{i}") == [2, 4]
        assert layer_stat in first.stderr and "moe/aux_loss" in first.stderr
    for i, second in enumerate(seconds):
        assert second.returncode == 0, th.describe(second)
        assert "start: resume:2 at step 2" in second.stderr, th.describe(second)
        a = th.flat(th.load_state(tmp_path / f"a{i}", 4))
        b = th.flat(th.load_state(tmp_path / f"b{i}", 4))
        assert a.keys() == b.keys() and any("mlp']['router" in k for k in a)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
