"""Optimizers and schedules: the learning rate each update really uses (against numbers
worked out by hand from the formulas), Adafactor factoring and parameter scale, AdamW
clipping and weight-decay masking, and the gin wiring."""
import math
import re

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import t5lite.config.registry  # noqa: F401  (gin registrations)
from t5lite.errors import ConfigError
from t5lite.optim import optimizers as opt
from t5lite.optim.adafactor import AdafactorState


def _updates(optimizer, params, grads, num_steps):
    """Runs `num_steps` updates (jitted scan) with the same `grads` every step and returns
    the update each step applied, stacked on a leading axis."""
    tx = optimizer.tx

    def body(carry, _):
        p, s = carry
        u, s = tx.update(grads, s, p)
        return (optax.apply_updates(p, u), s), u

    @jax.jit
    def run(p):
        _, us = jax.lax.scan(body, (p, tx.init(p)), None, length=num_steps)
        return us

    return run(params)


# Hand-computed learning rates (peak 1e-3, warmup 10, decay ends at step 50):
#   linear to end 1e-4:  s=20: 1e-3 - 0.25 * 9e-4 = 7.75e-4;  s=30: 5.5e-4
#   cosine to 10%:       s=20: 1e-4 + 9e-4 * (1 + cos(pi/4)) / 2 = 8.6819805153e-4
#                        s=30: 1e-4 + 9e-4 * 0.5 = 5.5e-4
#   rsqrt, base 1, warmup 10:  s<=10: 1/sqrt(10) = 0.316227766;  s=16: 0.25;  s=25: 0.2;
#                        s=40: 1/sqrt(40) = 0.158113883
CASES = {
    "constant": (lambda: opt.constant(3e-4),
                 {0: 3e-4, 1: 3e-4, 9: 3e-4, 10: 3e-4, 20: 3e-4, 55: 3e-4}),
    "rsqrt_decay": (lambda: opt.rsqrt_decay(base_learning_rate=1.0, warmup_steps=10),
                    {0: 0.316227766, 1: 0.316227766, 9: 0.316227766, 10: 0.316227766,
                     16: 0.25, 25: 0.2, 40: 0.158113883}),
    "linear_decay": (lambda: opt.linear_decay(1e-3, end=1e-4, warmup_steps=10, decay_steps=50),
                     {0: 0.0, 1: 1e-4, 9: 9e-4, 10: 1e-3, 20: 7.75e-4, 30: 5.5e-4,
                      50: 1e-4, 55: 1e-4}),
    "cosine_with_warmup": (lambda: opt.cosine_with_warmup(1e-3, 10, 50, end_fraction=0.1),
                           {0: 0.0, 1: 1e-4, 9: 9e-4, 10: 1e-3, 20: 8.6819805153e-4,
                            30: 5.5e-4, 50: 1e-4, 55: 1e-4}),
}
NUM_STEPS = 56


@pytest.mark.parametrize("name", sorted(CASES))
def test_adamw_uses_scheduled_learning_rate(name):
    make, expected = CASES[name]
    # Constant gradient 1: bias-corrected Adam gives m_hat / (sqrt(v_hat) + eps) = 1 /
    # (1 + 1e-8), so the update at step t is -lr_t.
    optimizer = opt.adamw(make())
    params = jnp.zeros((4,), jnp.float32)
    updates = np.asarray(_updates(optimizer, params, jnp.ones((4,)), NUM_STEPS))
    for step, lr in expected.items():
        np.testing.assert_allclose(updates[step], -lr, rtol=2e-5, atol=1e-9,
                                   err_msg=f"{name} step {step}")
        np.testing.assert_allclose(optimizer.learning_rate_fn(step), lr, rtol=1e-6,
                                   atol=1e-12)


