"""The pipeline's settings (PIPELINE_MICROBATCHES, PIPELINE_REPEATS: fields of every model
config, `configs.Switches`), their one-line checks, and what a schedule costs.

A config is pipelined when PIPELINE_MICROBATCHES is set; it then runs as a pipeline on a
mesh whose `stage` axis is over 1, and as one stack of scanned layers on any other. Its
layers are stored stacked either way (`t5lite.models.layouts.stacked`), so a checkpoint
moves between stage counts.
"""
from __future__ import annotations

from typing import Optional


def check(cfg, pipelines: bool) -> None:
    """ValueError (one line) for pipeline settings that cannot work, whatever the mesh;
    `pipelines`: whether the config's family runs as a pipeline (decoder-only does)."""
    micro, runs = cfg.pipeline_microbatches, cfg.pipeline_repeats
    if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int)
                              or micro < 1):
        raise ValueError(f"PIPELINE_MICROBATCHES (pipeline_microbatches) must be None (no "
                         f"pipeline) or a whole number >= 1, got {micro!r}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"PIPELINE_REPEATS (pipeline_repeats) must be a whole number >= 1, "
                         f"got {runs!r}")
    if not pipelines and (micro is not None or runs != 1):
        raise ValueError("an encoder-decoder (T5) does not run as a pipeline: unset "
                         "PIPELINE_MICROBATCHES and PIPELINE_REPEATS, and spread it with "
                         "the fsdp and tensor mesh axes (T5X's layout for T5 XXL: TP 8)")
    if runs > 1 and (micro is None and not cfg.scan_layers):
        raise ValueError(f"PIPELINE_REPEATS={runs} cuts stacked layers into runs: set "
                         f"PIPELINE_MICROBATCHES (a pipeline) or SCAN_LAYERS=True")
    layers = getattr(cfg, "num_layers", None)
    period = getattr(cfg, "layer_period", 1)
    if layers is not None and runs > 1 and layers % (runs * period):
        raise ValueError(f"PIPELINE_REPEATS={runs} must divide the {layers} layers into "
                         f"runs of whole blocks of {period} layer(s)")


def problem_on_mesh(cfg, stages: int) -> Optional[str]:
    """Why `cfg` cannot run on a mesh whose stage axis has `stages` devices (one line
    naming the fix), or None."""
    if stages == 1:
        return None
    micro = getattr(cfg, "pipeline_microbatches", None)
    where = f"the mesh's stage axis has {stages} devices"
    if not hasattr(cfg, "num_layers"):
        return (f"{where}, and an encoder-decoder (T5) does not run as a pipeline: put "
                f"those devices on the fsdp or tensor axis of ICI_MESH_SHAPE / "
                f"DCN_MESH_SHAPE (T5X's layout for T5 XXL: TP 8)")
    if micro is None:
        return (f"{where}: set PIPELINE_MICROBATCHES (at least {stages}; more shrinks the "
                f"bubble), or make the stage entry of the mesh 1")
    if micro < stages:
        return (f"PIPELINE_MICROBATCHES={micro} is fewer than the {stages} pipeline stages "
                f"(every stage would idle): use at least {stages}")
    if micro % stages:
        return (f"PIPELINE_MICROBATCHES={micro} is not a multiple of the {stages} pipeline "
                f"stages (each stage holds as many of them): use "
                f"{(micro // stages + 1) * stages}")
    runs, period = cfg.pipeline_repeats, getattr(cfg, "layer_period", 1)
    chunks = stages * runs
    if cfg.num_layers % (chunks * period):
        unit = f"{chunks} x {period} (MOE_EVERY)" if period > 1 else f"{chunks}"
        return (f"{cfg.num_layers} layers do not split into {stages} stages x "
                f"{runs} repeat(s) of equal chunks{' of whole MOE_EVERY blocks' if period > 1 else ''}: "
                f"use a layer count that divides by {unit}, or another stage entry / "
                f"PIPELINE_REPEATS")
    if cfg.fp8:
        return f"{where}, and FP8's statistics do not run through the pipeline yet: set FP8=False"
    if cfg.attention_impl == "te":
        return (f"{where}, and Transformer Engine's attention does not run through the "
                f"pipeline: use ATTENTION_IMPL='cudnn'")
    if cfg.attention_impl == "cudnn" and getattr(cfg, "position_embedding", "") == "relative":
        return (f"{where}, and jax's cuDNN attention cannot take each stage's relative "
                f"position bias at once (GLaM's): use ATTENTION_IMPL='xla' in a pipeline")
    return None


def problem_with_batch(micro: Optional[int], batch: int, data_shards: int) -> Optional[str]:
    """Why a batch of `batch` examples (one gradient-accumulation microbatch) does not cut
    into `micro` pipeline microbatches that divide over `data_shards`, or None."""
    if not micro:
        return None
    if batch % micro:
        return (f"a batch of {batch} examples does not divide into PIPELINE_MICROBATCHES="
                f"{micro}")
    if (batch // micro) % data_shards:
        return (f"a pipeline microbatch of {batch // micro} examples ({batch} / "
                f"PIPELINE_MICROBATCHES={micro}) does not divide over the {data_shards} data "
                f"shards: use a batch that is a multiple of {micro * data_shards}")
    return None


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The share of a step's stage-iterations spent idle: (S - 1) / (M R + S - 1) of the
    schedule (`schedule.run`): S stages, M microbatches, R repeats (a circular pipeline's
    bubble is the same S - 1 iterations of an R times longer loop)."""
    if stages <= 1:
        return 0.0
    return (stages - 1) / (microbatches * repeats + stages - 1)
