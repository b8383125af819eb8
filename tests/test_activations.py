"""The MLPs' activated product: its values and gradients are the plain expression's, for
every activation a config may name, gated or not, in float32 and bfloat16; the dense MLP
and the experts use it. (That its backward pass keeps only the projections is checked on
the program compiled for an H200: tests/test_gpu_compile.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models.activations import ACTIVATIONS, activated_product


def _plain(acts, ys):
    out = None
    for act, y in zip(acts, ys):
        y = act(y)
        out = y if out is None else out * y
    return out


def _ys(n, dtype, shape=(3, 5, 16)):
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    return [(2 * jax.random.normal(k, shape)).astype(dtype) for k in keys]


@pytest.mark.parametrize("names", [("gelu", "linear"), ("silu", "linear"), ("gelu_exact",),
                                   ("relu",), ("gelu", "gelu")])
def test_values_and_gradients_are_the_plain_expressions_in_float32(names):
    acts = [ACTIVATIONS[n] for n in names]
    ys = _ys(len(acts), jnp.float32)
    np.testing.assert_allclose(activated_product(acts, ys), _plain(acts, ys), rtol=1e-6,
                               atol=1e-6)
    cot = jax.random.normal(jax.random.PRNGKey(1), ys[0].shape)
    ours = jax.grad(lambda ys: jnp.sum(activated_product(acts, ys) * cot))(ys)
    plain = jax.grad(lambda ys: jnp.sum(_plain(acts, ys) * cot))(ys)
    for a, b in zip(ours, plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bfloat16_is_computed_in_float32_and_rounded_once():
    acts = [ACTIVATIONS["gelu"], ACTIVATIONS["linear"]]
    ys = _ys(2, jnp.bfloat16)
    out = activated_product(acts, ys)
    assert out.dtype == jnp.bfloat16
    exact = _plain(acts, [y.astype(jnp.float32) for y in ys])
    np.testing.assert_array_equal(out, exact.astype(jnp.bfloat16))
    grads = jax.grad(lambda ys: jnp.sum(activated_product(acts, ys).astype(jnp.float32)))(ys)
    exact_grads = jax.grad(lambda ys: jnp.sum(_plain(acts, ys)))(
        [y.astype(jnp.float32) for y in ys])
    for g, e in zip(grads, exact_grads):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.float32(g), e, rtol=1e-2, atol=1e-2)


def test_a_count_that_does_not_match_is_refused():
    with pytest.raises(ValueError, match="2 activations for 1 projections"):
        activated_product([ACTIVATIONS["gelu"], ACTIVATIONS["linear"]], _ys(1, jnp.float32))
