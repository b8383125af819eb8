"""Adafactor's second moments and per-parameter scales, factored as T5X factors them.

T5X's Adafactor (`t5x/adafactor.py`, used by every T5X T5 recipe) sees T5's parameters
as matrices: attention kernels [embed, heads*kv] / [heads*kv, embed], MLP kernels,
embeddings; one parameter per layer. It factors a matrix when its second-largest
dimension is >= `min_dim_size_to_factor` (128): `v_row` keeps that dimension (the first
one on a tie) and averages over the largest, `v_col` keeps the largest. The parameter
scale RMS(p) and the update clipping RMS(y) are statistics of that matrix.

t5lite keeps the heads apart ([embed, heads, kv]) and may stack layers ('layers') and
q/k/v ('stack') into one leaf. A `FactoringPlan` per leaf, read from its logical axis
names, restores T5X's view:

    batch  'layers', 'pipeline_repeats' (a circular pipeline's runs of layers), 'stack'
           axes: each slice is one T5X parameter (statistics per slice);
           'expert' too: each expert's kernel factored alone, as T5X's MoE rules do
    joined adjacent 'heads' and 'kv' axes count as one dimension (T5X's joined_kv)

so that every layout (fused QKV, scanned layers) takes T5X's step, and T5X's Adafactor
state maps onto t5lite's (`t5x_optimizer_state`). A leaf without axis names is planned
on its shape alone: every axis its own dimension, no batch axes, the two largest
dimensions factored (what `optax.scale_by_factored_rms` does).

State per leaf (float32): factored -> `v_row` [shape without the col axes], `v_col`
[shape without the row axes], `v` [1]; unfactored -> `v` [shape], `v_row` = `v_col` = [1].

Per update t (0-based; beta2_t = 1 - (t + 1 - offset) ** -decay_rate):
    v_row = beta2_t v_row + (1 - beta2_t) mean_col(g^2 + eps1)   (factored)
    v_col = beta2_t v_col + (1 - beta2_t) mean_row(g^2 + eps1)
    y = g (v_row / mean_row(v_row))^-1/2 v_col^-1/2   |   y = g v^-1/2 (unfactored)
    y /= max(1, RMS(y) / clipping_threshold)
    y *= max(RMS(p), eps2)                             (multiply_by_parameter_scale)
RMS and means run over the non-batch axes of each slice.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

# T5X MoE: the expert axis is a batch axis too
BATCH_AXES = ("layers", "pipeline_repeats", "stack", "expert")
JOINED_AXES = ("heads", "kv")


@dataclasses.dataclass(frozen=True)
class FactoringPlan:
    """How one leaf is factored. `batch`: slice axes; `row` / `col`: the axes `v_row`
    keeps (and `v_col` averages) / `v_col` keeps; None when unfactored."""

    batch: Tuple[int, ...] = ()
    row: Optional[Tuple[int, ...]] = None
    col: Optional[Tuple[int, ...]] = None

    @property
    def factored(self) -> bool:
        return self.row is not None

    def stat_axes(self, ndim: int) -> Tuple[int, ...]:
        return tuple(a for a in range(ndim) if a not in self.batch)


def _groups(names: Sequence[Optional[str]], ndim: int):
    """The non-batch axes grouped into T5X's dimensions (adjacent heads, kv joined)."""
    groups = []
    for axis in range(ndim):
        name = names[axis] if axis < len(names) else None
        if name in BATCH_AXES:
            continue
        if (groups and name in JOINED_AXES and names[groups[-1][-1]] in JOINED_AXES
                and names[groups[-1][-1]] != name and groups[-1][-1] == axis - 1):
            groups[-1].append(axis)
        else:
            groups.append([axis])
    return [tuple(g) for g in groups]


def plan_leaf(shape: Sequence[int], names: Optional[Sequence[Optional[str]]] = None, *,
              factored: bool = True, min_dim_size_to_factor: int = 128) -> FactoringPlan:
    """The plan of one leaf of `shape` with logical axis `names` (None: by shape only)."""
    ndim = len(shape)
    names = tuple(names) if names is not None else (None,) * ndim
    batch = tuple(a for a in range(ndim) if a < len(names) and names[a] in BATCH_AXES)
    groups = _groups(names, ndim)
    if not factored or len(groups) < 2:
        return FactoringPlan(batch=batch)
    sizes = [int(np.prod([shape[a] for a in g])) for g in groups]
    order = np.argsort(sizes, kind="stable")
    d1, d0 = int(order[-2]), int(order[-1])
    if sizes[d1] < min_dim_size_to_factor:
        return FactoringPlan(batch=batch)
    return FactoringPlan(batch=batch, row=groups[d1], col=groups[d0])


