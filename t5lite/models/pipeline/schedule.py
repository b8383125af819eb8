"""The pipeline's schedule: S stages, each holding its chunks of a stack's layers, run M
microbatches R times around (a circular pipeline when R > 1), as one `lax.scan` over
M R + S - 1 iterations whose gradient is autodiff's (GPipe's order: every forward, then
every backward).

In iteration t every stage runs at once (a `vmap` over the stage axis, sharded over the
mesh's `stage` axis, so each device runs its own stage): stage s takes microbatch
(t - s) mod M through its chunk r S + s, r = (t - s) div M, and its output moves to stage
s + 1 by a collective permute. Stage 0 takes its microbatch from one of two buffers of K =
M / S microbatches a stage ([S, K, ...], `buffers`), each moving one slot down a stage an
iteration (column t mod K), so that the slot stage 0 reads is the microbatch it needs:

- `io`: the inputs, where the batch's rows already lie (stage s's K microbatches, each
  split over the data shards); the last stage's outputs enter its last slot, and the
  final repeat's come to rest on the stage whose rows they are (their slots rolled by
  S - 1), so the batch leaves the pipeline where it entered, no row moved;
- `circ` (R > 1): each non-final output, sent from the last stage into the slot that
  reaches stage 0 as its next repeat begins (M >= S: it is back in time).

Memory per device: the two buffers (2 K microbatches, 2 / S of the batch's activations at
the stack's width) and, for the backward pass, what each of the M R + S - 1 iterations
keeps: its stage's input and what the remat policy saves inside its chunk, for one
microbatch (REMAT_POLICY='full': the input alone). The bubble: S - 1 of the M R + S - 1
iterations a stage computes nothing that is used (`settings.bubble_fraction`). A step's
transfers between stages, per device and iteration: one microbatch onwards, one down the
io buffer, and (R > 1) two for the circulation.

Needs nothing of t5lite: jax and flax's logical-axis rules (the `stage` logical axis names
the mesh axes the stages lie on; the batch's names, those it is split over outside).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models.pipeline import buffers

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


def run(stage_fn: Callable, params: Any, x: jax.Array, args: Sequence[Any], *,
        stages: int, microbatches: int, repeats: int, stage_axes: Tuple[str, ...],
        x_axis: int, x_names: Tuple[str, ...], args_axes: Sequence[Optional[int]],
        key: Optional[jax.Array] = None, remat_policy: Optional[Callable] = None
        ) -> Tuple[jax.Array, Any]:
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
        fold_in(fold_in(key, c), m);
    remat_policy: a jax.checkpoint policy for each stage's iteration as a whole (None:
        none): `nothing_saveable` keeps only the stage's input of each iteration.

    y is like x; stats' leaves gain a leading chunk axis [repeats * stages] (chunk order)
    and are summed over the microbatches."""
    shards = _shards(x_names[x_axis], stage_axes)
    with nn.logical_axis_rules(_within_stages(nn.get_logical_axis_rules(), stage_axes)):
        y, stats = _run(stage_fn, params, x, args, S=stages, M=microbatches, R=repeats,
                        stage_axes=stage_axes, x_axis=x_axis, x_names=x_names,
                        args_axes=args_axes, key=key, remat_policy=remat_policy,
                        shards=shards)
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


def _shards(name: Optional[str], stage_axes: Tuple[str, ...]) -> int:
    """The devices a microbatch is split over within a stage: the mesh axes the batch's
    logical `name` maps to outside the pipeline, less the stage axes."""
    axes = nn.logical_to_mesh_axes((name,))[0] if name else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    mesh = jax.sharding.get_abstract_mesh()
    return math.prod(mesh.shape[a] for a in axes if a not in stage_axes)


