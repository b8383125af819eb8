"""Low-rank adapters (LoRA, Hu et al. 2021) on chosen projections of either family.

A targeted projection computes W x + (alpha / r) B(A(dropout(x))): A [*in, r] drawn as
the kernels are (truncated normal, variance 1 / fan_in), B [r, *out] zeros, so a fresh
adapter leaves the network's function unchanged. Both live beside the kernel in the
projection's own scope, as `lora_a` / `lora_b` (`t5lite.models.common.layers.Dense`), with
the kernel's logical axis names for their outer axes and `lora_rank` (replicated) for r:

    .../attention/query/kernel  [embed, heads, kv]
    .../attention/query/lora_a  [embed, lora_rank]
    .../attention/query/lora_b  [lora_rank, heads, kv]

Targets are the projections' own module names (`LORA_TARGETS`): `query`, `key`,
`value`, `out` in every attention (a T5 decoder's cross-attention too), and the MLP's
`wi` (or `wi_0`, `wi_1` when gated) and `wo`. With FUSE_QKV the fused `qkv` kernel keeps
one adapter per projection (A [embed, stack, r] with q, k, v on `stack`; B [r, stack,
kv_heads, kv] like the kernel), so q, k and v are adapted together or not at all, and
`layouts` converts adapters between the fused and unfused layouts exactly.

With LoRA on only the adapters train: `split_trainable` / `join_trainable` cut a
parameter tree (or any tree of the same shape: axis names, shardings) by leaf name.
`merge_lora` folds trained adapters into the kernels for inference and export.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Dict, Mapping, Optional, Tuple

import jax.numpy as jnp

from t5lite.errors import ConfigError, check_number

RANK_AXIS = "lora_rank"
A, B = "lora_a", "lora_b"
ATTENTION_TARGETS = ("query", "key", "value", "out")
QKV = ("query", "key", "value")
FUSED = ("qkv", "kv")  # fused projections: one adapter per projection on the stack axis


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """The adapters' settings, as the layers see them (`spec(cfg)`)."""

    rank: int
    alpha: float
    dropout: float
    targets: Tuple[str, ...]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def for_target(self, name: str) -> Optional["LoraSpec"]:
        """This spec when projection `name` is adapted, else None."""
        return self if name in self.targets else None


def spec(cfg) -> Optional[LoraSpec]:
    """The config's LoRA settings, or None when LoRA is off."""
    if not cfg.lora_rank:
        return None
    return LoraSpec(int(cfg.lora_rank), float(cfg.lora_alpha), float(cfg.lora_dropout),
                    tuple(cfg.lora_targets))


def enabled(cfg) -> bool:
    return bool(cfg.lora_rank)


def mlp_targets(cfg) -> Tuple[str, ...]:
    """The MLP's projection names (`layers.MLP`): wi, or wi_0, wi_1, ... when gated; wo."""
    n = len(cfg.mlp_activations)
    return (("wi",) if n == 1 else tuple(f"wi_{i}" for i in range(n))) + ("wo",)


def valid_targets(cfg) -> Tuple[str, ...]:
    return ATTENTION_TARGETS + mlp_targets(cfg)


