"""The partitioner shared by every model family: the device mesh (`t5lite.runtime.mesh`), the
logical-axis rules that map the models' axis names onto it, shardings for parameters,
optimizer and FP8 state and batches, host-slice -> global-array batches, jitted functions
that run under the mesh and rules (`Partitioner.partition`), and process 0's decisions
shared with every process.

Models never name a mesh axis; they tag parameters and activations with logical names
(`batch`, `length`, `embed`, `heads`, `kv`, `joined_kv`, `mlp`, `vocab`, `relpos_buckets`,
`layers`, `lora_rank`, `expert`, ...). `DEFAULT_RULES` maps them: batch -> data+fsdp+expert
+stage (inside a pipeline's stages the stage axis is theirs: `models/pipeline`),
embed -> fsdp+context+expert (FSDP over the experts, as Pax's GPU GLaM and MaxText, and
over the context devices, as MaxText; an expert kernel's embed fsdp+context), heads /
joined_kv / mlp / vocab -> tensor, expert -> expert, a stacked layer axis `layers` and the
pipeline's `stage` slots -> stage, sequences (`activation_length`, `length`) -> context
(keys' and values' `kv_length` whole), the rest (LoRA's rank, the residual stream's
`activation_embed`: T5X's activation_partitioning_dims=2 splits it over tensor)
replicated. Extra rules, the gin macro
PARTITION_RULES (`--gin.PARTITION_RULES="[('kv', 'tensor')]"`), are tried before the
defaults. The optimizer state follows its parameters, and with SHARD_OPTIMIZER_OVER_DATA
is split over `data` too (`optimizer_sharding`). `MeshSettings` carries ICI_MESH_SHAPE,
DCN_MESH_SHAPE, PARTITION_RULES, SHARD_OPTIMIZER_OVER_DATA and SEQUENCE_PARALLEL.

    partitioner = MeshSettings.data_parallel().partitioner()
    step = partitioner.partition(step_fn, in_shardings=..., out_shardings=..., donate_argnums=(0,))
    new_state, metrics = step(state, batch)     # under the mesh and the axis rules
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5lite.data.edge import DataLayout
from t5lite.errors import ConfigError, PartitioningError
from t5lite.runtime.mesh import BATCH_AXES, MESH_AXES, is_mesh_axes, make_mesh, valid_shape
from t5lite.runtime.model_on_mesh import check_model_on_mesh
from t5lite.runtime.optimizer_sharding import derived_spec, over_axis

log = logging.getLogger(__name__)


# Order matters: an earlier rule claims its mesh axes first (so an activation's `embed`
# does not take `fsdp` once its `batch` has it).
DEFAULT_RULES: Tuple[Tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("expert", "expert"),
    # dispatched tokens' groups: the batch's split less the expert axis (all-to-all)
    ("expert_groups", ("data", "fsdp")),
    ("expert_logits", None),
    # FSDP over the experts and the context devices too (MaxText's): a context axis
    # holds one copy of the weights between its devices, gathered layer by layer
    ("embed", ("fsdp", "context", "expert")),
    ("embed", ("fsdp", "context")),
    ("activation_embed", None),  # the residual stream: whole (module docstring)
    # sequences: a residual stream's (SEQUENCE_PARALLEL: over tensor too), a per-token
    # activation's, split by context parallelism; keys and values whole (all-gathered)
    ("activation_length", "context"),
    ("length", "context"),
    ("kv_length", None),
    ("heads", "tensor"),
    ("joined_kv", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("layers", "stage"),  # stacked layers: each pipeline stage holds its own
    ("stage", "stage"),  # the pipeline's per-stage slots of activations
    ("pipeline_repeats", None),
    ("stack", None),
    ("relpos_buckets", None),
    ("abspos_buckets", None),
    ("lora_rank", None),
)


# ----------------------------------------------------------------------------- shardings


def use_threefry_gpu_kernel() -> None:
    """On a GPU, jax's random bits come from its threefry CUDA kernel instead of the
    hash unrolled into every fusion that draws them: the same bits, and a T5 large
    initializer compiled for an H200 in 4.7 s instead of 10.7 s (docs/performance.md).
    Nothing changes on a CPU. A process-wide jax setting, set once (updating jax's config
    clears its caches); JAX_THREEFRY_GPU_KERNEL_LOWERING=0 in the environment keeps the
    other lowering (gpu_session.sh's A/B)."""
    if "JAX_THREEFRY_GPU_KERNEL_LOWERING" in os.environ:
        return
    if not jax.config.jax_threefry_gpu_kernel_lowering:
        jax.config.update("jax_threefry_gpu_kernel_lowering", True)



@dataclasses.dataclass
class Partitioner:
    """Mesh + logical rules; turns logical axis names into shardings."""

    mesh: Mesh
    extra_rules: Sequence[Tuple[str, Any]] = ()
    model_context: Callable[[], Any] = contextlib.nullcontext
    """What the model needs entered while it is traced (`model.tracing_context`)."""
    shard_optimizer_over_data: bool = False
    """SHARD_OPTIMIZER_OVER_DATA: the optimizer state, and the update computed on it,
    split over `data` too (`optimizer_sharding`)."""
    sequence_parallel: bool = False
    """SEQUENCE_PARALLEL: the residual stream's sequence split over `tensor`."""

    def __post_init__(self):
        use_threefry_gpu_kernel()

    @property
    def rules(self) -> Tuple[Tuple[str, Any], ...]:
        """SEQUENCE_PARALLEL's rule, the extra rules, then the defaults (no expert axis:
        fsdp+expert reads as fsdp; no stage or context axis: nothing maps to it, so specs
        name no axis of one device)."""
        sequence = ((("activation_length", self._without_unit_axes(("context", "tensor"))),)
                    if self.sequence_parallel else ())
        return sequence + tuple((name, tuple(m) if isinstance(m, list) else m)
                                for name, m in self.extra_rules) + tuple(
            (name, self._without_unit_axes(m, weights=name == "embed"))
            for name, m in DEFAULT_RULES)

    def _without_unit_axes(self, axes, weights: bool = False):
        """`axes` less a stage or context axis of one device (and for the weights' `embed`,
        an expert axis of one), one left as its name: specs name no axis of size 1, and
        a mesh without those axes shards as it did before they existed."""
        unit = {a for a in ("stage", "context") if self.mesh.shape.get(a, 1) == 1}
        if weights and self.mesh.shape.get("expert", 1) == 1:
            unit.add("expert")
        if not unit or axes is None:
            return axes
        if isinstance(axes, str):
            return None if axes in unit else axes
        kept = tuple(a for a in axes if a not in unit)
        return (kept[0] if weights and len(kept) == 1 else kept) or None

    @property
    def batch_axes(self) -> Tuple[str, ...]:
        """The mesh axes the batch is split over (`BATCH_AXES`, less a stage axis of one)."""
        return self._without_unit_axes(BATCH_AXES)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """The mesh and the logical-axis rules, for tracing model code outside `partition`
        (e.g. `jax.eval_shape` of an initializer), plus the model's own context.

        The mesh is entered with `jax.set_mesh`, which sets the abstract mesh that Flax's
        `with_logical_constraint` reads: under the deprecated `with mesh:` that mesh is
        empty and every activation constraint of the models is silently dropped."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules), \
                self.model_context():
            yield

    def partition(self, fn: Callable, *, in_shardings: Any = None, out_shardings: Any = None,
                  donate_argnums: Sequence[int] = (),
                  static_argnames: Sequence[str] = (),
                  compiler_options: Optional[Dict[str, Any]] = None) -> "PartitionedFunction":
        """`jax.jit(fn, ...)` whose calls (and `lower`) run under this mesh and rules.
        Shardings left None are inferred from the arguments (jit's default)."""
        kwargs = {"donate_argnums": tuple(donate_argnums),
                  "static_argnames": tuple(static_argnames),
                  "compiler_options": compiler_options}
        if in_shardings is not None:
            kwargs["in_shardings"] = in_shardings
        if out_shardings is not None:
            kwargs["out_shardings"] = out_shardings
        return PartitionedFunction(jax.jit(fn, **kwargs), self)

    def axis_size(self, mesh_axes) -> int:
        if mesh_axes is None:
            return 1
        names = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
        return math.prod(self.mesh.shape[a] for a in names)

    def spec_for(self, names: Optional[Sequence[Optional[str]]], shape: Sequence[int]) -> P:
        """PartitionSpec for an array with logical axis `names`; a dimension that does not
        divide by its mesh axes stays unsharded."""
        if not names:
            return P()
        mesh_axes = nn.logical_to_mesh_axes(tuple(names), self.rules)
        out = []
        for dim, axes in zip(shape, mesh_axes):
            out.append(axes if axes is not None and dim % self.axis_size(axes) == 0 else None)
        return P(*out)

    def sharding(self, spec: P) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def tree_shardings(self, abstract_tree, names_tree):
        """Shardings for a tree of ShapeDtypeStructs given a matching tree of logical-name
        PartitionSpecs (as `model.logical_axes()` returns)."""
        return jax.tree_util.tree_map(
            lambda a, n: self.sharding(self.spec_for(tuple(n), a.shape)), abstract_tree,
            names_tree, is_leaf=lambda x: isinstance(x, P))

    def update_spec(self, spec: P, shape: Sequence[int]) -> P:
        """Where the optimizer holds and updates a leaf of `shape` whose parameter's spec
        is `spec`: there, or with SHARD_OPTIMIZER_OVER_DATA split over `data` too."""
        if not self.shard_optimizer_over_data:
            return spec
        return over_axis(spec, shape, "data", dict(self.mesh.shape))

    def update_shardings(self, abstract_params, param_specs):
        """`update_spec`'s shardings for a tree of parameters and their specs."""
        return jax.tree_util.tree_map(
            lambda a, s: self.sharding(self.update_spec(s, a.shape)), abstract_params,
            param_specs, is_leaf=lambda x: isinstance(x, P))

    def opt_state_shardings(self, abstract_opt_state, abstract_params, param_specs):
        """Shard each optimizer-state leaf like the parameter it belongs to: same shape ->
        same spec; a factored moment (one dimension reduced away) -> the spec without that
        dimension; anything else (counts, scalars) replicated. With
        SHARD_OPTIMIZER_OVER_DATA each is split over `data` too (`update_spec`)."""
        params_def = jax.tree_util.tree_structure(abstract_params)
        flat_params = jax.tree_util.tree_leaves(abstract_params)
        flat_specs = jax.tree_util.tree_leaves(param_specs, is_leaf=lambda x: isinstance(x, P))

        def like_params(sub):
            leaves = jax.tree_util.tree_leaves(sub)
            return jax.tree_util.tree_unflatten(
                params_def,
                [self.sharding(self.update_spec(derived_spec(leaf.shape, p.shape, s),
                                                leaf.shape))
                 for leaf, p, s in zip(leaves, flat_params, flat_specs)])

        def is_params_like(x):
            try:
                return jax.tree_util.tree_structure(x) == params_def
            except Exception:  # noqa: BLE001 - exotic nodes are simply not params-like
                return False

        return jax.tree_util.tree_map(
            lambda x: like_params(x) if is_params_like(x) else self.replicated(),
            abstract_opt_state, is_leaf=is_params_like)

    # -- batches -------------------------------------------------------------------
    def batch_spec(self, ndim: int = 2) -> P:
        return P(self.batch_axes, *([None] * (ndim - 1)))

    def batch_sharding(self, ndim: int = 2) -> NamedSharding:
        return self.sharding(self.batch_spec(ndim))

    @property
    def data_shards(self) -> int:
        return self.axis_size(self.batch_axes)

    def data_layout(self, global_batch_size: int, num_microbatches: int = 1) -> DataLayout:
        """The rows of each global batch this process must supply, as its data shard
        (T5X's get_data_layout): read off the batch sharding, so processes that hold the
        same rows (a model-parallel axis across hosts) share a shard. PartitioningError
        (one line) when the batch, or each of its NUM_MICROBATCHES microbatches, does not
        divide over the data shards: the one place that is checked (BATCH_SIZE itself is
        checked at the edge)."""
        per = global_batch_size // max(num_microbatches, 1)
        if global_batch_size % max(num_microbatches, 1):
            raise PartitioningError(
                f"BATCH_SIZE={global_batch_size} does not divide into NUM_MICROBATCHES="
                f"{num_microbatches}")
        if per % self.data_shards:
            raise PartitioningError(
                f"batch of {per} examples (BATCH_SIZE={global_batch_size} / NUM_MICROBATCHES="
                f"{num_microbatches}) does not divide over {self.data_shards} data shards "
                f"(mesh {' x '.join(self.batch_axes)} = "
                f"{' x '.join(str(self.mesh.shape[a]) for a in self.batch_axes)}); "
                f"use a multiple of {self.data_shards}")
        sharding = self.batch_sharding(1)
        index_map = sharding.addressable_devices_indices_map((global_batch_size,))
        start = min(idx[0].start or 0 for idx in index_map.values())
        stop = max(global_batch_size if idx[0].stop is None else idx[0].stop
                   for idx in index_map.values())
        rows = stop - start
        return DataLayout(global_batch_size, start // rows, global_batch_size // rows)

    def host_to_global(self, host_batch: dict, layout: DataLayout) -> dict:
        """This process's rows of `layout` (numpy) -> global jax.Arrays sharded on the
        batch axes."""
        out = {}
        for name, x in host_batch.items():
            x = np.asarray(x)
            out[name] = jax.make_array_from_process_local_data(
                self.batch_sharding(x.ndim), x, (layout.batch_size,) + x.shape[1:])
        return out


class PartitionedFunction:
    """A jitted function bound to a partitioner: each call enters its mesh and rules."""

    def __init__(self, jitted, partitioner: Partitioner):
        self._jitted, self._partitioner = jitted, partitioner

    def __call__(self, *args, **kwargs):
        with self._partitioner.context():
            return self._jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        """`jax.jit(...).lower(...)` under the mesh and rules (for compiled memory stats)."""
        with self._partitioner.context():
            return self._jitted.lower(*args, **kwargs)

    def lower_for(self, platform: str, *args):
        """The program lowered for `platform` ("cuda", say) whatever this machine has: its
        StableHLO can be read, not compiled, here."""
        with self._partitioner.context():
            return self._jitted.trace(*args).lower(lowering_platforms=(platform,))


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    """Where the arrays live: ICI_MESH_SHAPE and DCN_MESH_SHAPE over (data, fsdp, tensor,
    expert, stage, context) (three to six entries: the axes left out are 1; one -1 entry
    in each fills the devices), PARTITION_RULES, extra (logical name, mesh axes) rules tried
    before `DEFAULT_RULES`, SHARD_OPTIMIZER_OVER_DATA (`optimizer_sharding`) and
    SEQUENCE_PARALLEL (the residual stream's `activation_length` over `tensor`)."""

    ici_mesh_shape: Sequence[int]
    dcn_mesh_shape: Sequence[int]
    partition_rules: Sequence[Tuple[str, Any]]
    shard_optimizer_over_data: Optional[bool] = None  # None: off (runs/_shared.gin sets it)
    sequence_parallel: Optional[bool] = None

    def __post_init__(self):
        for name, shape in (("ICI_MESH_SHAPE", self.ici_mesh_shape),
                            ("DCN_MESH_SHAPE", self.dcn_mesh_shape)):
            if not valid_shape(shape):
                raise ConfigError(f"{name} must be 3 to {len(MESH_AXES)} whole numbers "
                                  f"{list(MESH_AXES)} (the axes left out are 1), each >= 1 "
                                  f"or one -1 (the rest of the devices), e.g. [-1, 1, 1]; "
                                  f"got {shape!r}")
        rules = self.partition_rules
        if not isinstance(rules, (list, tuple)) or any(
                not isinstance(r, (list, tuple)) or len(r) != 2 or not isinstance(r[0], str)
                or not is_mesh_axes(r[1]) for r in rules):
            raise ConfigError(f"PARTITION_RULES must be a list of (logical axis, mesh axes) "
                              f"pairs, the mesh axes None, one of {list(MESH_AXES)} or a tuple "
                              f"of them, e.g. [('embed', 'fsdp')]; got {rules!r}")
        for name, value in (("SHARD_OPTIMIZER_OVER_DATA", self.shard_optimizer_over_data),
                            ("SEQUENCE_PARALLEL", self.sequence_parallel)):
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{name} must be True or False; got {value!r}")

    @classmethod
    def data_parallel(cls) -> "MeshSettings":
        """Every device on the data axis, no extra rules: the mesh of a library caller that
        names none (a run's comes from configs/runs/_shared.gin)."""
        return cls(ici_mesh_shape=(-1, 1, 1), dcn_mesh_shape=(1, 1, 1), partition_rules=())

    def partitioner(self, devices: Optional[Sequence[Any]] = None, model: Any = None,
                    platform: Optional[str] = None) -> Partitioner:
        """The mesh over `devices` (default all) with these rules; with `model`, checked
        against the mesh (`check_model_on_mesh`; `platform` when its programs are lowered
        for another than the devices'), its tracing context (Transformer
        Engine's mesh resource) joins the mesh and rules."""
        mesh = make_mesh(self.ici_mesh_shape, self.dcn_mesh_shape, devices)
        check_model_on_mesh(model, mesh, platform)
        if self.shard_optimizer_over_data and mesh.shape["data"] == 1:
            log.warning("SHARD_OPTIMIZER_OVER_DATA: the mesh's data axis has one device, so "
                        "the optimizer state is sharded as the parameters are")
        if self.sequence_parallel and mesh.shape["tensor"] == 1:
            raise PartitioningError(
                "SEQUENCE_PARALLEL splits the sequence over the tensor axis, which has one "
                "device here: give ICI_MESH_SHAPE a tensor entry over 1 (e.g. [1, -1, 4]) "
                "or leave SEQUENCE_PARALLEL off")
        extra = {"shard_optimizer_over_data": bool(self.shard_optimizer_over_data),
                 "sequence_parallel": bool(self.sequence_parallel)}
        if model is not None:
            axes = {name: name for name in MESH_AXES}
            extra["model_context"] = lambda: model.tracing_context(axes)
        return Partitioner(mesh, self.partition_rules, **extra)

