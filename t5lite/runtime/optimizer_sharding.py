"""Where the optimizer state lives: each leaf sharded like the parameter it belongs to,
and, with SHARD_OPTIMIZER_OVER_DATA, split over the `data` axis as well.

The second is Megatron's distributed optimizer (ZeRO stages 1 and 2; MaxText's
`shard_optimizer_over_data`): the parameters stay whole on every data replica, each
replica keeps 1/data of Adam's two moments (or Adafactor's factors) and updates only that
slice of the parameters, and the train step all-gathers the updated parameters. The
gradients are reduce-scattered over `data` to the same slices instead of all-reduced, so
the step moves the same bytes as plain data parallelism (a reduce-scatter and an
all-gather are one all-reduce) while the optimizer state's bytes per device fall by the
data size (`train_step.make_train_step` places the update; `info --memory` prints the
bytes per device).

Which dimension takes `data`: of a leaf's dimensions whose size divides by its mesh axes
times the data size, the one with the most elements per shard (the earliest of equals).
A leaf with no such dimension (a bias of 6 entries on 8 replicas, say) stays replicated
over `data`: correct, only less saved.

    spec = over_axis(P("fsdp", "tensor"), (512, 64), "data", {"data": 8, "fsdp": 2,
                     "tensor": 4})          # P(("fsdp", "data"), "tensor")
"""
from __future__ import annotations

import itertools
import math
from typing import Mapping, Sequence, Tuple, Union

from jax.sharding import PartitionSpec as P

Axes = Union[None, str, Tuple[str, ...]]


def _names(axes: Axes) -> Tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def derived_spec(shape: Sequence[int], param_shape: Sequence[int], param_spec: P) -> P:
    """The spec of an optimizer-state leaf of `shape` that belongs to a parameter of
    `param_shape`: the parameter's spec, less the axes a factored moment reduced away
    (one or several, e.g. Adafactor's [embed] row of an [embed, heads, kv] kernel; the
    later axes are tried first); replicated when it is no such reduction."""
    spec = tuple(param_spec) + (None,) * (len(param_shape) - len(param_spec))
    if tuple(shape) == tuple(param_shape):
        return P(*spec)
    dropped = len(param_shape) - len(shape)
    if 0 < dropped < len(param_shape):
        for drop in reversed(list(itertools.combinations(range(len(param_shape)), dropped))):
            kept = [a for a in range(len(param_shape)) if a not in drop]
            if tuple(param_shape[a] for a in kept) == tuple(shape):
                return P(*(spec[a] for a in kept))
    return P()


def over_axis(spec: P, shape: Sequence[int], axis: str, mesh_shape: Mapping[str, int]) -> P:
    """`spec` (of an array of `shape`) also split over the mesh axis `axis`, on the
    dimension that keeps the most elements per shard and divides; `spec` unchanged when
    `axis` has one device, already shards the array, or divides no dimension."""
    size = mesh_shape.get(axis, 1)
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    if size == 1 or any(axis in _names(e) for e in entries):
        return spec
    best, best_per_shard = None, 0
    for dim, (n, axes) in enumerate(zip(shape, entries)):
        split = math.prod(mesh_shape[a] for a in _names(axes))
        if n % (split * size) == 0 and n // split > best_per_shard:
            best, best_per_shard = dim, n // split
    if best is None:
        return spec
    names = _names(entries[best]) + (axis,)
    out = list(entries)
    out[best] = names[0] if len(names) == 1 else names
    return P(*out)