def projection_dims(cfg) -> Dict[str, Tuple[int, int]]:
    """{target: (input width, output width)} of each projection of the config."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    dims = {"query": (cfg.emb_dim, q), "key": (cfg.emb_dim, kv), "value": (cfg.emb_dim, kv),
            "out": (q, cfg.emb_dim), "wo": (cfg.mlp_dim, cfg.emb_dim)}
    dims.update({t: (cfg.emb_dim, cfg.mlp_dim) for t in mlp_targets(cfg)[:-1]})
    return dims


def slot_adapters(num_adapters: int, num_slots: int) -> Tuple[int, ...]:
    """Which adapter feeds each slot of a fused kernel's stack axis: the first adapter
    (the query's, or the key's in a fused k/v) the leading slots, one each the rest:
    3 adapters over group + 2 slots -> (0,) * group + (1, 2); 2 over 2 -> (0, 1)."""
    return (0,) * (num_slots - num_adapters + 1) + tuple(range(1, num_adapters))


# ----------------------------------------------------------------------------- checks


def check_config(cfg) -> None:
    """ConfigError (one line, naming the macro) for LoRA settings that cannot work."""
    rank = cfg.lora_rank
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, numbers.Integral)
                             or rank < 0):
        raise ConfigError(f"LORA_RANK must be 0 or None (LoRA off) or a positive integer "
                          f"(the adapters' rank), got {rank!r}")
    check_number("LORA_ALPHA", cfg.lora_alpha, low=0)
    check_number("LORA_DROPOUT", cfg.lora_dropout, low=0, below=1)
    targets = cfg.lora_targets
    if not isinstance(targets, tuple) or any(not isinstance(t, str) for t in targets):
        raise ConfigError(f"LORA_TARGETS must be a list of projection names, e.g. "
                          f"['query', 'value'], got {targets!r}")
    if not hasattr(cfg, "emb_dim"):  # the bare switches: no projections to check against
        return
    valid = valid_targets(cfg)
    for target in targets:
        if target not in valid:
            raise ConfigError(f"LORA_TARGETS names {target!r}, which is no projection of "
                              f"this model; its projections are {', '.join(valid)}")
    if not rank and targets:
        raise ConfigError(f"LORA_TARGETS={list(targets)} but LORA_RANK={rank!r} (LoRA off): "
                          f"set LORA_RANK to the adapters' rank (e.g. 8), or LORA_TARGETS=[]")
    if rank and not targets:
        raise ConfigError(f"LORA_RANK={rank} adapts nothing: set LORA_TARGETS to some of "
                          f"{', '.join(valid)}")
    if not rank:
        return
    dims = projection_dims(cfg)
    for target in targets:
        n_in, n_out = dims[target]
        if rank > min(n_in, n_out):
            raise ConfigError(f"LORA_RANK={rank} exceeds the rank of the {target} projection "
                              f"({n_in} -> {n_out}): use at most {min(n_in, n_out)}")
    _check_switches(cfg, targets)


def _check_switches(cfg, targets) -> None:
    chosen = [t for t in QKV if t in targets]
    if cfg.fuse_qkv and 0 < len(chosen) < len(QKV):
        raise ConfigError(f"FUSE_QKV=True computes query, key and value in one projection: "
                          f"LORA_TARGETS must name all three or none of them (got "
                          f"{', '.join(chosen)}), or set FUSE_QKV=False")
    if cfg.fp8 and cfg.fp8_backend == "te":
        raise ConfigError("LoRA (LORA_RANK > 0) is not run with FP8_BACKEND='te' "
                          "(untested): use FP8_BACKEND='native', or FP8=False")


# ----------------------------------------------------------------------------- trainable


def is_adapter(name) -> bool:
    return name in (A, B)


def _select(tree: Mapping[str, Any], adapters: bool) -> Dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            sub = _select(value, adapters)
            if sub:
                out[key] = sub
        elif is_adapter(key) == adapters:
            out[key] = value
    return out


def split_trainable(tree: Mapping[str, Any], cfg) -> Tuple[Any, Dict[str, Any]]:
    """(trainable, frozen) parts of a `params` tree (or a tree shaped like it): with
    LoRA on, the adapters and the rest; off, the tree itself and {}."""
    if not enabled(cfg):
        return tree, {}
    return _select(tree, True), _select(tree, False)


def join_trainable(trainable: Any, frozen: Mapping[str, Any]) -> Any:
    """The tree `split_trainable` cut: the two parts' leaves together again."""
    if not frozen:
        return trainable
    out = dict(frozen)
    for key, value in trainable.items():
        out[key] = join_trainable(value, frozen[key]) if key in frozen else value
    return out


# ----------------------------------------------------------------------------- merge


def _delta(node: Mapping[str, Any], fused: bool, scale: float):
    """(alpha / r) B A of one projection, shaped like its kernel [*lead, *in, *out]."""
    kernel, a, b = node["kernel"], node[A], node[B]
    n_in = kernel.ndim - b.ndim + 1
    lead = a.shape[:a.ndim - n_in - 1 - int(fused)]
    n_lead = math.prod(lead)
    n = len(lead)
    a2 = jnp.reshape(a, (n_lead, -1) + a.shape[n + n_in:])  # [L, I, (T,) r]
    if fused:
        b2 = jnp.reshape(b, (n_lead,) + b.shape[n:n + 2] + (-1,))  # [L, r, S, O]
        slots = slot_adapters(a.shape[-2], b.shape[n + 1])
        delta = jnp.einsum("lisr,lrso->liso", a2[:, :, jnp.asarray(slots), :], b2,
                           precision="highest")
    else:
        b2 = jnp.reshape(b, (n_lead, b.shape[n], -1))  # [L, r, O]
        delta = jnp.einsum("lir,lro->lio", a2, b2, precision="highest")
    return jnp.reshape(delta * scale, kernel.shape)


def _merge_tree(tree: Mapping[str, Any], scale: float, name: str = "") -> Dict[str, Any]:
    if A in tree and B in tree and "kernel" in tree:
        out = {k: v for k, v in tree.items() if not is_adapter(k)}
        kernel = tree["kernel"]
        out["kernel"] = (kernel + _delta(tree, name in FUSED, scale)).astype(kernel.dtype)
        return out
    return {k: _merge_tree(v, scale, str(k)) if isinstance(v, Mapping) else v
            for k, v in tree.items()}


def base_config(cfg):
    """The config with LoRA off: the base network under the adapters."""
    return dataclasses.replace(cfg, lora_rank=0, lora_targets=())


def merge_lora(params: Mapping[str, Any], cfg) -> Tuple[Dict[str, Any], Any]:
    """(params with W + (alpha / r) B A folded into every adapted kernel and the adapters
    removed, the config with LoRA off). `params`: a variables dict {"params": ..., ...}
    (other collections pass through) or a bare params tree, in any layout; pure (jnp)."""
    if not enabled(cfg):
        return dict(params), cfg
    scale = float(cfg.lora_alpha) / int(cfg.lora_rank)
    off = base_config(cfg)
    if "params" in params:
        return {**params, "params": _merge_tree(params["params"], scale)}, off
    return _merge_tree(params, scale), off