def plan_tree(params: Any, param_axes: Any = None, **options) -> Any:
    """A FactoringPlan per leaf of `params` (arrays or ShapeDtypeStructs); `param_axes`:
    the model's logical axis names (`model.logical_axes()["params"]`) or None."""
    if param_axes is None:
        return jax.tree.map(lambda p: plan_leaf(np.shape(p), **options), params)
    return jax.tree.map(lambda p, n: plan_leaf(np.shape(p), tuple(n), **options), params,
                        param_axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def _without(shape, axes):
    return tuple(n for a, n in enumerate(shape) if a not in axes)


def _mean(x, axes, keepdims=False):
    return jnp.mean(x, axis=tuple(axes), keepdims=keepdims) if axes else x


class AdafactorState(NamedTuple):
    """Update count and the per-leaf second moments (trees like the params)."""

    count: jax.Array
    v_row: Any
    v_col: Any
    v: Any


def state_shapes(shape, plan: FactoringPlan):
    """(v_row, v_col, v) shapes of a leaf of `shape` under `plan`."""
    if plan.factored:
        return _without(shape, plan.col), _without(shape, plan.row), (1,)
    return (1,), (1,), tuple(shape)


def scale_by_factored_rms(*, decay_rate: float, step_offset: int, epsilon1: float,
                          clipping_threshold: Optional[float], epsilon2: Optional[float],
                          param_axes: Any = None, factored: bool = True,
                          min_dim_size_to_factor: int = 128
                          ) -> optax.GradientTransformation:
    """The direction y of each update (module docstring), clipped, times the parameter
    scale when `epsilon2` is not None; the learning rate and sign come after."""
    options = dict(factored=factored, min_dim_size_to_factor=min_dim_size_to_factor)

    def init(params):
        plans = plan_tree(params, param_axes, **options)

        def zeros(p, plan, which):
            return jnp.zeros(state_shapes(np.shape(p), plan)[which], jnp.float32)
        return AdafactorState(
            count=jnp.zeros([], jnp.int32),
            **{k: jax.tree.map(lambda p, pl, i=i: zeros(p, pl, i), params, plans)
               for i, k in enumerate(("v_row", "v_col", "v"))})

    def update(grads, state, params=None):
        if epsilon2 is not None and params is None:
            raise ValueError("Adafactor's parameter scale needs the params")
        plans = plan_tree(grads, param_axes, **options)
        t = (state.count - step_offset).astype(jnp.float32) + 1.0
        decay = 1.0 - t ** (-decay_rate)
        mixing = 1.0 - decay

        def one(g, v_row, v_col, v, plan, p):
            g = g.astype(jnp.float32)
            sq = g * g + epsilon1
            stats = plan.stat_axes(g.ndim)
            if plan.factored:
                v_row = decay * v_row + mixing * _mean(sq, plan.col)
                v_col = decay * v_col + mixing * _mean(sq, plan.row)
                row_in_v_row = tuple(a - sum(c < a for c in plan.col) for a in plan.row)
                row_factor = (v_row / _mean(v_row, row_in_v_row, keepdims=True)) ** -0.5
                col_factor = v_col ** -0.5
                y = g * jnp.expand_dims(row_factor, plan.col) * \
                    jnp.expand_dims(col_factor, plan.row)
            else:
                v = decay * v + mixing * sq
                y = g * v ** -0.5
            if clipping_threshold is not None:
                rms = jnp.sqrt(_mean(y * y, stats, keepdims=True))
                y = y / jnp.maximum(1.0, rms / clipping_threshold)
            if epsilon2 is not None:
                p = p.astype(jnp.float32)
                y = y * jnp.maximum(jnp.sqrt(_mean(p * p, stats, keepdims=True)), epsilon2)
            return y, v_row, v_col, v

        params_or_grads = params if params is not None else grads
        out = jax.tree.map(one, grads, state.v_row, state.v_col, state.v, plans,
                           params_or_grads)
        treedef = jax.tree.structure(grads)
        flat = treedef.flatten_up_to(out)
        ys, v_rows, v_cols, vs = (treedef.unflatten([f[i] for f in flat]) for i in range(4))
        return ys, AdafactorState(optax.safe_int32_increment(state.count), v_rows, v_cols, vs)

    return optax.GradientTransformation(init, update)