def _run(stage_fn, params, x, args, *, S, M, R, stage_axes, x_axis, x_names, args_axes, key,
         remat_policy, shards):
    K, total = M // S, M * R
    io = nn.with_logical_constraint(buffers.to_microbatches(x, x_axis, S, K, shards),
                                    (STAGE, None) + x_names)
    mb_args = [arg if ax is None else jax.tree.map(
        lambda a, ax=ax: buffers.to_microbatches(a, ax, S, K, shards).reshape(
            (M,) + a.shape[:ax] + (a.shape[ax] // M,) + a.shape[ax + 1:]), arg)
        for arg, ax in zip(args, args_axes)]
    ids = jnp.arange(S)
    slot_names = (STAGE,) + x_names
    shift = nn.with_logical_constraint(jnp.zeros((S,) + io.shape[2:], x.dtype), slot_names)
    circ = jnp.zeros_like(io) if R > 1 else None
    back_row = -(-(M - S + 1) // K) - 1  # where a circulating output enters: just in time

    def one_stage(runs, x_mb, rep, mb, stage_id):
        """A stage's chunk of this iteration on its microbatch: `runs` [R, ...] its chunks
        (and the arguments and key, the same for every stage) picked inside, so that
        what a remat policy keeps of an iteration is its input, never a copy of weights."""
        p = jax.tree.map(lambda a: a[rep], runs)
        a = [arg if ax is None else jax.tree.map(lambda v: v[mb], arg)
             for arg, ax in zip(mb_args, args_axes)]
        k = None if key is None else jax.random.fold_in(
            jax.random.fold_in(key, rep * S + stage_id), mb)
        return stage_fn(p, x_mb, a, k)

    if remat_policy is not None:
        one_stage = jax.checkpoint(one_stage, policy=remat_policy, prevent_cse=False)
    # every stage at once: a vmap over the [stages, ...] slots, sharded over the stage axes
    # (each device runs its own stage; within it the other axes shard as anywhere)
    stage = jax.vmap(one_stage, in_axes=(1, 0, 0, 0, 0), spmd_axis_name=stage_axes)
    stats_shape = jax.eval_shape(stage, params, shift, ids * 0, ids * 0, ids)[1]
    acc = jax.tree.map(lambda s: jnp.zeros((S, R) + s.shape[1:], s.dtype), stats_shape)

    def iteration(carry, t):
        io, circ, shift, acc = carry
        column = t % K
        done = t - ids  # how many microbatch-repeats each stage has taken before this one
        valid = (done >= 0) & (done < total)
        done = jnp.clip(done, 0, total - 1)
        mb, rep = done % M, done // M
        first = io[:, column] if R == 1 else jnp.where(t < M, io[:, column], circ[:, column])
        stage_in = nn.with_logical_constraint(buffers.where_stage(ids == 0, first, shift),
                                              slot_names)
        out, stats = stage(params, stage_in, rep, mb, ids)
        out = nn.with_logical_constraint(out, slot_names)
        shift = buffers.permute(out, stage_axes, S, 1)
        io = buffers.rotate_column(io, column, out, stage_axes)
        if R > 1:  # the last stage's output, but for the final repeat's, comes round
            last = t - (S - 1)
            goes_round = (last >= 0) & (last < total - M)
            back = jnp.clip(last, 0, total - 1) % M % K
            circ = buffers.rotate_column(circ, column, jnp.zeros_like(out), stage_axes)
            sent = buffers.permute(out, stage_axes, S, back_row - (S - 1))
            circ = circ.at[:, back].set(buffers.where_stage(
                (ids == back_row) & goes_round, sent, circ[:, back]))
        acc = jax.tree.map(lambda buf, s: jax.vmap(
            lambda b, v, r, ok: b.at[r].add(jnp.where(ok, v, jnp.zeros_like(v))),
            spmd_axis_name=stage_axes)(buf, s, rep, valid), acc, stats)
        return (io, circ, shift, acc), None

    (io, _, _, acc), _ = jax.lax.scan(iteration, (io, circ, shift, acc),
                                      jnp.arange(total + S - 1))
    # microbatch s K + k's final output rests in io[s, (k + S - 1) mod K]
    y = buffers.from_microbatches(jnp.roll(io, -(S - 1), axis=1), x_axis, shards)
    stats = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1).reshape((R * S,) + a.shape[2:]), acc)
    return y, stats
