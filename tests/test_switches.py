"""The performance switches are switches on one function: for the same weights every
combination of fused QKV, transposed layout and scan over layers (and every remat policy
and attention implementation) gives the same float32 logits; FP8 stays close to bf16."""
import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models.common import layers as model_layers
from t5lite.models import layouts
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.model import DecoderOnlyModel, EncoderDecoderModel

T5_TINY = T5Config(vocab_size=96, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
                   num_decoder_layers=3, mlp_dim=48, relpos_num_buckets=8, relpos_max_distance=12,
                   dtype="float32")
LLAMA_TINY = DecoderConfig(vocab_size=96, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                           num_layers=3, mlp_dim=48, dtype="float32")
GPT_TINY = DecoderConfig(vocab_size=96, emb_dim=32, num_heads=4, head_dim=8, num_layers=2,
                         mlp_dim=64, mlp_activations=("gelu",), norm_type="layer",
                         position_embedding="learned", max_length=32, use_bias=True,
                         tie_embeddings=True, dtype="float32")


def make_model(cfg):
    return (EncoderDecoderModel if isinstance(cfg, T5Config) else DecoderOnlyModel)(cfg)


def init_params(cfg):
    """`cfg`'s parameters at PRNGKey(0), drawn in one compiled program (op by op, a tiny
    T5's init took seconds of CPU; the programs of configs that differ only in settings
    the init does not read are the same, and compile once)."""
    return jax.jit(make_model(cfg).init)(jax.random.PRNGKey(0))


def t5_batch(packed=False):
    rng = np.random.RandomState(0)
    enc = rng.randint(2, 96, size=(3, 20)).astype(np.int32)
    tgt = rng.randint(2, 96, size=(3, 12)).astype(np.int32)
    enc[1, 14:] = 0  # padding
    tgt[1, 7:] = 0
    batch = {"encoder_input_tokens": enc, "decoder_target_tokens": tgt,
             "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0)))}
    if packed:
        batch["encoder_segment_ids"] = np.array([[1] * 9 + [2] * 11] * 3, np.int32)
        batch["decoder_segment_ids"] = np.array([[1] * 5 + [2] * 7] * 3, np.int32)
        batch["decoder_input_tokens"][:, 5] = 0
    return {k: jnp.asarray(v) for k, v in batch.items()}


def lm_batch(packed=False):
    rng = np.random.RandomState(1)
    tokens = rng.randint(0, 96, size=(3, 17)).astype(np.int32)
    batch = {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:]}
    if packed:
        batch["decoder_segment_ids"] = np.array([[1] * 6 + [2] * 10] * 3, np.int32)
        batch["decoder_positions"] = np.array([list(range(6)) + list(range(10))] * 3, np.int32)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def batch_for(cfg, packed=False):
    return t5_batch(packed) if isinstance(cfg, T5Config) else lm_batch(packed)


CASES = [("t5", T5_TINY), ("llama_gqa", LLAMA_TINY), ("gpt", GPT_TINY)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def reference(request):
    cfg = request.param[1]
    return cfg, init_params(cfg)


_COMPUTED = {}


def _ref_logits(reference, packed, **changes):
    """The logits of the reference parameters under the reference config (with `changes`)
    on batch_for(cfg, packed): computed once a module for each config and batch, and
    read by every test that compares against them."""
    cfg, params = reference
    cfg = dataclasses.replace(cfg, **changes)
    key = ("logits", cfg, packed)
    if key not in _COMPUTED:
        _COMPUTED[key] = make_model(cfg).logits(params, batch_for(cfg, packed))
    return _COMPUTED[key]


def _base_loss_and_grads(cfg, packed=False):
    """value_and_grad of `cfg`'s loss at its init (PRNGKey(0)) parameters on
    batch_for(cfg, packed): computed once a module for each config and batch (the
    reference of the remat policies and of the lengths mask)."""
    key = ("grads", cfg, packed)
    if key not in _COMPUTED:
        model = make_model(cfg)
        params = init_params(cfg)
        batch = batch_for(cfg, packed)
        _COMPUTED[key] = (params, jax.value_and_grad(lambda p: model.loss_fn(p, batch)[0])(
            params))
    return _COMPUTED[key]


def _layout_cases():
    """All 8 switch combinations on an unpacked batch; on a packed batch the two extreme
    combinations by default and the rest under `slow`."""
    cases = []
    for fuse, transpose, scan in itertools.product([False, True], repeat=3):
        cases.append(pytest.param(fuse, transpose, scan, False))
        slow = len({fuse, transpose, scan}) > 1
        cases.append(pytest.param(fuse, transpose, scan, True,
                                  marks=[pytest.mark.slow] if slow else []))
    return cases


@pytest.mark.parametrize("fuse,transpose,scan,packed", _layout_cases())
def test_layout_switches_same_logits(reference, fuse, transpose, scan, packed):
    cfg, params = reference
    batch = batch_for(cfg, packed)
    expected = _ref_logits(reference, packed)
    cfg2 = dataclasses.replace(cfg, fuse_qkv=fuse, transpose_bs=transpose, scan_layers=scan)
    params2 = layouts.convert_params(params, cfg, cfg2)
    model2 = make_model(cfg2)
    # The converted tree has exactly the structure and shapes the switched model inits.
    shapes = jax.tree_util.tree_map(lambda a: a.shape, model2.abstract_variables())
    assert jax.tree_util.tree_map(lambda a: a.shape, params2) == shapes
    got = model2.logits(params2, batch)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_layout_round_trip_is_exact(reference):
    cfg, params = reference
    cfg2 = dataclasses.replace(cfg, fuse_qkv=True, scan_layers=True)
    back = layouts.convert_params(layouts.convert_params(params, cfg, cfg2), cfg2, cfg)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)


