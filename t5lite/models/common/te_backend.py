"""NVIDIA Transformer Engine inside t5lite's own layers: FP8 GEMMs for `Dense`
(`FP8_BACKEND = 'te'`) and TE's fused attention (`ATTENTION_IMPL = 'te'`).

Parameters stay t5lite's (names, shapes, logical axes): TE only replaces the matmul
(`make_dot_general_cls(recipe)`, TE >= 2.12) and the attention kernel, so a checkpoint
trained with TE restores without it and the other way round. TE's FP8 metadata lives
where native FP8's does, in `precision.FP8_COLLECTION` ("_overwrite_with_gradient"),
under each Dense's `te_fp8` scope: per GEMM operand a scale [1] and an amax history
[AMAX_HISTORY_LENGTH] (delayed scaling; current scaling keeps none). TE's scale multiplies
before the cast (fp8_max / amax), the inverse of flax's, so microbatches combine TE scales
with min and histories with max (`precision.combine_fp8`).

TE reads its mesh from a global set while tracing: `tracing_context(axes)` sets it (the
partitioner enters it beside the mesh and the logical-axis rules).

Transformer Engine needs an NVIDIA GPU and CUDA; everywhere else, asking for it ends in
one ConfigError line naming the package and the alternative (`require`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Optional

from t5lite.errors import ConfigError

TE_SCOPE = "te_fp8"
RECIPES = ("delayed", "current")
AMAX_HISTORY_LENGTH = 1024
INSTALL = "pip install 'transformer_engine[jax]>=2.12' on a machine with an NVIDIA GPU and CUDA"
_IMPORT_ERRORS = (ImportError, OSError, RuntimeError, AssertionError)


def _import():
    """(transformer_engine.jax, transformer_engine.jax.flax, the recipe module) or the
    exception that stopped the import."""
    import transformer_engine.jax as te
    import transformer_engine.jax.flax as te_flax
    from transformer_engine.common import recipe
    return te, te_flax, recipe


def unavailable_reason() -> Optional[str]:
    """None when Transformer Engine for JAX imports, else why not (one line)."""
    try:
        _, te_flax, _ = _import()
    except _IMPORT_ERRORS as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"{type(e).__name__}: {first}"
    if not hasattr(te_flax, "make_dot_general_cls"):
        return "this Transformer Engine has no make_dot_general_cls (it needs >= 2.12)"
    return None


def require(what: str, alternative: str) -> None:
    """ConfigError (one line) unless Transformer Engine for JAX is usable here."""
    reason = unavailable_reason()
    if reason:
        raise ConfigError(f"{what} needs NVIDIA Transformer Engine for JAX, which needs an "
                          f"NVIDIA GPU and does not import here ({reason}): {INSTALL}, or "
                          f"use {alternative}")


def fp8_recipe(name: str):
    """T5X's delayed scaling (HYBRID: e4m3 forward, e5m2 gradients; margin 0; amax
    history 1024 reduced with max), or per-tensor current scaling."""
    _, _, recipe = _import()
    if name == "delayed":
        return recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID,
                                     amax_history_len=AMAX_HISTORY_LENGTH,
                                     amax_compute_algo="max")
    if name == "current":
        return recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID)
    raise ValueError(f"fp8 recipe must be one of {RECIPES}, got {name!r}")


def dot_general(recipe_name: str):
    """A flax module instance usable as `dot_general(x, kernel, dimension_numbers)` that
    runs TE's FP8 GEMM (x's trailing axes contracted with the kernel's leading ones)."""
    _, te_flax, _ = _import()
    return te_flax.make_dot_general_cls(fp8_recipe(recipe_name))(name=TE_SCOPE)


@contextlib.contextmanager
def tracing_context(axes: Mapping[str, str]) -> Iterator[None]:
    """TE's global mesh resource for the mesh axes {"data", "fsdp", "tensor"} -> name."""
    te, _, _ = _import()
    resource = te.sharding.MeshResource(dp_resource=axes["data"], fsdp_resource=axes["fsdp"],
                                        tp_resource=axes["tensor"])
    with te.sharding.global_shard_guard(resource):
        yield


def attention(q, k, v, bias, mask, *, num_heads: int, num_kv_heads: int, head_dim: int,
              scale: float, causal: bool, dropout_rate: float, deterministic: bool) -> Any:
    """TE's fused DotProductAttention on q [batch, q, heads, kv], k / v [batch, k,
    kv_heads, kv]; bias [1, heads, q, k] (T5's relative positions, added after scaling);
    mask [batch, 1, q, k], True where a key may be attended (TE's is the inverse). Padding
    must sit at the end of each row (TE turns the mask into sequence lengths)."""
    _, te_flax, _ = _import()
    if causal:
        mask_type = "causal" if mask is None else "padding_causal"
    else:
        mask_type = "no_mask" if mask is None else "padding"
    module = te_flax.DotProductAttention(
        head_dim=head_dim, num_attention_heads=num_heads, num_gqa_groups=num_kv_heads,
        attn_mask_type=mask_type, attn_bias_type="no_bias" if bias is None else "post_scale_bias",
        attention_dropout=dropout_rate, dtype=q.dtype, qkv_layout="bshd_bshd_bshd",
        scale_factor=scale, transpose_batch_sequence=False, name="te_attention")
    te_mask = None if mask is None else ~mask.astype(bool)
    return module(q, k, v, te_mask, None if bias is None else bias.astype(q.dtype),
                  deterministic=deterministic)
