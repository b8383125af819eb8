"""The MLPs' activations, and their gated product with a backward pass that keeps only
the projections.

`activated_product((act_0, act_1), (y_0, y_1))` is act_0(y_0) * act_1(y_1) (T5 v1.1's
gated GELU, LLaMA's SwiGLU; one function for an ungated MLP). Differentiated as written,
XLA keeps what tanh-GELU computed on the way (its tanh) as one more [batch, length, mlp]
array written forward and read backward (SiLU's sigmoid it already recomputes). Here
the backward pass keeps only y_i, which the projections' own gradients need anyway, and
computes the activations again inside the kernel that forms the gradients: for T5 large
compiled for an H200 that is 2 x 92 MB less traffic per encoder layer
(docs/performance.md). The values are the same functions'; the gradients are autodiff's
of the same expression.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence, Tuple

import jax
import jax.numpy as jnp

ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "linear": lambda x: x,
}
"""The names a config's `mlp_activations` may hold."""


def _product(activations: Tuple[Callable, ...], ys: Tuple[jax.Array, ...]) -> jax.Array:
    out = None
    for act, y in zip(activations, ys):
        y = act(y.astype(jnp.float32))
        out = y if out is None else out * y
    return out.astype(ys[0].dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _recomputed(activations, ys):
    return _product(activations, ys)


def _forward(activations, ys):
    return _product(activations, ys), ys


def _backward(activations, ys, grad):
    # The barrier keeps XLA from merging this recomputation with the forward pass's
    # (common subexpressions), which would bring back the array this avoids.
    ys, grad = jax.lax.optimization_barrier((ys, grad))
    _, vjp = jax.vjp(functools.partial(_product, activations), ys)
    return vjp(grad)


_recomputed.defvjp(_forward, _backward)


def activated_product(activations: Sequence[Callable], ys: Sequence[jax.Array]) -> jax.Array:
    """prod_i activations[i](ys[i]), each y [..., mlp] -> [..., mlp]; its backward pass keeps
    only `ys` (the module docstring)."""
    if len(activations) != len(ys):
        raise ValueError(f"{len(activations)} activations for {len(ys)} projections")
    return _recomputed(tuple(activations), tuple(ys))
