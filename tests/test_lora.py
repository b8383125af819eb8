"""LoRA (t5lite.models.lora): adapters that start as the identity, train alone while the
base stays bit-identical, merge into the kernels, shard under every mesh, and refuse bad
settings in one line. Tiny float32 models on CPU."""
import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import initial_states
from t5lite.config import command, parsing
from t5lite.data.synthetic import SyntheticTask
from t5lite.errors import ConfigError
from t5lite.models import layouts, lora
from t5lite.models.common import layers
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.model import model_for_config
from t5lite.models.common.param_paths import flatten
from t5lite.optim import optimizers
from t5lite.runtime import partitioning, run, train_step

T5 = T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
              num_decoder_layers=2, mlp_dim=64, relpos_num_buckets=8, relpos_max_distance=16,
              dtype="float32")
LLAMA = DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                      num_layers=2, mlp_dim=64, dtype="float32")
GPT = DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, num_layers=2,
                    mlp_dim=64, dtype="float32", norm_type="layer", position_embedding="learned",
                    max_length=16, mlp_activations=("gelu",), use_bias=True, tie_embeddings=True)
FAMILIES = {"t5": T5, "llama": LLAMA, "gpt": GPT}
BATCH = 8
# LoRA rank 4 on every projection the family has
ALL = {"lora_rank": 4, "lora_alpha": 8.0}


def _lora(cfg, **overrides):
    settings = {**ALL, "lora_targets": lora.valid_targets(cfg), **overrides}
    return dataclasses.replace(cfg, **settings)


def _kind(cfg):
    return "encoder_decoder" if isinstance(cfg, T5Config) else "decoder_only"


def _lengths(cfg):
    return {"inputs": 12, "targets": 8} if isinstance(cfg, T5Config) else {"targets": 8}


def _batch(cfg, step=0):
    task = SyntheticTask(model_for_config(cfg).feature_lengths(_lengths(cfg)), cfg.vocab_size,
                         _kind(cfg), seed=3)
    return {k: jnp.asarray(v) for k, v in task.global_batch(step, BATCH).items()}


def _adapters(params):
    return {k: v for k, v in flatten(params).items() if k.rsplit("/", 1)[-1].startswith("lora_")}


def _init(model):
    """`model.init(PRNGKey(0))` in one compiled program (op by op, a tiny T5's init
    compiled each of its ops on CPU, several seconds)."""
    return jax.jit(model.init)(jax.random.PRNGKey(0))


_JITTED = {}


def _logits(cfg):
    """`model_for_config(cfg).logits`, jitted once a config for the module (op by op, each
    primitive of the forward compiled a program of its own)."""
    if cfg not in _JITTED:
        _JITTED[cfg] = jax.jit(model_for_config(cfg).logits)
    return _JITTED[cfg]


def _randomize_b(params, seed=1):
    """Nonzero B everywhere (a fresh adapter is the identity, which would hide bugs);
    drawn by NumPy (a jax draw compiled a program for each shape)."""
    rng = np.random.RandomState(seed)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.asarray(0.1 * rng.normal(size=x.shape), x.dtype)
        if str(p[-1].key) == "lora_b" else x, params)


# ----------------------------------------------------------------------------- function


SWITCHES = {"plain": {}, "fused": {"fuse_qkv": True}, "scanned": {"scan_layers": True},
            "fused-scanned-transposed": {"fuse_qkv": True, "scan_layers": True,
                                         "transpose_bs": True}}
# Each switch alone on T5; the decoder-only families plain and with every switch at once
# (a fused or scanned layer is the same module code with or without the other switches).
FRESH_CASES = [(f, n) for f in FAMILIES for n in SWITCHES
               if f == "t5" or n in ("plain", "fused-scanned-transposed")]


@pytest.mark.parametrize("family,switches", [(f, SWITCHES[n]) for f, n in FRESH_CASES],
                         ids=[f"{n}-{f}" for f, n in FRESH_CASES])
def test_fresh_adapters_give_the_base_logits_exactly(family, switches):
    cfg = dataclasses.replace(FAMILIES[family], **switches)
    model = model_for_config(_lora(cfg))
    params = _init(model)
    adapters = _adapters(params["params"])
    assert adapters and all(not np.any(v) for k, v in adapters.items() if k.endswith("lora_b"))
    base = {"params": model.split_trainable(params["params"])[1]}
    batch = _batch(cfg)
    np.testing.assert_array_equal(_logits(_lora(cfg))(params, batch), _logits(cfg)(base, batch))


