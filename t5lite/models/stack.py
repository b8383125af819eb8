"""Running a stack of identical layers: a Python loop (`layers_0..layers_{n-1}`) or
`nn.scan` over one `layers` subtree whose parameters gain a leading `layers` axis, each
optionally rematerialized with a policy chosen by `checkpoint_name` tags.

Tags set by the layers: query_proj, key_proj, value_proj, qkv_proj, kv_proj, out_proj,
mlpwi, mlpwo.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax

from t5lite.models.layers import gemm_input_views
from t5lite.models.precision import FP8_COLLECTION

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
               **layer_kwargs) -> jax.Array:
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
        return _scan(cls, num_layers // period, args)(name="layers")(x, *args)[0]
    cls = layer_cls
    if policy is not None:
        cls = nn.remat(layer_cls, policy=policy, prevent_cse=not scan)
    if scan:
        x, _ = _scan(cls, num_layers, args)(scanned=True, name="layers", **per_layer(0),
                                             **layer_kwargs)(x, *args)
        return x
    views = {k: gemm_input_views(args[k], m * num_layers) for k, m in gemm_reads.items()}
    for i in range(num_layers):
        layer_args = [views[k][i * gemm_reads[k]:(i + 1) * gemm_reads[k]] if k in views else a
                      for k, a in enumerate(args)]
        x = cls(name=f"layers_{i}", **per_layer(i), **layer_kwargs)(x, *layer_args)
    return x


def _scan(cls, length: int, args: Sequence[Any]):
    return nn.scan(
        cls,
        variable_axes={"params": 0, FP8_COLLECTION: 0, "cache": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * len(args),
        length=length,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