def test_host_parameters_convert_in_numpy_like_jax_numpy_and_compile_nothing(reference):
    """Parameters in host memory (this process's jax arrays on CPU devices, as here, or
    numpy's) convert with numpy: numpy arrays back, the values jax.numpy's conversion
    gives under jit (where the leaves are traced), and no XLA program compiled (before,
    one per operation and leaf shape)."""
    from jax._src import monitoring
    cfg, params = reference
    cfg2 = dataclasses.replace(cfg, fuse_qkv=True, scan_layers=True)
    traced = jax.jit(lambda p: layouts.convert_params(p, cfg, cfg2))(params)
    compiled = []

    def count(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)
    monitoring.register_event_duration_secs_listener(count)
    try:
        for tree in (params, jax.device_get(params)):  # jax arrays on the CPU; numpy
            host = layouts.convert_params(tree, cfg, cfg2)
            assert all(isinstance(a, np.ndarray) for a in jax.tree_util.tree_leaves(host))
            jax.tree_util.tree_map(np.testing.assert_array_equal, host, traced)
            back = layouts.convert_params(host, cfg2, cfg)
            jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)
    finally:
        monitoring.unregister_event_duration_listener(count)
    assert compiled == []


def test_fused_gqa_layout_puts_query_groups_first():
    q = jnp.arange(2 * 4 * 3).reshape(2, 4, 3)  # [embed, heads=4, kv]; 2 kv heads, group 2
    k = 100 + jnp.arange(2 * 2 * 3).reshape(2, 2, 3)
    v = 200 + jnp.arange(2 * 2 * 3).reshape(2, 2, 3)
    fused = layouts.fuse_qkv_arrays(q, k, v)
    assert fused.shape == (2, 4, 2, 3)  # [embed, group + 2, kv_heads, kv]
    # query head 3 = kv head 1, group slot 1
    np.testing.assert_array_equal(fused[:, 1, 1], q[:, 3])
    np.testing.assert_array_equal(fused[:, 2], k)
    np.testing.assert_array_equal(fused[:, 3], v)


@pytest.mark.parametrize("name,cfg", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_gemms_that_read_one_input_read_a_chain_of_views_of_it(name, cfg, monkeypatch):
    """Each self-attention's q / k / v projections read three views of the norm's output
    (two taps), and T5's decoder layers, unrolled, read the encoder output as one chain of
    two views a layer (2 * layers - 1 taps): `layers.gemm_input_views` (why:
    tests/test_gpu_compile.py). The loss and the gradients are those of plain reads (the
    tapped ones are the module's shared _base_loss_and_grads, taken with the taps on)."""
    params, (value, grads) = _base_loss_and_grads(cfg)
    batch = batch_for(cfg)

    def loss(p):
        return make_model(cfg).loss_fn(p, batch)[0]

    def taps():  # a new function each time: jax caches a function's traces
        return str(jax.make_jaxpr(lambda p: loss(p))(params)).count("bwd=_gradient_tap_bwd")

    if isinstance(cfg, T5Config):
        expected = 2 * (cfg.num_encoder_layers + cfg.num_decoder_layers) \
            + 2 * cfg.num_decoder_layers - 1
    else:
        expected = 2 * cfg.num_layers
    assert taps() == expected
    monkeypatch.setattr(model_layers, "_gradient_tap", lambda x: x)
    assert taps() == 0
    plain_value, plain_grads = jax.value_and_grad(lambda p: loss(p))(params)
    np.testing.assert_array_equal(value, plain_value)
    # the gradients' sums are added in another order: float32 rounding apart
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5),
                           grads, plain_grads)


