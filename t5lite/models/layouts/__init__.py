"""Parameter layouts: how the layout switches (FUSE_QKV, SCAN_LAYERS, the pipeline's
PIPELINE_MICROBATCHES and PIPELINE_REPEATS) lay out one set of weights, and the
conversions between them, so that one set of weights runs under every switch setting.
Pure functions on trees (needs nothing of t5lite): read by the models, the restore
(`formats/`) and the converters alike.

Layouts (see `t5lite.models.configs` for the full tree):

- unfused self-attention: query [embed, heads, kv], key / value [embed, kv_heads, kv];
  fused: qkv [embed, group + 2, kv_heads, kv] with group = heads // kv_heads (query head
  h = kv_head * group + g at stack index g, then key, then value). Biases follow the same
  scheme without the embed axis.
- unfused cross-attention: key / value [embed, heads, kv]; fused: kv [embed, 2, heads, kv].
- unscanned: `layers_0 .. layers_{n-1}` under each stack; scanned: one `layers` subtree,
  every leaf with a leading `layers` axis; scanned in blocks of p layers (dense and
  mixture-of-experts layers in turn, `layer_period`): `layers/block_{j}` for j < p, its
  leaves' leading axis the blocks (layer b * p + j at index b). A pipelined config
  (PIPELINE_MICROBATCHES set) stores its layers stacked too, whatever SCAN_LAYERS says
  (`stacked`): its stages each hold a slice of the stacked axis.
- repeated (PIPELINE_REPEATS r > 1, stacked): one `repeats` subtree instead of `layers`,
  every leaf [r, n / r, ...]: the stacked axis cut into r runs of consecutive layers (a
  circular pipeline's stage s holds run i's s-th slice, for every i).
- LoRA adapters (`t5lite.models.lora`) follow: a fused kernel's `lora_a` [embed, 3 (or
  2), r] holds one adapter per projection, its `lora_b` fuses like the kernel.

Conversions are pure functions on the variables dict `{"params": ..., [FP8 collection]}`.
They move data and never change a value. Arrays in host memory (numpy's, and
`convert_params`' jax arrays on CPU devices that this process holds whole) are converted
with numpy and come back as numpy arrays: jax.numpy would compile a program for each
operation and leaf shape (a tiny T5's conversion took about 100 of them, 25 ms each on
the CPU). Other arrays (on accelerators, sharded across processes, traced) stay in
jax.numpy.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Mapping

import jax
import jax.numpy as jnp
import numpy as np

Tree = Dict[str, Any]
_LAYER = re.compile(r"^layers_(\d+)$")
_STACKS = ("encoder", "decoder")


def _xp(*arrays):
    """numpy when every array is numpy's, else jax.numpy."""
    return np if all(isinstance(a, (np.ndarray, np.generic)) for a in arrays) else jnp


def in_host_memory(x) -> bool:
    """Whether `x` lives in this process's host memory: a numpy array or scalar, or a jax
    array (not traced) on CPU devices that this process holds whole. numpy reads such an
    array without a copy when it lives on one device."""
    if isinstance(x, (np.ndarray, np.generic)) or np.isscalar(x):
        return True
    return (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
            and x.is_fully_addressable
            and all(d.platform == "cpu" for d in x.sharding.device_set))


# ----------------------------------------------------------------------------- qkv fusion


def fuse_qkv_arrays(q, k, v):
    """q [..., heads, kv], k / v [..., kv_heads, kv] -> [..., group + 2, kv_heads, kv]."""
    xp = _xp(q, k, v)
    hkv, d = k.shape[-2:]
    group = q.shape[-2] // hkv
    lead = q.shape[:-2]
    qg = xp.moveaxis(xp.reshape(q, lead + (hkv, group, d)), -2, -3)  # [..., group, hkv, d]
    return xp.concatenate([qg, k[..., None, :, :], v[..., None, :, :]], axis=-3)