def test_adafactor_uses_scheduled_learning_rate():
    make, expected = CASES["rsqrt_decay"]
    # 1-D param: unfactored; constant grads 1: v = 1 (+1e-30) every step, y = 1, RMS(y) = 1
    # so update clipping is inactive; no parameter scale: the update is -lr_t.
    optimizer = opt.adafactor(make(), multiply_by_parameter_scale=False)
    updates = np.asarray(_updates(optimizer, jnp.zeros((4,)), jnp.ones((4,)), NUM_STEPS))
    for step, lr in expected.items():
        np.testing.assert_allclose(updates[step], -lr, rtol=1e-6, err_msg=f"step {step}")


def test_schedules_directly():
    # Float learning rates become constants; traced steps work.
    assert opt.as_schedule(0.5)(7) == pytest.approx(0.5)
    assert jax.jit(opt.cosine_with_warmup(2.0, 4, 8))(jnp.int32(2)) == pytest.approx(1.0)
    # No warmup: peak at step 0; linear to 0 at decay_steps by default.
    lin = opt.linear_decay(1.0, decay_steps=4)
    assert [float(lin(s)) for s in range(6)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0, 0])
    # rsqrt without warmup stays finite at step 0.
    assert float(opt.rsqrt_decay(1.0, warmup_steps=0)(0)) == pytest.approx(1.0)
    assert float(opt.rsqrt_decay(1.0, warmup_steps=0)(4)) == pytest.approx(0.5)
    cos = opt.cosine_with_warmup(1.0, warmup_steps=0, decay_steps=4, end_fraction=0.0)
    assert float(cos(2)) == pytest.approx(0.5)
    for fn in (lambda: opt.linear_decay(1.0, warmup_steps=10, decay_steps=5),
               lambda: opt.cosine_with_warmup(1.0, 10, 5),
               lambda: opt.rsqrt_decay(1.0, warmup_steps=-1)):
        with pytest.raises(ConfigError, match="steps"):
            fn()
    with pytest.raises(TypeError, match="learning_rate"):
        opt.adamw("1e-3")


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_learning_rate_that_is_not_finite_is_refused_by_name(bad):
    for make, name in [(lambda: opt.adafactor(bad), "adafactor.learning_rate"),
                       (lambda: opt.adamw(bad), "adamw.learning_rate"),
                       (lambda: opt.rsqrt_decay(bad), "rsqrt_decay.base_learning_rate"),
                       (lambda: opt.linear_decay(bad, decay_steps=10), "linear_decay.peak"),
                       (lambda: opt.cosine_with_warmup(1.0, 0, 10, end_fraction=bad),
                        "cosine_with_warmup.end_fraction")]:
        with pytest.raises(ConfigError, match=rf"{re.escape(name)} must be a finite number, "
                                              rf"got {bad}"):
            make()
    # a schedule of our own whose rate is not finite from the start
    with pytest.raises(ConfigError, match=r"adamw.learning_rate: the schedule's learning "
                                          r"rate at step 0 is inf"):
        opt.adamw(lambda step: jnp.float32(math.inf) + 0 * step)


# ----------------------------------------------------------------------------- adafactor


def _find(state, kind):
    nodes = jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, kind))
    return [n for n in nodes if isinstance(n, kind)]


def test_adafactor_factors_large_matrices_only():
    params = {"w": jnp.zeros((256, 384)), "b": jnp.zeros((4,))}
    state = opt.adafactor(0.01).tx.init(params)
    (fs,) = _find(state, AdafactorState)
    assert fs.v_row["w"].shape == (256,) and fs.v_col["w"].shape == (384,)
    assert fs.v["w"].shape == (1,)  # placeholder: no full second moment
    assert fs.v["b"].shape == (4,) and fs.v_row["b"].shape == (1,)
    assert not any(np.shape(x) == (256, 384) for x in jax.tree_util.tree_leaves(state))
    # Below min_dim_size_to_factor, or factored=False: full second moment.
    small = opt.adafactor(0.01).tx.init({"w": jnp.zeros((64, 384))})
    assert _find(small, AdafactorState)[0].v["w"].shape == (64, 384)
    off = opt.adafactor(0.01, factored=False).tx.init(params)
    assert _find(off, AdafactorState)[0].v["w"].shape == (256, 384)