def _remat_cases():
    """Every policy on every family; full remat on t5 / llama compiles slowly: `slow`."""
    for name, cfg in CASES:
        for policy in ("full", "minimal", "save_qkv_proj", "save_dot_except_mlp"):
            slow = policy == "full" and name != "gpt"
            yield pytest.param(cfg, policy, id=f"{name}-{policy}",
                               marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("cfg,policy", list(_remat_cases()))
def test_remat_policies_same_loss_and_grads(cfg, policy):
    """The policy's loss and gradients against those without remat (computed once for the
    four policies of a family: _base_loss_and_grads)."""
    params, (loss, grads) = _base_loss_and_grads(cfg)
    batch = batch_for(cfg)
    model2 = make_model(dataclasses.replace(cfg, remat_policy=policy))
    loss2, grads2 = jax.value_and_grad(lambda p: model2.loss_fn(p, batch)[0])(params)
    np.testing.assert_allclose(loss2, loss, rtol=1e-6)
    # recomputation reorders float32 sums: agreement to ~1e-6 relative
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4),
                           grads2, grads)


def test_remat_full_recomputes(reference):
    """With remat 'full' the backward pass recomputes the forward matmuls: more dots in
    the compiled gradient than without remat."""
    cfg, params = reference
    batch = batch_for(cfg)

    def n_dots(c):
        m = make_model(c)
        hlo = jax.jit(jax.grad(lambda p: m.loss_fn(p, batch)[0])).lower(params).as_text()
        return hlo.count("dot_general")

    assert n_dots(dataclasses.replace(cfg, remat_policy="full")) > n_dots(cfg)


def test_jax_nn_attention_implementation_same_logits(reference):
    cfg, params = reference
    batch = batch_for(cfg, packed=True)
    expected = _ref_logits(reference, True)
    for transpose in (False, True):
        cfg2 = dataclasses.replace(cfg, attention_impl="dot_product", transpose_bs=transpose)
        np.testing.assert_allclose(make_model(cfg2).logits(params, batch), expected, atol=1e-5)


def test_dropout_only_with_rng():
    cfg = dataclasses.replace(T5_TINY, dropout_rate=0.3)
    model = make_model(cfg)
    params = init_params(cfg)
    batch = t5_batch()
    a = model.logits(params, batch)
    np.testing.assert_array_equal(a, model.logits(params, batch))
    b = model.logits(params, batch, rng=jax.random.PRNGKey(1))
    c = model.logits(params, batch, rng=jax.random.PRNGKey(2))
    assert not np.allclose(a, b) and not np.allclose(b, c)


def test_bf16_compute_close_to_float32(reference):
    cfg, params = reference
    f32 = _ref_logits(reference, False)
    bf16 = _ref_logits(reference, False, dtype="bfloat16")
    assert bf16.dtype == jnp.float32
    scale = float(jnp.max(jnp.abs(f32)))
    err = float(jnp.max(jnp.abs(bf16 - f32)))
    assert err < 0.05 * scale, (err, scale)


@pytest.mark.parametrize("name,cfg", [
    pytest.param("t5", T5_TINY, marks=pytest.mark.slow),
    pytest.param("llama_gqa", LLAMA_TINY, marks=pytest.mark.slow),
    pytest.param("gpt", GPT_TINY)])