@pytest.mark.parametrize("family", ["t5", "llama"])
def test_fused_adapters_are_one_per_projection(family):
    """Trained (nonzero) adapters convert between the fused and unfused layouts and give
    the same logits: the fused kernel keeps q, k and v's own adapters."""
    cfg = _lora(FAMILIES[family])
    params = _randomize_b(_init(model_for_config(cfg)))
    fused_cfg = dataclasses.replace(cfg, fuse_qkv=True, scan_layers=True)
    fused = layouts.convert_params(params, cfg, fused_cfg)
    att = fused["params"]["decoder"]["layers"]["self_attention"]["qkv"]
    group = cfg.num_heads // cfg.kv_heads
    assert att["lora_a"].shape == (2, cfg.emb_dim, 3, 4)
    assert att["lora_b"].shape == (2, 4, group + 2, cfg.kv_heads, cfg.head_dim)
    batch = _batch(cfg)
    want = _logits(cfg)(params, batch)
    np.testing.assert_allclose(_logits(fused_cfg)(fused, batch), want, atol=1e-5)
    back = layouts.convert_params(fused, fused_cfg, cfg)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)


@pytest.mark.parametrize("n_in", [1, 2])
def test_one_projection_against_numpy(n_in):
    """y = x W + (alpha / r) (x A) B, by hand, for a q-like [embed] -> [heads, kv]
    projection (n_in 1) and an out-like [heads, kv] -> [embed] one (n_in 2)."""
    rank, alpha = 3, 6.0
    spec = lora.LoraSpec(rank, alpha, 0.0, ("query",))
    features, axes = ((4, 5), ("embed", "heads", "kv")) if n_in == 1 else \
        ((6,), ("heads", "kv", "embed"))
    x = np.random.RandomState(0).randn(2, 7, *((6,) if n_in == 1 else (4, 5))).astype(np.float32)
    dense = layers.Dense(features, axes, n_in=n_in, dtype=jnp.float32, lora=spec)
    # jitted: op by op, each primitive compiled a program of its own
    params = nn.meta.unbox(jax.jit(dense.init)(jax.random.PRNGKey(0), x))["params"]
    rng = np.random.RandomState(1)
    params = {"kernel": params["kernel"], "lora_a": params["lora_a"],
              "lora_b": rng.randn(*params["lora_b"].shape).astype(np.float32)}
    assert params["lora_a"].shape == x.shape[2:] + (rank,)
    assert params["lora_b"].shape == (rank,) + features
    y = np.asarray(jax.jit(dense.apply)({"params": params}, x))
    flat_x = x.reshape(14, -1).astype(np.float64)
    w = np.asarray(params["kernel"], np.float64).reshape(flat_x.shape[1], -1)
    a = np.asarray(params["lora_a"], np.float64).reshape(flat_x.shape[1], rank)
    b = np.asarray(params["lora_b"], np.float64).reshape(rank, -1)
    want = (flat_x @ w + (alpha / rank) * (flat_x @ a) @ b).reshape(y.shape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_lora_dropout_only_in_training():
    cfg = _lora(LLAMA, lora_dropout=0.5)
    model = model_for_config(cfg)
    params = _randomize_b(_init(model))
    batch = _batch(cfg)
    logits = _logits(cfg)
    plain = _logits(dataclasses.replace(cfg, lora_dropout=0.0))
    np.testing.assert_array_equal(logits(params, batch), plain(params, batch))
    assert not np.allclose(logits(params, batch, jax.random.PRNGKey(1)), logits(params, batch))


# ----------------------------------------------------------------------------- training


def _train(cfg, mesh_shape=(1, 1, 1), steps=3, num_microbatches=1, tx=None):
    model = model_for_config(cfg)
    devices = jax.devices()[:int(np.prod(mesh_shape))]
    part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape, devices=devices))
    fns = train_step.make_train_step(model, tx or optax.adam(1e-2), part,
                                     num_microbatches=num_microbatches, lengths=_lengths(cfg))
    # the default optimizer's initial state made once per config (tests/initial_states.py)
    state = (fns.init(jax.random.PRNGKey(0)) if tx is not None else
             initial_states.get(fns, key=(cfg, "adam")))
    first = jax.device_get(state)
    task = SyntheticTask(model.feature_lengths(_lengths(cfg)), cfg.vocab_size, _kind(cfg), 3)
    losses = []
    for step in range(steps):
        batch = part.host_to_global(task.global_batch(step, BATCH), part.data_layout(BATCH))
        state, metrics = fns.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    return model, first, jax.device_get(state), losses, state


