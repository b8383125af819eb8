"""Steps to skip, not runs to lose (Pax's `skip_step_gradient_norm`): an optimizer wrapper
that applies no update on a step whose gradient is not finite or whose global norm is
above a bound, and counts such steps in its own state.

    tx = skip_bad_steps(inner, max_grad_norm=None)   # None: only non-finite gradients
    updates, state = tx.update(grads, state, params)
    applied(state)   # bool scalar: this step's update was applied (None: no wrapper)

On a skipped step the updates are zeros and the inner state (moments, its update count,
so the learning-rate schedule) stays as it was; the train step keeps the parameters and
FP8 state of the step before (`select`: bit for bit). The counters live in the optimizer
state, so they are checkpointed with it: a run resumed from a checkpoint with skips in
its history continues bit-exact. The gradient norm is taken before any clipping inside
`inner`.

    SkipState(inner, applied, in_a_row, total)
      inner      the wrapped optimizer's state
      applied    bool []   the last step's update was applied
      in_a_row   int32 []  steps skipped in a row up to the last (0 after an applied one)
      total      int32 []  steps skipped in all
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax


class SkipState(NamedTuple):
    inner: Any
    applied: jax.Array
    in_a_row: jax.Array
    total: jax.Array


def fresh(inner_state: Any) -> SkipState:
    """`inner_state` wrapped, no step skipped yet (a fresh run, or a T5X run continued)."""
    return SkipState(inner_state, jnp.ones((), jnp.bool_), jnp.zeros((), jnp.int32),
                     jnp.zeros((), jnp.int32))


def select(ok: jax.Array, new: Any, old: Any) -> Any:
    """`new` where `ok`, else `old`, leaf by leaf (a scalar condition)."""
    return jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), new, old)


def skip_bad_steps(inner: optax.GradientTransformation,
                   max_grad_norm: Optional[float] = None) -> optax.GradientTransformation:
    """`inner`, with no update applied on a step whose gradient is not finite or has a
    global norm above `max_grad_norm` (module docstring)."""

    def init(params):
        return fresh(inner.init(params))

    def update(grads, state: SkipState, params=None):
        norm = optax.tree.norm(grads)
        ok = jnp.isfinite(norm)
        if max_grad_norm is not None:
            ok = ok & (norm <= max_grad_norm)
        updates, new_inner = inner.update(grads, state.inner, params)
        updates = jax.tree_util.tree_map(lambda u: jnp.where(ok, u, jnp.zeros_like(u)), updates)
        skipped = (~ok).astype(jnp.int32)
        return updates, SkipState(select(ok, new_inner, state.inner), ok,
                                  jnp.where(ok, 0, state.in_a_row + 1).astype(jnp.int32),
                                  state.total + skipped)

    return optax.GradientTransformation(init, update)


def applied(opt_state: Any) -> Optional[jax.Array]:
    """Whether the step that produced `opt_state` applied its update (None: the optimizer
    skips nothing)."""
    return opt_state.applied if isinstance(opt_state, SkipState) else None


def step_metrics(opt_state: Any) -> Dict[str, jax.Array]:
    """`skipped` (this step: 1 or 0), `skipped_in_a_row` and `skipped_steps` (in all), as
    float32 metrics; {} without the wrapper."""
    if not isinstance(opt_state, SkipState):
        return {}
    return {"skipped": (~opt_state.applied).astype(jnp.float32),
            "skipped_in_a_row": opt_state.in_a_row.astype(jnp.float32),
            "skipped_steps": opt_state.total.astype(jnp.float32)}