def test_fp8_close_to_bf16_and_uses_f8(name, cfg):
    """Native FP8 (flax fp8 ops): logits within a few percent of bf16 on the same weights;
    the compiled HLO carries f8 types; the FP8 state lives in its own collection."""
    from t5lite.models.common.precision import FP8_COLLECTION
    bf16_cfg = dataclasses.replace(cfg, dtype="bfloat16")
    fp8_cfg = dataclasses.replace(bf16_cfg, fp8=True)
    fp8_model = make_model(fp8_cfg)
    variables = jax.jit(fp8_model.init)(jax.random.PRNGKey(0))  # compiled: cheaper than op by op
    assert set(variables) == {"params", FP8_COLLECTION}
    batch = batch_for(cfg)
    params = {"params": variables["params"]}
    ref = make_model(bf16_cfg).logits(params, batch)
    f32 = make_model(cfg).logits(params, batch)

    def rel(a, b):
        return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))

    # the compiled forward: its logits here, its HLO below
    compiled = jax.jit(fp8_model.logits).lower(variables, batch).compile()
    got = compiled(variables, batch)
    # Measured relative L2 error of FP8 vs bf16 logits on these tiny models (width 32, so
    # little averaging): t5 0.124, llama_gqa 0.089, gpt 0.043; bf16 vs f32: 0.006-0.012.
    assert rel(got, ref) < 0.2, rel(got, ref)
    assert rel(got, ref) > 2 * rel(ref, f32)  # the matmuls really were quantized
    assert "f8e4m3fn" in compiled.as_text()
    grad_hlo = jax.jit(jax.grad(lambda v: fp8_model.loss_fn(v, batch)[0])).lower(
        variables).compile().as_text()
    assert "f8e5m2" in grad_hlo  # output gradients quantized to e5m2


# ------------------------------------------------------- the attention's mask and logits


def _valid(cfg, batch):
    """Where the logits count: a T5's non-padding targets, every decoder-only position."""
    if isinstance(cfg, T5Config):
        return np.asarray(batch["decoder_target_tokens"] > 0)
    return np.ones(batch["decoder_target_tokens"].shape, bool)


@pytest.mark.parametrize("impl", ["xla", "dot_product"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_attention_mask_as_lengths_same_logits(reference, impl, packed):
    """ATTENTION_MASK='lengths' (ids to each layer; jax.nn takes sequence lengths and a
    causal flag when nothing is packed) computes the dense mask's function."""
    cfg, params = reference
    batch = batch_for(cfg, packed)
    expected = np.asarray(_ref_logits(reference, packed))
    cfg2 = dataclasses.replace(cfg, attention_impl=impl, attention_mask="lengths")
    got = np.asarray(make_model(cfg2).logits(params, batch))
    valid = _valid(cfg, batch)
    np.testing.assert_allclose(got[valid], expected[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg,packed", [(T5_TINY, False), (GPT_TINY, True)],
                         ids=["t5_padded", "gpt_packed"])
def test_attention_mask_as_lengths_same_loss_and_grads(cfg, packed):
    params, (loss, grads) = _base_loss_and_grads(cfg, packed)  # t5 padded: remat's base too
    batch = batch_for(cfg, packed)
    cfg2 = dataclasses.replace(cfg, attention_impl="dot_product", attention_mask="lengths")
    loss2, grads2 = jax.value_and_grad(lambda p: make_model(cfg2).loss_fn(p, batch)[0])(params)
    np.testing.assert_allclose(loss2, loss, rtol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4),
                           grads2, grads)


def _jax_nn_calls(monkeypatch, cfg, batch, params):
    """The keyword arguments of each jax.nn.dot_product_attention call of one forward."""
    calls, original = [], jax.nn.dot_product_attention

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(jax.nn, "dot_product_attention", recording)
        make_model(cfg).logits(params, batch)
    return calls


def test_attention_mask_as_lengths_reaches_jax_nn_as_lengths(monkeypatch):
    """No boolean mask reaches jax.nn (which would turn it into a [batch, heads, q, k]
    bias) unless the batch is packed: the encoder and cross-attention get lengths, the
    decoder's self-attention lengths and is_causal. Packed, the mask goes as a boolean
    [batch, 1, q, k] (one bias for every head) and the self-attention still says it is
    causal, so cuDNN skips the blocks above the diagonal."""
    cfg = dataclasses.replace(T5_TINY, attention_impl="dot_product", attention_mask="lengths")
    params = init_params(cfg)
    calls = _jax_nn_calls(monkeypatch, cfg, t5_batch(), params)
    layers = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
    assert len(calls) == layers and all(c["mask"] is None for c in calls)
    assert sum(bool(c["is_causal"]) for c in calls) == cfg.num_decoder_layers
    lengths = [(np.asarray(c["query_seq_lengths"]).tolist(),
                np.asarray(c["key_value_seq_lengths"]).tolist()) for c in calls]
    assert set(map(str, lengths)) == {str(([20, 14, 20], [20, 14, 20])),  # encoder
                                      str(([12, 7, 12], [12, 7, 12])),    # decoder self
                                      str(([12, 7, 12], [20, 14, 20]))}   # cross
    packed = _jax_nn_calls(monkeypatch, cfg, t5_batch(packed=True), params)
    assert len(packed) == layers
    assert all(c["mask"] is not None and "query_seq_lengths" not in c for c in packed)
    assert all(np.shape(c["mask"])[1] == 1 for c in packed)
    assert sum(bool(c.get("is_causal")) for c in packed) == cfg.num_decoder_layers
    dense = _jax_nn_calls(monkeypatch, dataclasses.replace(cfg, attention_mask="dense"),
                          t5_batch(), params)
    assert len(dense) == layers and all(c["mask"] is not None for c in dense)


def _score_tensors(cfg, batch, params):
    """{dtype: count} of the attention-score-shaped tensors ([batch, heads, group, q, k])
    that dot_general makes in the gradient program lowered for CUDA."""
    from t5lite.tools import program_account
    model = make_model(cfg)
    lowered = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch)[0])).trace(params).lower(
        lowering_platforms=("cuda",))
    report = program_account.account(lowered.compiler_ir("stablehlo"), top=10_000)
    counts = {}
    for t in report["largest"]:
        if len(t["shape"]) == 5 and "stablehlo.dot_general" in t["ops"]:
            counts[t["dtype"]] = counts.get(t["dtype"], 0) + t["ops"]["stablehlo.dot_general"]
    return counts


