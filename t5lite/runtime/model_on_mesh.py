"""Whether a model can run on a mesh's devices, asked before anything is traced: its
experts divide the mesh's expert axis, its layers split into the mesh's pipeline stages
(and its batch into the pipeline's microbatches), its attention and sequences suit a
context axis, and cuDNN's attention has GPUs to run on (a compile-only GPU, `info
--gpu`'s, counts as one). Each answer a ConfigError or PartitioningError of one line
that names the fix."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from jax.sharding import Mesh

from t5lite.errors import ConfigError, PartitioningError
from t5lite.models import pipeline


def check_model_on_mesh(model: Any, mesh: Mesh, platform: Optional[str] = None) -> None:
    """Raise (one line) when `model` (a wrapper with a `config`, or None) cannot run on
    `mesh`; `platform`: what its programs are lowered for when not the devices' own
    ("cuda" for `info --account`'s, lowered on a CPU and never run)."""
    config = getattr(model, "config", None)
    experts = getattr(config, "num_experts", 0)
    if experts and experts % mesh.shape["expert"]:
        raise PartitioningError(
            f"NUM_EXPERTS={experts} does not divide over the mesh's expert axis of "
            f"{mesh.shape['expert']} devices; make the expert entry of ICI_MESH_SHAPE / "
            f"DCN_MESH_SHAPE a divisor of {experts}")
    problem = _context_problem(config, mesh) if config else None
    if problem:
        raise ConfigError(problem)
    problem = pipeline.problem_on_mesh(config, mesh.shape["stage"]) if config else None
    if problem:
        raise PartitioningError(problem)
    platforms = {platform} if platform else {d.platform for d in mesh.devices.flat}
    if getattr(config, "attention_impl", None) == "cudnn" and not platforms <= {"gpu", "cuda"}:
        raise ConfigError(
            f"ATTENTION_IMPL='cudnn' is cuDNN's fused attention, which runs on NVIDIA GPUs, "
            f"and this run's devices are {', '.join(sorted(platforms))}: add "
            f"--gin.ATTENTION_IMPL=\"'xla'\" (the same function on any device)")


def check_batches_on_mesh(model: Any, mesh: Mesh, batch: int, pack: bool) -> None:
    """PartitioningError (one line) when a batch of `batch` examples (one gradient-
    accumulation microbatch) does not cut into the pipeline's microbatches, each divided
    over the data shards within a stage (data x fsdp x expert); ConfigError when packed
    batches reach cuDNN's attention in a pipeline (jax 0.12 cannot batch its
    [batch, 1, q, k] mask over the stages). Nothing to check without stages."""
    if mesh.shape["stage"] == 1:
        return
    config = getattr(model, "config", None)
    problem = pipeline.problem_with_batch(
        getattr(config, "pipeline_microbatches", None), batch,
        mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"])
    if problem:
        raise PartitioningError(problem)
    if pack and getattr(config, "attention_impl", None) == "cudnn":
        raise ConfigError("PACK=True with ATTENTION_IMPL='cudnn' does not run in a pipeline "
                          "(jax's cuDNN attention cannot take the packed rows' mask on every "
                          "stage at once): set PACK=False (cuDNN then takes sequence "
                          "lengths), or ATTENTION_IMPL='xla'")


CONTEXT_ATTENTION = ("xla", "dot_product", "cudnn")
"""The attention implementations context parallelism runs: the einsum with its keys and
values gathered by the partitioner, jax.nn's (XLA's or cuDNN's kernel) in a shard_map over
the context axis (`models/common/context_attention.py`). Not Transformer Engine's."""


def _context_problem(config: Any, mesh: Mesh) -> Optional[str]:
    """What keeps `config` from a context axis over 1 in `mesh`, in one line, or None."""
    if mesh.shape["context"] == 1:
        return None
    impl = getattr(config, "attention_impl", None)
    if impl not in CONTEXT_ATTENTION:
        return (f"context parallelism (a context axis of {mesh.shape['context']}) runs with "
                f"ATTENTION_IMPL {' or '.join(repr(i) for i in CONTEXT_ATTENTION)}, not "
                f"{impl!r}: set --gin.ATTENTION_IMPL=\"'dot_product'\" or a context axis of 1")
    if mesh.shape["stage"] > 1:
        return ("context parallelism does not run inside a pipeline: give the mesh a stage "
                "axis of 1 or a context axis of 1")
    return None


def check_lengths_on_mesh(model: Any, mesh: Mesh, lengths: Mapping[str, int]) -> None:
    """PartitioningError (one line) when a context axis over 1 does not divide the
    sequences the network reads (`lengths`: after packing): into 2 x context equal chunks
    for a causal model that balances them (`context_order`), else into context."""
    shards = mesh.shape["context"]
    if shards == 1:
        return
    balanced = model.balances_context()
    chunks = 2 * shards if balanced else shards
    for name, length in lengths.items():
        if length and length % chunks:
            how = (f"{chunks} equal chunks (two a device, one from each end)" if balanced
                   else f"{chunks} equal slices")
            raise PartitioningError(
                f"a context axis of {shards} cuts every {name} sequence into {how}, and "
                f"TASK_FEATURE_LENGTHS gives {name} {length} tokens: use a multiple of "
                f"{chunks}")
