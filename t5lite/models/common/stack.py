"""Running a stack of identical layers: a Python loop (`layers_0..layers_{n-1}`),
`nn.scan` over one `layers` subtree whose parameters gain a leading `layers` axis
(`repeats` [runs, layers / runs] with PIPELINE_REPEATS), or a pipeline over the mesh's
stage axis (`run_stack`: `t5lite.models.pipeline`'s schedule over the stacked layers),
each layer optionally rematerialized with a policy chosen by `checkpoint_name` tags.

Tags set by the layers: query_proj, key_proj, value_proj, qkv_proj, kv_proj, out_proj,
mlpwi, mlpwo.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import layouts, moe, pipeline
from t5lite.models.common.layers import gemm_input_views
from t5lite.models.common.precision import FP8_COLLECTION

_PROJECTIONS = ("query_proj", "key_proj", "value_proj", "qkv_proj", "kv_proj")


def remat_policy(name: str):
    """Map a REMAT_POLICY name to a jax checkpoint policy (None: no remat)."""
    cp = jax.checkpoint_policies
    return {
        "none": None,
        "full": cp.nothing_saveable,
        "minimal": cp.dots_with_no_batch_dims_saveable,
        "save_qkv_proj": cp.save_only_these_names(*_PROJECTIONS),
        "save_out_proj": cp.save_only_these_names("out_proj"),
        "save_dot_except_mlp": cp.save_only_these_names(*_PROJECTIONS, "out_proj"),
    }[name]


class _Block(nn.Module):
    """`len(attrs)` consecutive layers, the j-th `layer_cls(name=f"block_{j}",
    **attrs[j], **kwargs)`: the unit a scan repeats when the layers alternate (a
    mixture-of-experts layer every `period`-th)."""

    layer_cls: Any
    attrs: Tuple[Tuple[Tuple[str, Any], ...], ...]
    kwargs: Tuple[Tuple[str, Any], ...]

    @nn.compact
    def __call__(self, x, *args):
        for j, attrs in enumerate(self.attrs):
            x = self.layer_cls(name=f"block_{j}", **dict(attrs), **dict(self.kwargs))(x, *args)
        return x, None


def run_layers(layer_cls: type, num_layers: int, x: jax.Array, args: Sequence[Any], *,
               scan: bool, remat: str,
               per_layer: Optional[Callable[[int], Dict[str, Any]]] = None,
               period: int = 1, gemm_reads: Optional[Dict[int, int]] = None,
               runs: int = 1, **layer_kwargs) -> jax.Array:
    """Apply `num_layers` instances of `layer_cls(**layer_kwargs)` to x, each called as
    `layer(x, *args)` (args are shared by every layer). Must be called inside a compact
    method of the parent module. Layers take a `scanned` attribute and return
    `(x, None)` when it is set, as nn.scan requires. A decoding KV cache (collection
    "cache") gains a leading `layers` axis under scan, like the parameters, and so do the
    statistics layers sow ("intermediates"). `per_layer(i)`: attributes that differ
    between layers (a mixture-of-experts layer among dense ones), repeating every
    `period` layers: a scan then repeats a block of `period` layers (`layers/block_{j}`
    holds layers j, j + period, ...; `period` must divide `num_layers`).

    `gemm_reads` {k: m}: args[k] is read by m GEMMs in every layer (T5's encoder output,
    by each cross-attention's key and value projections). Each layer then gets a tuple of
    m views of it instead; unrolled, the views of all layers are one chain of
    `layers.gemm_input_views`, so that on a GPU the gradients of every layer add up in
    place in their GEMMs (a scan adds them in its loop)."""
    per_layer = per_layer or (lambda i: {})
    gemm_reads = gemm_reads or {}
    if scan:
        args = [(a,) * gemm_reads[k] if k in gemm_reads else a for k, a in enumerate(args)]
    policy = remat_policy(remat)
    if scan and period > 1:
        block = functools.partial(
            _Block, layer_cls,
            tuple(tuple(sorted(per_layer(j).items())) for j in range(period)),
            tuple(sorted(layer_kwargs.items())))
        cls = nn.remat(block, policy=policy, prevent_cse=False) if policy else block
        return _scan_runs(cls, num_layers // period, runs, args)()(x, *args)[0]
    cls = layer_cls
    if policy is not None:
        cls = nn.remat(layer_cls, policy=policy, prevent_cse=not scan)
    if scan:
        x, _ = _scan_runs(cls, num_layers, runs, args)(scanned=True, **per_layer(0),
                                                        **layer_kwargs)(x, *args)
        return x
    views = {k: gemm_input_views(args[k], m * num_layers) for k, m in gemm_reads.items()}
    for i in range(num_layers):
        layer_args = [views[k][i * gemm_reads[k]:(i + 1) * gemm_reads[k]] if k in views else a
                      for k, a in enumerate(args)]
        x = cls(name=f"layers_{i}", **per_layer(i), **layer_kwargs)(x, *layer_args)
    return x


def _scan(cls, length: int, args: Sequence[Any], axis: str = "layers"):
    return nn.scan(
        cls,
        variable_axes={"params": 0, FP8_COLLECTION: 0, "cache": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * len(args),
        length=length,
        metadata_params={nn.PARTITION_NAME: axis},
    )


def _scan_runs(cls, length: int, runs: int, args: Sequence[Any]):
    """A scan over `length` (`layers`), or `runs` scans of length / runs (`repeats`)."""
    if runs == 1:
        return functools.partial(_scan(cls, length, args), name="layers")
    return functools.partial(_scan(_scan(cls, length // runs, args), runs, args,
                                   "pipeline_repeats"), name="repeats")


# ----------------------------------------------------------------------------- pipeline


class _Chunk(nn.Module):
    """`num_layers` consecutive layers of a stack, run as `run_layers` runs them: one
    pipeline stage's chunk, applied to the stacked parameters' slice it holds."""

    layer_cls: Any
    num_layers: int
    scan: bool
    remat: str
    attrs: Tuple[Tuple[Tuple[str, Any], ...], ...]  # per_layer(i), i < num_layers
    period: int
    kwargs: Tuple[Tuple[str, Any], ...]

    @nn.compact
    def __call__(self, x, *args):
        return run_layers(self.layer_cls, self.num_layers, x, args, scan=self.scan,
                          remat=self.remat, per_layer=lambda i: dict(self.attrs[i]),
                          period=self.period, **dict(self.kwargs))


def run_stack(parent: nn.Module, layer_cls: type, num_layers: int, x: jax.Array,
              args: Sequence[Any], *, cfg, x_axis: int, x_names: Tuple[str, ...],
              args_axes: Sequence[Optional[int]], deterministic: bool, decode: bool,
              per_layer: Callable[[int], Dict[str, Any]], **layer_kwargs) -> jax.Array:
    """`run_layers` for `parent`'s stack (called in its compact method), as a pipeline
    when `cfg` sets PIPELINE_MICROBATCHES and the mesh has stages: the stacked layers'
    parameters (read from `parent`'s variables) cut into a chunk per stage and repeat,
    `pipeline.run` over them. Initializing, decoding, or on a mesh without stages, the
    layers of a pipelined config run scanned (the same parameters). x's batch sits at
    `x_axis` (logical names `x_names`), each arg's at `args_axes[i]` (None: shared).
    The routers' statistics (a mixture of experts) are sown by `parent` as `moe_<stat>`,
    one value per MoE layer in layer order, the mean over the microbatches. REMAT_POLICY
    applies to each stage's chunk as a whole: 'full' keeps only a stage's input for each
    iteration of the schedule and recomputes its layers in the backward pass (otherwise
    every layer's input of every iteration is kept: GPipe's memory)."""
    kw = dict(remat=cfg.remat_policy, per_layer=per_layer, period=cfg.layer_period,
              deterministic=deterministic, decode=decode, cfg=cfg, **layer_kwargs)
    if not layouts.stacked(cfg):
        return run_layers(layer_cls, num_layers, x, args, scan=False, **kw)
    runs, (stages, stage_axes) = layouts.repeats(cfg), pipeline.mesh_stages()
    if parent.is_initializing() or decode or stages == 1:
        return run_layers(layer_cls, num_layers, x, args, scan=True, runs=runs, **kw)
    batch = x.shape[x_axis]
    problem = pipeline.problem_on_mesh(cfg, stages) or pipeline.problem_with_batch(
        cfg.pipeline_microbatches, batch, 1)
    if problem:  # where a run's own checks did not come first (a library caller)
        raise ConfigError(problem)
    stored = parent.variables["params"]["repeats" if runs > 1 else "layers"]
    per_chunk = num_layers // (stages * runs)
    chunks = jax.tree.map(lambda a: a.reshape(
        (runs, stages, per_chunk // cfg.layer_period) + a.shape[2 if runs > 1 else 1:]), stored)
    chunk = _Chunk(layer_cls, per_chunk, cfg.scan_layers, "none",
                   tuple(tuple(sorted(per_layer(i).items())) for i in range(per_chunk)),
                   cfg.layer_period, tuple(sorted(dict(
                       deterministic=deterministic, decode=False, cfg=cfg,
                       **layer_kwargs).items())), parent=None)

    def stage_fn(params, x_mb, args_mb, key):
        tree = {"layers": params}
        if not cfg.scan_layers:
            tree = layouts.unscan_layers({"decoder": tree}, cfg.layer_period)["decoder"]
        y, state = chunk.apply({"params": tree}, x_mb, *args_mb,
                               rngs={} if key is None else {"dropout": key},
                               mutable=[moe.STATS_COLLECTION])
        return y, moe.layer_stats(state.get(moe.STATS_COLLECTION, {}))

    key = None if deterministic else parent.make_rng("dropout")
    y, stats = pipeline.run(stage_fn, chunks, x, args, stages=stages,
                            microbatches=cfg.pipeline_microbatches, repeats=runs,
                            stage_axes=stage_axes, x_axis=x_axis, x_names=x_names,
                            args_axes=args_axes, key=key,
                            remat_policy=remat_policy(cfg.remat_policy))
    for name, value in stats.items():  # [chunks, the chunk's MoE layers (x experts)]
        parent.sow(moe.STATS_COLLECTION, f"moe_{name}",
                   jnp.reshape(value, (-1,)) / cfg.pipeline_microbatches)
    return y