# Some projections of each family adapted, the rest not. The llama's are the checkpoint
# test's too: the same train step, compiled once.
SOME_TARGETS = {"t5": ("query", "value", "out", "wi_0", "wo"),
                "llama": ("query", "value", "out", "wi_1")}


@pytest.mark.parametrize("family", ["t5", "llama"])
def test_training_moves_only_the_adapters_and_merges(family):
    cfg = _lora(FAMILIES[family], lora_targets=SOME_TARGETS[family])
    model, first, last, losses, _ = _train(cfg)
    assert np.all(np.isfinite(losses))
    before, after = flatten(first.params["params"]), flatten(last.params["params"])
    adapters = _adapters(last.params["params"])
    assert set(before) == set(after) and adapters
    for name in before:
        if name in adapters:
            continue
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)  # bit-identical
    assert all(np.any(after[n] != before[n]) for n in adapters if n.endswith("lora_b"))
    # Adam's state: the step count, and mu and nu of each adapter, nothing else
    shapes = sorted(tuple(v.shape) for v in adapters.values())
    state = [tuple(x.shape) for x in jax.tree_util.tree_leaves(last.opt_state)]
    assert sorted(s for s in state if s) == sorted(shapes * 2)
    assert len(state) == 2 * len(adapters) + state.count(())
    # merged: no adapters, base kernels moved by (alpha / r) B A, the same function
    merged, merged_cfg = lora.merge_lora(last.params, cfg)
    assert not _adapters(merged["params"]) and merged_cfg.lora_rank == 0
    assert set(flatten(merged["params"])) == set(before) - set(adapters)
    batch = _batch(cfg, step=5)
    want = _logits(cfg)(last.params, batch)
    got = _logits(merged_cfg)(merged, batch)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("switches", [{"fuse_qkv": True, "scan_layers": True},
                                      {"scan_layers": True}], ids=["fused-scanned", "scanned"])
def test_merge_in_the_fused_and_scanned_layouts(switches):
    cfg = _lora(dataclasses.replace(LLAMA, **switches))
    model = model_for_config(cfg)
    params = _randomize_b(_init(model))
    merged, merged_cfg = lora.merge_lora(params, cfg)
    batch = _batch(cfg)
    np.testing.assert_allclose(_logits(merged_cfg)(merged, batch),
                               _logits(cfg)(params, batch), atol=2e-5, rtol=1e-5)


def _dot_output_shapes(cfg):
    """The output shapes of every dot_general in the lowered train step, and the base
    kernels' shapes."""
    model = model_for_config(cfg)
    part = partitioning.Partitioner(partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    fns = train_step.make_train_step(model, optax.adam(1e-2), part, lengths=_lengths(cfg))
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in _batch(cfg).items()}
    text = fns.train_step.lower(fns.abstract_state, batch).as_text()
    outs = {tuple(int(d) for d in m.split("x")[:-1])
            for m in re.findall(r"stablehlo\.dot_general.*-> tensor<([0-9x]+x?f32)>", text)}
    frozen = model.split_trainable(fns.abstract_state.params["params"])[1] or \
        fns.abstract_state.params["params"]
    kernels = {tuple(v.shape) for k, v in flatten(frozen).items() if k.endswith("kernel")}
    return outs, kernels


def test_no_gradient_of_the_base_is_computed():
    """No dot of the LoRA step yields a base kernel's shape (a weight gradient would);
    without LoRA the same step has them."""
    outs, kernels = _dot_output_shapes(LLAMA)
    assert kernels & outs  # the weight gradients of full training
    outs, kernels = _dot_output_shapes(_lora(LLAMA))
    assert not kernels & outs, kernels & outs