def test_adafactor_parameter_scale():
    x = jax.random.normal(jax.random.PRNGKey(0), (256, 384)) * 0.05
    g = jax.random.normal(jax.random.PRNGKey(1), (256, 384))
    params = {"a": x, "b": 10.0 * x, "zero": jnp.zeros((256, 384))}
    grads = {"a": g, "b": g, "zero": g}
    tx = opt.adafactor(0.01).tx
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["b"], 10.0 * updates["a"], rtol=1e-5)
    # The scaled direction is identical; its size follows RMS(param), floored at epsilon2.
    rms = float(jnp.sqrt(jnp.mean(x * x)))
    direction = updates["a"] / (-0.01 * rms)
    np.testing.assert_allclose(updates["zero"], -0.01 * 1e-3 * direction, rtol=1e-5)
    # The update direction's RMS is at most the clipping threshold (1.0).
    assert float(jnp.sqrt(jnp.mean(direction ** 2))) <= 1.0 + 1e-5


def test_adafactor_matches_optax_adafactor():
    """Planned by shape (no axis names), t5lite's Adafactor is optax's, to float32
    rounding (x ** -0.5 where optax takes rsqrt: a few ulps on the update)."""
    key = jax.random.PRNGKey(2)
    params = {"w": jax.random.normal(key, (256, 384)), "b": jnp.ones((4,)) * 0.3}
    grads = jax.tree.map(lambda p: jnp.sin(p * 3.0) + 0.1, params)
    for kwargs in ({}, {"momentum": 0.9, "weight_decay_rate": 1e-3}):
        ours = opt.adafactor(0.01, **kwargs).tx
        ref = optax.adafactor(0.01, **kwargs)
        s1, s2, p1, p2 = ours.init(params), ref.init(params), params, params
        for _ in range(3):
            u1, s1 = ours.update(grads, s1, p1)
            u2, s2 = ref.update(grads, s2, p2)
            p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8),
                     p1, p2)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9), u1, u2)


# ----------------------------------------------------------------------------- adamw


def test_adamw_global_norm_clipping():
    params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros((5,))}
    key1, key2 = jax.random.split(jax.random.PRNGKey(3))
    grads = {"w": 1e4 * jax.random.normal(key1, (3, 4)),
             "b": 1e4 * jax.random.normal(key2, (5,))}
    lr, eps = 0.1, 1.0  # a large eps makes the first Adam step depend on |g|

    def first_update(clip_norm, g):
        tx = opt.adamw(lr, eps=eps, clip_norm=clip_norm).tx
        return tx.update(g, tx.init(params), params)[0]

    # Manual: the global norm spans both leaves; the first bias-corrected Adam step is
    # -lr * g / (|g| + eps).
    norm = math.sqrt(sum(float(jnp.sum(g * g)) for g in grads.values()))
    clipped = {k: np.asarray(g) / norm for k, g in grads.items()}
    got = first_update(1.0, grads)
    for k in grads:
        expected = -lr * clipped[k] / (np.abs(clipped[k]) + eps)
        np.testing.assert_allclose(got[k], expected, rtol=1e-5, atol=1e-8)
    # Equal to the unclipped optimizer fed the clipped gradient; below the threshold
    # clipping changes nothing.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
                 got, first_update(None, clipped))
    small = jax.tree.map(lambda g: g * 1e-6, grads)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
                 first_update(1.0, small), first_update(None, small))


def _decay_params():
    return {"dense": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones((4,))},
            "norm": {"scale": jnp.ones((4,))},
            "token_embedder": {"embedding": jnp.ones((8, 4))},
            "layers": {"norm": {"scale": jnp.ones((2, 4))},  # scanned: [layers, embed]
                       "mlp": {"kernel": jnp.ones((2, 4, 6))}}}


