"""The device mesh: its six axes, and the mesh a run's ICI_MESH_SHAPE and DCN_MESH_SHAPE
lay out over the devices.

    MESH_AXES = ("data", "fsdp", "tensor", "expert", "stage", "context")

- data: whole replicas, each a slice of the batch;
- fsdp: a slice of the batch each, the parameters and optimizer state sharded too
  (gathered per layer as it runs);
- tensor: the heads, MLP columns and vocabulary split (Megatron's tensor parallelism);
- expert: a mixture of experts' experts split (the batch too, outside the experts);
- stage: the layers split into pipeline stages (`t5lite.models.pipeline`): each device
  holds its stage's layers only, and activations move on to the next stage;
- context: every activation's sequence split (context parallelism): each device holds a
  slice of every sequence's tokens and all-gathers the keys and values it attends to.

A shape of three to five entries is the first three to five: the axes left out are 1
(the shipped configs' (data, fsdp, tensor) shapes stay valid). The shapes' products are
the devices within a host (ICI) and the hosts (DCN); one -1 entry in each fills the rest.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from t5lite.errors import PartitioningError

MESH_AXES = ("data", "fsdp", "tensor", "expert", "stage", "context")
# the batch is split over the expert axis too: outside the experts it is data parallel;
# and over the stage axis: outside the pipeline (embeddings, logits, loss) each stage
# takes its share of the rows; inside, every stage sees the whole microbatch
BATCH_AXES = ("data", "fsdp", "expert", "stage")
SHORTEST_SHAPE = 3  # (data, fsdp, tensor)


def full_shape(shape: Sequence[int]) -> Tuple[int, ...]:
    """A shape of 3 to 6 entries with the axes it leaves out as 1."""
    shape = tuple(shape)
    return shape + (1,) * (len(MESH_AXES) - len(shape))


def describe(shape: Sequence[int]) -> str:
    """'data=2 fsdp=4 stage=2': the axes of a full shape that are not 1."""
    return " ".join(f"{a}={s}" for a, s in zip(MESH_AXES, shape) if s != 1) or "one device"


def _fill(shape: Sequence[int], total: int, what: str) -> Tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if not SHORTEST_SHAPE <= len(shape) <= len(MESH_AXES):
        raise PartitioningError(f"{what} must have {SHORTEST_SHAPE} to {len(MESH_AXES)} entries "
                                f"{MESH_AXES}, got {shape}")
    shape = full_shape(shape)
    if shape.count(-1) > 1:
        raise PartitioningError(f"{what}={shape} has more than one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if total % known:
            raise PartitioningError(f"{what}={shape}: {total} devices do not divide by {known}")
        shape = tuple(total // known if s == -1 else s for s in shape)
    return shape


def _as_given(shape: Tuple[int, ...], given: Sequence[int]) -> Tuple[int, ...]:
    """A filled shape as the user wrote it: three entries when they gave three."""
    return shape[:len(given)] if len(given) < len(shape) else shape


def make_mesh(ici_mesh_shape: Sequence[int] = (-1, 1, 1),
              dcn_mesh_shape: Sequence[int] = (1, 1, 1),
              devices: Optional[Sequence[Any]] = None) -> Mesh:
    """Mesh over MESH_AXES. `ici_mesh_shape` lays out the devices within one host (or
    slice), `dcn_mesh_shape` the hosts; the full mesh is their product. One -1 entry in
    each fills the remaining devices."""
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    hosts = len({d.process_index for d in devices})
    dcn = _fill(dcn_mesh_shape, hosts, "DCN_MESH_SHAPE")
    n_dcn = math.prod(dcn)
    if n % n_dcn:
        raise PartitioningError(f"DCN_MESH_SHAPE={_as_given(dcn, dcn_mesh_shape)} does not "
                                f"divide the {n} devices")
    ici = _fill(ici_mesh_shape, n // n_dcn, "ICI_MESH_SHAPE")
    if math.prod(ici) * n_dcn != n:
        raise PartitioningError(
            f"mesh ICI_MESH_SHAPE={_as_given(ici, ici_mesh_shape)} x "
            f"DCN_MESH_SHAPE={_as_given(dcn, dcn_mesh_shape)} has "
            f"{math.prod(ici) * n_dcn} devices but {n} are present; make the product of "
            f"the two shapes equal the device count (a -1 entry fills the rest)")
    if n_dcn == 1:
        try:
            arr = mesh_utils.create_device_mesh(ici, devices)
        except (ValueError, NotImplementedError, AssertionError):
            arr = np.array(devices).reshape(ici)
    else:
        try:
            arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                                       process_is_granule=True)
        except (ValueError, NotImplementedError, AssertionError, AttributeError):
            # group by process: each process's devices form one ICI block
            by_proc = sorted(devices, key=lambda d: (d.process_index, d.id))
            blocks = np.array(by_proc).reshape(dcn + ici)
            k = len(MESH_AXES)
            arr = blocks.transpose([a for i in range(k) for a in (i, k + i)]).reshape(
                tuple(a * b for a, b in zip(dcn, ici)))
    return Mesh(arr, MESH_AXES)


def is_mesh_axes(axes) -> bool:
    """None, one of MESH_AXES, or a tuple / list of them."""
    if axes is None or axes in MESH_AXES:
        return True
    return isinstance(axes, (list, tuple)) and all(a in MESH_AXES for a in axes)


def valid_shape(shape) -> bool:
    """Whether a gin value is a mesh shape: 3 to 6 whole numbers, each >= 1 or -1."""
    return isinstance(shape, (list, tuple)) and SHORTEST_SHAPE <= len(shape) <= len(
        MESH_AXES) and not any(isinstance(s, bool) or not isinstance(s, int)
                               or (s < 1 and s != -1) for s in shape)