def test_checkpoints_hold_base_and_adapters_and_resume_exactly(tmp_path):
    from t5lite.runtime.checkpointing.checkpoints import Checkpointer
    cfg = _lora(LLAMA, lora_targets=SOME_TARGETS["llama"])
    model = model_for_config(cfg)
    part = partitioning.Partitioner(partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    fns = train_step.make_train_step(model, optax.adam(1e-2), part, lengths=_lengths(cfg))
    task = SyntheticTask(model.feature_lengths(_lengths(cfg)), cfg.vocab_size, _kind(cfg), 3)

    def steps(state, start, stop):
        for step in range(start, stop):
            batch = part.host_to_global(task.global_batch(step, BATCH), part.data_layout(BATCH))
            state, _ = fns.train_step(state, batch)
        return state

    whole = jax.device_get(steps(fns.init(jax.random.PRNGKey(0)), 0, 3))
    abstract = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), fns.abstract_state,
        fns.state_shardings)
    with Checkpointer(tmp_path, keep=None, async_save=False) as ckpt:
        ckpt.save(2, steps(fns.init(jax.random.PRNGKey(0)), 0, 2), force=True)
        ckpt.wait()
        restored, _ = ckpt.restore(2, abstract)
    names = flatten(restored.params["params"])
    assert "decoder/layers_0/self_attention/query/kernel" in names
    assert "decoder/layers_0/self_attention/query/lora_b" in names
    resumed = jax.device_get(steps(restored, 2, 3))
    jax.tree_util.tree_map(np.testing.assert_array_equal, resumed, whole)


_RUNS = {}


def _two_steps(cfg, mesh_shape):
    """_train(cfg, mesh_shape, steps=2), run once for the module: the data-parallel
    reference of the sharded step and of the microbatches."""
    if (cfg, mesh_shape) not in _RUNS:
        _RUNS[cfg, mesh_shape] = _train(cfg, mesh_shape, steps=2)
    return _RUNS[cfg, mesh_shape]


def test_microbatches_match_the_whole_batch():
    """Two microbatches (one device) take the whole batch's steps (its steps taken data
    parallel on 8 devices, test_fsdp_tensor_step_matches_data_parallel's reference)."""
    cfg = _lora(LLAMA)
    *_, one, losses_1, _ = _two_steps(cfg, (8, 1, 1))
    *_, two, losses_2, _ = _train(cfg, steps=2, num_microbatches=2)
    np.testing.assert_allclose(losses_2, losses_1, rtol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4),
                           two.params, one.params)


def test_build_run_with_adafactor_and_native_fp8():
    """The run's optimizer (Adafactor, factored by the adapters' axis names) and FP8:
    the FP8 state still updates, the base stays put."""
    cfg = _lora(dataclasses.replace(LLAMA, fp8=True), lora_targets=("query", "value"))
    data = run.TrainData("synthetic", {"targets": 8}, batch_size=BATCH, seed=0, pack=False)
    the_run = run.build_run(model=model_for_config(cfg), data=data,
                            optimizer=optimizers.adafactor(1e-2), devices=jax.devices()[:1])
    state = the_run.step_fns.init(jax.random.PRNGKey(0))
    first = jax.device_get(state)
    for _ in range(2):
        state, metrics = the_run.step_fns.train_step(state, the_run.next_batch())
    last = jax.device_get(state)
    assert np.isfinite(float(metrics["loss"]))
    base = the_run.model.split_trainable(first.params["params"])[1]
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           the_run.model.split_trainable(last.params["params"])[1], base)
    assert any(np.any(a != b) for a, b in zip(jax.tree_util.tree_leaves(last.fp8),
                                              jax.tree_util.tree_leaves(first.fp8)))


# ----------------------------------------------------------------------------- sharding


def test_adapters_shard_like_their_kernels():
    cfg = _lora(LLAMA)
    model = model_for_config(cfg)
    part = partitioning.Partitioner(partitioning.make_mesh((2, 2, 2)))
    fns = train_step.make_train_step(model, optax.adam(1e-2), part, lengths=_lengths(cfg))
    specs = {k: s.spec for k, s in flatten(fns.state_shardings.params["params"]).items()}
    layer = "decoder/layers_0/"
    want = {"self_attention/query/lora_a": P("fsdp", None),
            "self_attention/query/lora_b": P(None, "tensor", None),
            "self_attention/key/lora_b": P(None, "tensor", None),
            "self_attention/out/lora_a": P("tensor", None, None),
            "self_attention/out/lora_b": P(None, "fsdp"),
            "mlp/wi_0/lora_a": P("fsdp", None), "mlp/wi_0/lora_b": P(None, "tensor"),
            "mlp/wo/lora_a": P("tensor", None), "mlp/wo/lora_b": P(None, "fsdp")}
    for name, spec in want.items():
        assert specs[layer + name] == spec, name
    # Adam's moments shard like their adapters
    mu = flatten(fns.state_shardings.opt_state[0].mu)
    assert mu[layer + "self_attention/query/lora_b"].spec == P(None, "tensor", None)
    scanned = dataclasses.replace(cfg, scan_layers=True, fuse_qkv=True)
    axes = flatten(model_for_config(scanned).logical_axes()["params"])
    assert axes["decoder/layers/self_attention/qkv/lora_a"] == \
        P("layers", "embed", "stack", "lora_rank")
    assert axes["decoder/layers/self_attention/qkv/lora_b"] == \
        P("layers", "lora_rank", "stack", "heads", "kv")