def test_bfloat16_attention_logits_close_and_no_float32_scores(reference):
    """ATTENTION_LOGITS_DTYPE='bfloat16': scores, bias and softmax in bf16 (T5X's GPU
    runs): close to float32 scores, and no float32 score tensor in the program."""
    cfg, params = reference
    batch = batch_for(cfg)
    bf16 = dataclasses.replace(cfg, dtype="bfloat16")
    f32_scores = np.asarray(_ref_logits(reference, False, dtype="bfloat16"))
    cfg2 = dataclasses.replace(bf16, attention_logits_dtype="bfloat16")
    got = np.asarray(make_model(cfg2).logits(params, batch))
    scale, err = np.abs(f32_scores).max(), np.abs(got - f32_scores).max()
    assert 0 < err < 0.05 * scale, (err, scale)
    assert _score_tensors(bf16, batch, params).get("f32", 0) > 0
    assert _score_tensors(cfg2, batch, params).get("f32", 0) == 0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rms_norm_gradient_is_autodiffs(dtype):
    """`layers.rms_norm` writes its gradient out (it keeps x in its dtype for the backward
    pass): the same x and scale gradients as autodiff of the float32 formula."""
    from t5lite.models.common.layers import rms_norm

    def plain(x, scale):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6) * scale
        return y.astype(dtype)

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (3, 5, 16)).astype(dtype)
    scale = 1.0 + jax.random.normal(keys[1], (16,))
    w = jax.random.normal(keys[2], (3, 5, 16))

    def loss(fn):
        return lambda x, s: jnp.sum(fn(x, s).astype(jnp.float32) * w)

    got = jax.grad(loss(lambda x, s: rms_norm(x, s, 1e-6, dtype)), (0, 1))(x, scale)
    want = jax.grad(loss(plain), (0, 1))(x, scale)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for g, r in zip(got, want):
        assert g.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32),
                                   rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.asarray(rms_norm(x, scale, 1e-6, dtype), np.float32),
                                  np.asarray(plain(x, scale), np.float32))


@pytest.mark.parametrize("name,cfg", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_the_residual_add_is_kept_out_of_the_gemm_only_when_training_without_dropout(
        name, cfg):
    """`layers.residual_add` keeps the add apart in every sublayer of a training step whose
    dropout is off (one optimization barrier a sublayer in the traced loss), and in no
    other case: with dropout, or without the dropout rng (evaluation). Why:
    tests/test_gpu_compile.py."""
    def barriers(c, rng):
        model = make_model(c)
        params = model.abstract_variables()  # traced only: shapes are enough
        jaxpr = jax.make_jaxpr(lambda p: model.loss_fn(p, batch_for(c), rng)[0])(params)
        return str(jaxpr).count("optimization_barrier")

    sublayers = (2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers
                 if isinstance(cfg, T5Config) else 2 * cfg.num_layers)
    rng = jax.random.PRNGKey(1)
    assert barriers(cfg, rng) == sublayers
    assert barriers(dataclasses.replace(cfg, dropout_rate=0.1), rng) == 0
    assert barriers(cfg, None) == 0