def unfuse_qkv_arrays(qkv):
    """Inverse of `fuse_qkv_arrays`."""
    xp = _xp(qkv)
    group = qkv.shape[-3] - 2
    hkv, d = qkv.shape[-2:]
    q = xp.moveaxis(qkv[..., :group, :, :], -3, -2)  # [..., hkv, group, d]
    q = xp.reshape(q, qkv.shape[:-3] + (hkv * group, d))
    return q, qkv[..., group, :, :], qkv[..., group + 1, :, :]


def _leaf_names(*subtrees: Mapping[str, Any]):
    return sorted(set().union(*(t.keys() for t in subtrees)))


def _check_adapters(parts, what: str) -> None:
    """Adapters (LoRA's `lora_a` / `lora_b`) fuse only when every projection has them."""
    has = [any(n.startswith("lora_") for n in p) for p in parts]
    if any(has) and not all(has):
        raise ValueError(f"the {what} projections do not all have LoRA adapters, so they "
                         f"cannot be fused: merge them first (`lora.merge_lora`) or adapt "
                         f"all of them")


def _fuse_attention(att: Tree, is_cross: bool) -> Tree:
    """A LoRA `lora_a` [..., embed, r] stacks on a new -2 axis (one adapter per
    projection); `lora_b` [..., r, heads, kv] fuses like the kernel's output axes."""
    out = {k: v for k, v in att.items() if k not in ("query", "key", "value")}
    if is_cross:
        _check_adapters((att["key"], att["value"]), "key and value")
        out["query"] = att["query"]
        out["kv"] = {n: _stack([att["key"][n], att["value"][n]],
                               axis=-2 if n == "lora_a" else -3)
                     for n in _leaf_names(att["key"], att["value"])}
    else:
        parts = (att["query"], att["key"], att["value"])
        _check_adapters(parts, "query, key and value")
        out["qkv"] = {n: (_stack([p[n] for p in parts], axis=-2) if n == "lora_a"
                          else fuse_qkv_arrays(*(p[n] for p in parts)))
                      for n in _leaf_names(*parts)}
    return out


def _unfuse_attention(att: Tree, is_cross: bool) -> Tree:
    out = {k: v for k, v in att.items() if k not in ("qkv", "kv")}
    if is_cross:
        for i, name in enumerate(("key", "value")):
            out[name] = {n: a[..., i, :] if n == "lora_a" else a[..., i, :, :]
                         for n, a in att["kv"].items()}
    else:
        parts = {n: ([a[..., i, :] for i in range(3)] if n == "lora_a"
                     else unfuse_qkv_arrays(a)) for n, a in att["qkv"].items()}
        for i, name in enumerate(("query", "key", "value")):
            out[name] = {n: p[i] for n, p in parts.items()}
    return out


def _map_attention(tree: Tree, fn) -> Tree:
    """Apply fn(subtree, is_cross) to every attention subtree of an unscanned tree."""
    out = {}
    for key, sub in tree.items():
        if not isinstance(sub, Mapping):
            out[key] = sub
        elif key.endswith("attention"):
            out[key] = fn(dict(sub), key == "encoder_decoder_attention")
        else:
            out[key] = _map_attention(sub, fn)
    return out


def fuse_qkv(params: Tree) -> Tree:
    """Unfused -> fused attention kernels (unscanned `params` tree)."""
    return _map_attention(params, _fuse_attention)


def unfuse_qkv(params: Tree) -> Tree:
    """Fused -> unfused attention kernels (unscanned `params` tree)."""
    return _map_attention(params, _unfuse_attention)


# ----------------------------------------------------------------------------- scanning


def _stack(arrays, axis):
    return _xp(*arrays).stack(arrays, axis=axis)


def _stack_trees(trees):
    first = trees[0]
    if isinstance(first, Mapping):
        return {k: _stack_trees([t[k] for t in trees]) for k in first}
    return _stack(trees, axis=0)


