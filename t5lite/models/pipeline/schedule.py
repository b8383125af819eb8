"""The pipeline's schedule: S stages, each holding its chunks of a stack's layers, run M
microbatches R times around (a circular pipeline when R > 1), as one `lax.scan` over
M R + S - 1 iterations whose gradient is autodiff's (GPipe's order: every forward, then
every backward).

In iteration t every stage runs at once (a `vmap` over the stage axis, sharded over the
mesh's `stage` axis, so each device runs its own stage): stage s takes microbatch
(t - s) mod M through its chunk r S + s, r = (t - s) div M, and its output moves to stage
s + 1 by a collective permute (the last stage's to stage 0, for the next repeat). Stage 0
reads microbatch t mod M from a buffer that holds every microbatch: the inputs at first,
each one's output of the last repeat as it comes round (M >= S: it is back before stage 0
needs it), and at the end the outputs.

Memory per device: the buffer (the whole batch's activations at the stack's width,
[M, microbatch, length, embed] split over the batch axes, on every stage), and for the
backward pass what each of the M R + S - 1 iterations keeps: its stage's input and what
the remat policy saves inside its layers, for one microbatch. The bubble: S - 1 of the
M R + S - 1 iterations a stage computes nothing that is used (`settings.bubble_fraction`).

Needs nothing of t5lite: jax and flax's logical-axis rules (the `stage` logical axis names
the mesh axes the stages lie on).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

STAGE = "stage"  # the logical axis of the stages (parameters' stacked `layers` map alike)


def mesh_stages() -> Tuple[int, Tuple[str, ...]]:
    """(stages, their mesh axes) under the current mesh and logical-axis rules: the mesh
    axes the logical `stage` axis maps to; (1, ()) without a mesh or such axes."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return 1, ()
    axes = nn.logical_to_mesh_axes((STAGE,))[0]
    if axes is None:
        return 1, ()
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[a] for a in axes), axes