@pytest.mark.parametrize("family", ["t5", "llama"])
def test_fsdp_tensor_step_matches_data_parallel(family):
    # one layer a side for the T5 (the shardings are a parameter kind's, not a depth's;
    # its two programs compile faster)
    depth = {"num_encoder_layers": 1, "num_decoder_layers": 1} if family == "t5" else {}
    cfg = _lora(dataclasses.replace(FAMILIES[family], **depth))
    *_, ref, ref_losses, _ = _two_steps(cfg, (8, 1, 1))
    *_, got, losses, sharded = _train(cfg, (1, 4, 2), steps=2)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4),
                           got.params, ref.params)
    b = sharded.params["params"]["decoder"]["layers_0"]["self_attention"]["query"]["lora_b"]
    assert b.sharding.spec == P(None, "tensor", None)


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("overrides,needle", [
    (dict(lora_rank=4, lora_targets=("quary",)), "LORA_TARGETS names 'quary'.*query, key"),
    (dict(lora_rank=4, lora_targets=("wi",)), "LORA_TARGETS names 'wi'.*wi_0, wi_1, wo"),
    (dict(lora_rank=0, lora_targets=("query",)), "LORA_RANK=0"),
    (dict(lora_rank=None, lora_targets=("query",)), "LORA_RANK=None"),
    (dict(lora_rank=4, lora_targets=()), "LORA_RANK=4 adapts nothing"),
    (dict(lora_rank=17, lora_targets=("key",)), "LORA_RANK=17 exceeds .* key .*32 -> 16"),
    (dict(lora_rank=-1), "LORA_RANK must be"),
    (dict(lora_rank=4, lora_targets=("query",), lora_alpha=-1.0), "LORA_ALPHA must be"),
    (dict(lora_rank=4, lora_targets=("query",), lora_dropout=1.0), "LORA_DROPOUT must be"),
    (dict(lora_rank=4, lora_targets=("query",), lora_dropout=-0.1), "LORA_DROPOUT must be"),
    (dict(lora_rank=4, lora_targets=("query", "value"), fuse_qkv=True),
     "FUSE_QKV=True .*LORA_TARGETS must name all three"),
    (dict(lora_rank=4, lora_targets=("query",), fp8=True, fp8_backend="te"),
     "FP8_BACKEND='te'"),
])
def test_bad_settings_are_one_line(overrides, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        dataclasses.replace(LLAMA, **overrides)
    assert "\n" not in str(e.value)


def test_gin_macros_reach_both_families_and_refuse_in_one_line():
    parsing.parse_gin(["models/t5_1_1/tiny.gin"],
                      ["LORA_RANK = 8", "LORA_TARGETS = ['query', 'value', 'wo']"])
    cfg = parsing.resolve_macro("MODEL").config
    assert (cfg.lora_rank, cfg.lora_targets, cfg.lora_alpha) == (8, ("query", "value", "wo"),
                                                                 16.0)
    parsing.parse_gin(["models/llama2/tiny.gin"], ["LORA_RANK = 8", "LORA_TARGETS = ['out']"])
    assert parsing.resolve_macro("MODEL").config.lora_targets == ("out",)
    parsing.parse_gin(["models/gpt/tiny.gin"], ["LORA_RANK = 8", "LORA_TARGETS = ['wi_0']"])
    with pytest.raises(ConfigError, match="LORA_TARGETS names 'wi_0'.*out, wi, wo") as e:
        parsing.resolve_macro("MODEL")
    assert "\n" not in command.one_line(e.value)  # less gin's "In call to" lines