def _index_tree(tree, i):
    if isinstance(tree, Mapping):
        return {k: _index_tree(v, i) for k, v in tree.items()}
    return tree[i]


def _num_layers(tree) -> int:
    while isinstance(tree, Mapping):
        tree = next(iter(tree.values()))
    return tree.shape[0]


def scan_layers(tree: Tree, period: int = 1) -> Tree:
    """`layers_{i}` subtrees -> one `layers` subtree with a leading layers axis (with
    `period` p > 1: `layers/block_{j}`, layers j, j + p, ... stacked)."""
    out = {}
    for name, sub in tree.items():
        if not isinstance(sub, Mapping):
            out[name] = sub
            continue
        layer_keys = sorted((k for k in sub if _LAYER.match(k)), key=lambda k: int(k[7:]))
        if name in _STACKS and layer_keys:
            rest = {k: v for k, v in sub.items() if k not in layer_keys}
            layers = ({f"block_{j}": _stack_trees([sub[k] for k in layer_keys[j::period]])
                       for j in range(period)} if period > 1
                      else _stack_trees([sub[k] for k in layer_keys]))
            out[name] = {**rest, "layers": layers}
        else:
            out[name] = sub
    return out


def unscan_layers(tree: Tree, period: int = 1) -> Tree:
    """Inverse of `scan_layers`."""
    out = {}
    for name, sub in tree.items():
        if isinstance(sub, Mapping) and name in _STACKS and "layers" in sub:
            rest = {k: v for k, v in sub.items() if k != "layers"}
            if period > 1:
                blocks = [sub["layers"][f"block_{j}"] for j in range(period)]
                n = _num_layers(blocks[0])
                layers = {f"layers_{b * period + j}": _index_tree(blocks[j], b)
                          for b in range(n) for j in range(period)}
            else:
                n = _num_layers(sub["layers"])
                layers = {f"layers_{i}": _index_tree(sub["layers"], i) for i in range(n)}
            out[name] = {**rest, **layers}
        else:
            out[name] = sub
    return out


def _period(cfg) -> int:
    return getattr(cfg, "layer_period", 1)


def stacked(cfg) -> bool:
    """Whether a config stores its stacks' layers stacked (SCAN_LAYERS, or a pipeline)."""
    return bool(cfg.scan_layers or getattr(cfg, "pipeline_microbatches", None))


def repeats(cfg) -> int:
    """The runs a config's stacked layers are cut into (1: a plain `layers` subtree)."""
    return int(getattr(cfg, "pipeline_repeats", 1) or 1) if stacked(cfg) else 1


def stack_depth(cfg) -> int:
    """The leading axes the stacking gives every per-layer variable (a KV cache too)."""
    return 0 if not stacked(cfg) else 1 if repeats(cfg) == 1 else 2


def canonical_config(cfg, **changes):
    """`cfg` in the layout T5X and Hugging Face store weights in: unfused, unstacked (no
    pipeline, whose layers are stacked); `changes` besides."""
    fields = {"fuse_qkv": False, "scan_layers": False}
    if hasattr(cfg, "pipeline_microbatches"):
        fields.update(pipeline_microbatches=None, pipeline_repeats=1)
    return dataclasses.replace(cfg, **fields, **changes)


def _map_stacks(tree: Tree, src: str, dst: str, fn) -> Tree:
    out = {}
    for name, sub in tree.items():
        if isinstance(sub, Mapping) and name in _STACKS and src in sub:
            rest = {k: v for k, v in sub.items() if k != src}
            sub = {**rest, dst: _map_leaves(sub[src], fn)}
        out[name] = sub
    return out


def _map_leaves(tree, fn):
    if isinstance(tree, Mapping):
        return {k: _map_leaves(v, fn) for k, v in tree.items()}
    return fn(tree)