def _one_step_zero_grads(optimizer, params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = optimizer.tx.update(zeros, optimizer.tx.init(params), params)
    return optax.apply_updates(params, updates)


def test_adamw_weight_decay_mask():
    params = _decay_params()
    # Zero gradients: the Adam part is 0, so params change by -lr * wd * p only.
    new = _one_step_zero_grads(opt.adamw(0.1, weight_decay=0.5), params)
    decayed = 1.0 - 0.1 * 0.5
    np.testing.assert_allclose(new["dense"]["kernel"], decayed)
    np.testing.assert_allclose(new["token_embedder"]["embedding"], decayed)
    np.testing.assert_allclose(new["layers"]["mlp"]["kernel"], decayed)
    for leaf in (new["dense"]["bias"], new["norm"]["scale"], new["layers"]["norm"]["scale"]):
        np.testing.assert_array_equal(leaf, 1.0)
    # Overridable: decay everything, or only what a tree says.
    everything = _one_step_zero_grads(
        opt.adamw(0.1, weight_decay=0.5, weight_decay_mask=None), params)
    jax.tree.map(lambda x: np.testing.assert_allclose(x, decayed), everything)
    mask = jax.tree.map(lambda _: False, params)
    mask["norm"]["scale"] = True
    only_scale = _one_step_zero_grads(
        opt.adamw(0.1, weight_decay=0.5, weight_decay_mask=mask), params)
    np.testing.assert_allclose(only_scale["norm"]["scale"], decayed)
    np.testing.assert_array_equal(only_scale["dense"]["kernel"], 1.0)
    # No weight decay by default.
    jax.tree.map(lambda x: np.testing.assert_array_equal(x, 1.0),
                 _one_step_zero_grads(opt.adamw(0.1), params))


def test_state_leaves_do_not_depend_on_switches():
    params = _decay_params()

    def paths(o):
        return [p for p, _ in jax.tree_util.tree_leaves_with_path(o.tx.init(params))]

    assert paths(opt.adamw(1e-3)) == paths(opt.adamw(1e-3, weight_decay=0.1, clip_norm=1.0))
    assert paths(opt.adafactor(1e-2)) == paths(
        opt.adafactor(1e-2, clip_norm=1.0, weight_decay_rate=1e-3, clipping_threshold=None,
                      multiply_by_parameter_scale=False))


# ----------------------------------------------------------------------------- gin


@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_gin_builds_optimizers(clean_gin):
    gin.parse_config("""
        adamw.learning_rate = @cosine_with_warmup()
        cosine_with_warmup.peak = 1e-3
        cosine_with_warmup.warmup_steps = 10
        cosine_with_warmup.decay_steps = 50
        adamw.b2 = 0.95
        adamw.weight_decay = 0.1
        adamw.clip_norm = 1.0

        t5lite.adafactor.learning_rate = @rsqrt_decay()
        rsqrt_decay.warmup_steps = 100
        adafactor.decay_rate = 0.8

        linear_decay.peak = 1e-4
        linear_decay.decay_steps = 1000
        t5lite.constant.value = 0.5  # qualified: gin has its own `constant`
    """)
    a = t5lite.config.registry.adamw()
    assert isinstance(a, opt.Optimizer)
    assert float(a.learning_rate_fn(30)) == pytest.approx(5.5e-4)
    params = {"kernel": jnp.ones((3, 4)), "scale": jnp.ones((4,))}
    updates, _ = a.tx.update(jax.tree.map(jnp.ones_like, params), a.tx.init(params), params)
    assert all(np.all(np.isfinite(u)) for u in jax.tree_util.tree_leaves(updates))

    f = t5lite.config.registry.adafactor()
    assert float(f.learning_rate_fn(0)) == pytest.approx(0.1)  # 1 / sqrt(100)
    assert float(t5lite.config.registry.linear_decay()(500)) == pytest.approx(5e-5)
    assert float(t5lite.config.registry.constant()(3)) == pytest.approx(0.5)


def test_gin_number_learning_rate(clean_gin):
    gin.parse_config("adamw.learning_rate = 1e-4")
    assert float(t5lite.config.registry.adamw().learning_rate_fn(123)) == pytest.approx(1e-4)