def _split(a: jax.Array, axis: int, parts: int) -> jax.Array:
    """[..., B, ...] (B at `axis`) -> [parts, ..., B / parts, ...]: microbatch m holds rows
    m, m + parts, m + 2 parts, ... so that each device's rows of a batch sharded over the
    batch axes split into its rows of every microbatch (no rows move between devices)."""
    a = a.reshape(a.shape[:axis] + (a.shape[axis] // parts, parts) + a.shape[axis + 1:])
    return jnp.moveaxis(a, axis + 1, 0)


def _merge(a: jax.Array, axis: int) -> jax.Array:
    """Inverse of `_split`."""
    a = jnp.moveaxis(a, 0, axis + 1)
    return a.reshape(a.shape[:axis] + (a.shape[axis] * a.shape[axis + 1],) + a.shape[axis + 2:])


def _rotate(a: jax.Array, axes: Tuple[str, ...], stages: int) -> jax.Array:
    """[stages, ...] sharded over `axes` -> stage s's slice at stage s + 1 (the last's at
    0): one collective permute."""
    spec = P(axes if len(axes) > 1 else axes[0])
    perm = [(i, (i + 1) % stages) for i in range(stages)]
    shift = jax.shard_map(lambda x: jax.lax.ppermute(x, axes, perm), in_specs=spec,
                          out_specs=spec, axis_names=set(axes))
    return shift(a)


def _where_stage(cond: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """a where cond [stages] holds, else b; a and b [stages, ...]."""
    return jnp.where(cond.reshape(cond.shape + (1,) * (a.ndim - 1)), a, b)


def run(stage_fn: Callable, params: Any, x: jax.Array, args: Sequence[Any], *,
        stages: int, microbatches: int, repeats: int, stage_axes: Tuple[str, ...],
        x_axis: int, x_names: Tuple[str, ...], args_axes: Sequence[Optional[int]],
        key: Optional[jax.Array] = None) -> Tuple[jax.Array, Any]:
    """x through every chunk of layers, in order, as a pipeline. Returns (y, stats).

    stage_fn(chunk_params, x_mb, args_mb, key) -> (y_mb, stats): one chunk's layers on one
        microbatch (x_mb like x with its batch axis cut by `microbatches`); stats a tree of
        arrays (the chunk's statistics, e.g. its routers' losses, means over the microbatch);
    params: leaves [repeats, stages, ...], chunk r * stages + s at [r, s] (sharded over the
        stage axes on their second axis);
    x: [..., batch, ...] with the batch at `x_axis`, logical names `x_names`;
    args: arguments every layer reads, each a tree whose leaves have the batch at
        `args_axes[i]` (None: the same for every microbatch);
    key: dropout's (None: none drawn); chunk c on microbatch m draws from
        fold_in(fold_in(key, c), m).

    y is like x; stats' leaves gain a leading chunk axis [repeats * stages] (chunk order)
    and are summed over the microbatches."""
    with nn.logical_axis_rules(_within_stages(nn.get_logical_axis_rules(), stage_axes)):
        y, stats = _run(stage_fn, params, x, args, S=stages, M=microbatches, R=repeats,
                        stage_axes=stage_axes, x_axis=x_axis, x_names=x_names,
                        args_axes=args_axes, key=key)
    return nn.with_logical_constraint(y, x_names), stats  # the batch as outside


def _within_stages(rules, stage_axes: Tuple[str, ...]):
    """The logical-axis rules within the stages: the stage axes are the pipeline's (its
    `stage` slots') alone, so no other logical axis (the batch, outside the pipeline)
    maps to them."""
    def drop(axes):
        if axes is None or isinstance(axes, str):
            return None if axes in stage_axes else axes
        kept = tuple(a for a in axes if a not in stage_axes)
        return kept or None
    return tuple((name, axes if name == STAGE else drop(axes)) for name, axes in rules)


def _run(stage_fn, params, x, args, *, S, M, R, stage_axes, x_axis, x_names, args_axes, key):
    total = M * R
    xs = _split(x, x_axis, M)
    mb_args = [arg if ax is None else jax.tree.map(lambda a, ax=ax: _split(a, ax, M), arg)
               for arg, ax in zip(args, args_axes)]
    ids = jnp.arange(S)
    slot_names = (STAGE,) + x_names
    store = nn.with_logical_constraint(jnp.broadcast_to(xs, (S,) + xs.shape),
                                       (STAGE, None) + x_names)
    shift = nn.with_logical_constraint(jnp.zeros((S,) + xs.shape[1:], x.dtype), slot_names)

    def chunk_params(rep):  # [R, S, ...] -> each stage's chunk of this iteration: [S, ...]
        if R == 1:
            return jax.tree.map(lambda a: a[0], params)
        return jax.vmap(lambda p, r: jax.tree.map(lambda a: a[r], p), in_axes=(1, 0),
                        spmd_axis_name=stage_axes)(params, rep)

    def per_stage(fn_args, mb, rep):
        """Each stage's chunk, microbatch, arguments and key."""
        p = chunk_params(rep)
        a = [arg if ax is None else jax.vmap(
                lambda m, arg=arg: jax.tree.map(lambda v: v[m], arg))(mb)
             for arg, ax in zip(mb_args, args_axes)]
        k = None if key is None else jax.vmap(
            lambda m, c: jax.random.fold_in(jax.random.fold_in(key, c), m))(mb, rep * S + ids)
        return p, a, k

    stage = jax.vmap(stage_fn, in_axes=(0, 0, [None if ax is None else 0 for ax in args_axes],
                                        None if key is None else 0),
                     spmd_axis_name=stage_axes)
    p0, a0, k0 = per_stage(None, ids * 0, ids * 0)
    stats_shape = jax.eval_shape(stage, p0, shift, a0, k0)[1]
    acc = jax.tree.map(lambda s: jnp.zeros((S, R) + s.shape[1:], s.dtype), stats_shape)

    def iteration(carry, t):
        store, shift, acc = carry
        done = t - ids  # how many microbatch-repeats each stage has taken before this one
        valid = (done >= 0) & (done < total)
        done = jnp.clip(done, 0, total - 1)
        mb, rep = done % M, done // M
        stage_in = nn.with_logical_constraint(
            _where_stage(ids == 0, store[:, t % M], shift), slot_names)
        p, a, k = per_stage(None, mb, rep)
        out, stats = stage(p, stage_in, a, k)
        shift = _rotate(nn.with_logical_constraint(out, slot_names), stage_axes, S)
        # the last stage's output, now at stage 0, goes back into the buffer
        last = t - (S - 1)
        slot = jnp.clip(last, 0, total - 1) % M
        landed = (ids == 0) & (last >= 0) & (last < total)
        store = store.at[:, slot].set(_where_stage(landed, shift, store[:, slot]))
        acc = jax.tree.map(lambda buf, s: jax.vmap(
            lambda b, v, r, ok: b.at[r].add(jnp.where(ok, v, jnp.zeros_like(v))),
            spmd_axis_name=stage_axes)(buf, s, rep, valid), acc, stats)
        return (store, shift, acc), None

    (store, _, acc), _ = jax.lax.scan(iteration, (store, shift, acc),
                                      jnp.arange(total + S - 1))
    y = nn.with_logical_constraint(_merge(store[0], x_axis), x_names)
    stats = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1).reshape((R * S,) + a.shape[2:]), acc)
    return y, stats