def split_repeats(tree: Tree, runs: int) -> Tree:
    """A stack's `layers` [n, ...] -> `repeats` [runs, n / runs, ...]."""
    return _map_stacks(tree, "layers", "repeats", lambda a: _xp(a).reshape(
        a, (runs, a.shape[0] // runs) + tuple(a.shape[1:])))


def join_repeats(tree: Tree) -> Tree:
    """Inverse of `split_repeats` (a tree without `repeats` comes back as it is)."""
    return _map_stacks(tree, "repeats", "layers", lambda a: _xp(a).reshape(
        a, (a.shape[0] * a.shape[1],) + tuple(a.shape[2:])))


# ----------------------------------------------------------------------------- both


def convert_params(variables: Tree, src_cfg, dst_cfg) -> Tree:
    """Convert a variables dict from `src_cfg`'s layout to `dst_cfg`'s (fuse_qkv,
    stacked, repeats). Another collection (the FP8 state), if any, follows the stacking;
    it is dropped when the QKV fusion changes (its per-matmul statistics no longer apply;
    the model re-initializes it). Leaves in host memory come back as numpy arrays (module
    docstring)."""
    out = {}
    host = jax.tree.map(lambda x: np.asarray(x) if in_host_memory(x) else x, variables)
    for collection, tree in host.items():
        if stacked(src_cfg):
            tree = unscan_layers(join_repeats(tree), _period(src_cfg))
        if collection == "params" and src_cfg.fuse_qkv != dst_cfg.fuse_qkv:
            tree = fuse_qkv(tree) if dst_cfg.fuse_qkv else unfuse_qkv(tree)
        elif src_cfg.fuse_qkv != dst_cfg.fuse_qkv:
            continue
        if stacked(dst_cfg):
            tree = scan_layers(tree, _period(dst_cfg))
            if repeats(dst_cfg) > 1:
                tree = split_repeats(tree, repeats(dst_cfg))
        out[collection] = tree
    return out


# ----------------------------------------------------------------------------- detection


def detect_layout(params: Mapping[str, Any]) -> Dict[str, Any]:
    """The layout a parameter tree was built with, read from its structure:
    `{"fuse_qkv": ..., "scan_layers": ..., "pipeline_repeats": ...}` (scan_layers: the
    layers stacked, by SCAN_LAYERS or a pipeline; pipeline_repeats: the runs they are cut
    into).

    `params` is a variables dict `{"params": ...}` or the bare params tree; its leaves may
    be arrays, jax.ShapeDtypeStruct or checkpoint metadata (the keys are read, and a
    `repeats` leaf's leading size). fuse_qkv: an attention subtree holds `qkv` or `kv`;
    stacked: a stack (`encoder` / `decoder`) holds one `layers` or `repeats` subtree. A
    tree with neither (no attention or no stacks) reads as False for both."""
    tree = params.get("params", params) if isinstance(params, Mapping) else params
    fused = scanned = False
    runs = 1

    def visit(node: Mapping[str, Any], name: str) -> None:
        nonlocal fused, scanned, runs
        if name.endswith("attention") and ("qkv" in node or "kv" in node):
            fused = True
        if name in _STACKS and isinstance(node.get("layers"), Mapping):
            scanned = True
        if name in _STACKS and isinstance(node.get("repeats"), Mapping):
            scanned, runs = True, _num_layers(node["repeats"])
        for key, sub in node.items():
            if isinstance(sub, Mapping):
                visit(sub, str(key))

    if isinstance(tree, Mapping):
        visit(tree, "")
    return {"fuse_qkv": fused, "scan_layers": scanned, "pipeline_repeats": runs}


def config_layout(cfg) -> Dict[str, Any]:
    """The layout a config's parameters have, as `detect_layout` reads it."""
    return {"fuse_qkv": bool(cfg.fuse_qkv), "scan_layers": stacked(cfg),
            "pipeline_repeats": repeats(cfg)}
