"""Matmul precision: bf16 by default; FP8 through flax's native fp8 ops or through NVIDIA
Transformer Engine (`te_backend`).

A model config names its FP8 mode with `fp8_mode(cfg)`: "" (off), "native", "te-delayed"
or "te-current"; `Dense` asks `dot_general(mode)` for its matmul.

FP8 keeps per-matmul scales and amax histories (input, kernel, output gradient) in the
flax collection `FP8_COLLECTION` ("_overwrite_with_gradient"): not parameters. The
trainer takes gradients with respect to that collection and uses them as the new state
(flax's "overwrite with gradient" contract), combines them across microbatches with
`combine_fp8` (`fp8_identity` starts the fold), and never feeds them to the optimizer,
clipping or weight decay.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

from t5lite.models.common import te_backend

FP8_COLLECTION = fp8_ops.OVERWRITE_WITH_GRADIENT
AMAX_HISTORY_LENGTH = 1024
FP8_BACKENDS = ("native", "te")


def fp8_mode(cfg) -> str:
    """"" when the config's matmuls run in its dtype, else "native" / "te-<recipe>"."""
    if not cfg.fp8:
        return ""
    return "native" if cfg.fp8_backend == "native" else f"te-{cfg.fp8_recipe}"


def fp8_dot_general(name: str):
    """A flax module usable as `dot_general(x, kernel, dimension_numbers)` that quantizes
    x and kernel to e4m3 and the output gradient to e5m2 with delayed scaling."""
    return fp8_ops.Fp8DirectDotGeneralOp(amax_history_length=AMAX_HISTORY_LENGTH, name=name)


def dot_general(mode: str):
    """The matmul of a Dense for an `fp8_mode` (call inside the Dense's compact method)."""
    if not mode:
        return jax.lax.dot_general
    if mode == "native":
        return fp8_dot_general(name="fp8")
    return te_backend.dot_general(mode.split("-", 1)[1])


def _is_te_scale(path) -> bool:
    names = [getattr(p, "key", getattr(p, "name", None)) for p in path]
    return te_backend.TE_SCOPE in names and str(names[-1]).endswith("_scale")


def fp8_identity(fp8_state):
    """The start of a microbatch fold: -inf (max) everywhere, +inf (min) for TE scales."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.full(x.shape, jnp.inf if _is_te_scale(p) else -jnp.inf, x.dtype),
        fp8_state)


def combine_fp8(a, b):
    """Two microbatches' new FP8 state as one: amax histories and flax's scales (amax /
    fp8_max) with max, TE's scales (fp8_max / amax) with min: the scale that covers the
    largest amax either saw."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x, y: jnp.minimum(x, y) if _is_te_scale(p) else jnp.maximum(x, y), a, b)
