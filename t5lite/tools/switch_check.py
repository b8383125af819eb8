"""One model, several switch settings, the same weights: how far each variant's logits
are from the model as configured. The CPU tests prove the layouts exact; this proves on
a new backend what only it can run (cuDNN attention, native FP8 on tensor cores) and
states the error next to the one bf16 itself makes (the `float32` variant).

    report = compare_variants(model, {"cudnn": {"attention_impl": "cudnn"},
                                      "fp8": {"fp8": True}}, lengths, batch_size=8)
    # {"reference": {...}, "variants": {"cudnn": {"rel_l2": 0.003, "max_abs": 0.06,
    #   "argmax_agreement": 0.998, "loss": 10.41, "tolerance": 0.0093, "ok": True}, ...}}

rel_l2 = ||logits_variant - logits_ref|| / ||logits_ref|| over the whole [batch, length,
vocab] logits (float32); argmax_agreement is the fraction of target positions whose
top token matches. A variant is `ok` when rel_l2 is within its tolerance: exact switches
(layouts, attention implementations) within TOLERANCE_FACTOR x the bf16-vs-float32 error
(they change the order of bf16 operations, never the precision); FP8 within FP8_TOLERANCE
(e4m3 keeps 3 mantissa bits; the CPU tests measure 0.04-0.12 on width-32 models, where
nothing averages the rounding out).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from t5lite.data import edge
from t5lite.models import layouts
from t5lite.models.model import model_for_config
from t5lite.models.common.precision import FP8_COLLECTION

VARIANTS: Dict[str, Dict[str, Any]] = {
    "float32": {"dtype": "float32"},
    "dot_product": {"attention_impl": "dot_product"},
    "cudnn": {"attention_impl": "cudnn"},
    "cudnn_lengths": {"attention_impl": "cudnn", "attention_mask": "lengths"},
    "bf16_logits": {"attention_logits_dtype": "bfloat16"},
    "fused_qkv": {"fuse_qkv": True},
    "transpose_bs": {"transpose_bs": True},
    "scan_layers": {"scan_layers": True},
    "fp8": {"fp8": True},
    "te_fp8": {"fp8": True, "fp8_backend": "te"},
    "te_fp8_current": {"fp8": True, "fp8_backend": "te", "fp8_recipe": "current"},
    "te_attention": {"attention_impl": "te"},
}
TOLERANCE_FACTOR = 3.0
FP8_TOLERANCE = 0.15
MIN_TOLERANCE = 1e-3


def _rel_l2(a: jax.Array, b: jax.Array) -> float:
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def _variables_for(model, params, variant_model) -> Dict[str, Any]:
    """The reference weights in the variant's layout, plus a fresh FP8 state if it has one."""
    converted = layouts.convert_params({"params": params["params"]}, model.config,
                                       variant_model.config)
    if variant_model.config.fp8:
        fresh = jax.jit(variant_model.init)(jax.random.PRNGKey(0))
        converted[FP8_COLLECTION] = fresh[FP8_COLLECTION]
    return converted


TOKENS = (("encoder", "encoder_input_tokens"), ("decoder", "decoder_target_tokens"))


def packed_in_two(batch: Mapping[str, Any]) -> Dict[str, Any]:
    """The batch with each row read as two packed sequences: the first half of its
    positions one segment, the rest another, padding none (segment 0), positions counted
    from each segment's start. The attention's masks of a PACK=True batch, on these
    tokens: [batch, length] int32 `{encoder,decoder}_segment_ids` and `_positions` added."""
    out = dict(batch)
    for prefix, name in TOKENS:
        if name not in batch:
            continue
        tokens = np.asarray(batch[name])
        index = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
        half = tokens.shape[1] // 2
        real = tokens > 0
        out[f"{prefix}_segment_ids"] = jnp.asarray(
            np.where(real, np.where(index < half, 1, 2), 0), jnp.int32)
        out[f"{prefix}_positions"] = jnp.asarray(
            np.where(real, np.where(index < half, index, index - half), 0), jnp.int32)
    return out


def compare_variants(model, variants: Mapping[str, Mapping[str, Any]],
                     task_feature_lengths: Mapping[str, int], batch_size: int = 4,
                     seed: int = 0, params: Optional[Dict[str, Any]] = None,
                     on_row: Optional[Callable[[str, Dict[str, Any]], None]] = None,
                     packed: bool = False) -> Dict[str, Any]:
    """Logits of `model` and of each variant (config fields replaced) on one synthetic
    batch with the same weights (`params`, or a fresh init from `seed`); `packed`, its
    rows as two sequences each (`packed_in_two`). `on_row(name,
    row)` is called as each variant is measured (its verdict comes at the end, when the
    float32 variant has set the tolerance), so a caller cut off halfway has what came.

    Returns {"reference": {"loss", "config"}, "bf16_error": rel_l2 of the float32 variant
    or None, "variants": {name: {"rel_l2", "max_abs", "argmax_agreement", "loss",
    "tolerance", "ok"} or {"error": one line}}}.
    """
    lengths = model.feature_lengths(task_feature_lengths)
    task = edge.SyntheticTask(lengths, model.config.vocab_size,
                                   model.FEATURE_CONVERTER_KIND, seed=seed)
    batch = {k: jnp.asarray(v) for k, v in task.global_batch(0, batch_size).items()}
    if packed:
        batch = packed_in_two(batch)
    if params is None:
        params = jax.jit(model.init)(jax.random.PRNGKey(seed))
        params = {"params": params["params"]}
    reference = jax.jit(model.logits)(params, batch)
    weights = batch["decoder_target_tokens"] > 0
    top = jnp.argmax(reference, -1)

    def loss_of(m, variables):
        """Cross entropy per target token (z-loss left out)."""
        loss_sum, sums = jax.jit(lambda v: m.loss_sums(v, batch))(variables)
        return float((loss_sum - sums["z_loss"]) / sums["weight_sum"])

    results: Dict[str, Dict[str, Any]] = {}
    for name, fields in variants.items():
        try:
            variant = model_for_config(dataclasses.replace(model.config, **fields))
            variables = _variables_for(model, params, variant)
            got = jax.jit(variant.logits)(variables, batch)
            agree = jnp.sum((jnp.argmax(got, -1) == top) & weights) / jnp.sum(weights)
            results[name] = {"rel_l2": _rel_l2(got, reference),
                             "max_abs": float(jnp.max(jnp.abs(got - reference))),
                             "argmax_agreement": float(agree),
                             "loss": loss_of(variant, variables)}
        except Exception as e:  # noqa: BLE001 (a variant the backend cannot run is a row)
            first = (str(e).strip().splitlines() or [""])[0]
            results[name] = {"error": f"{type(e).__name__}: {first}"[:300]}
        if on_row is not None:
            on_row(name, results[name])
    bf16_error = results.get("float32", {}).get("rel_l2")
    for name, row in results.items():
        if "rel_l2" not in row or name == "float32":
            continue
        if variants[name].get("fp8"):
            row["tolerance"] = FP8_TOLERANCE
        elif bf16_error is not None:
            row["tolerance"] = max(TOLERANCE_FACTOR * bf16_error, MIN_TOLERANCE)
        else:
            row["tolerance"] = MIN_TOLERANCE
        row["ok"] = row["rel_l2"] <= row["tolerance"]
    return {"reference": {"loss": loss_of(model, params),
                          "config": dataclasses.asdict(model.config)}, "packed": packed,
            "bf16_error": bf16_error, "variants": results}


def format_report(report: Dict[str, Any]) -> str:
    lines = [f"reference loss {report['reference']['loss']:.4f}"
             + (f"; bf16 vs float32 rel L2 {report['bf16_error']:.2e}"
                if report["bf16_error"] is not None else ""),
             f"{'variant':<14} {'rel L2':>9} {'tolerance':>9} {'max |d|':>9} "
             f"{'argmax':>7} {'loss':>9}  verdict"]
    for name, row in report["variants"].items():
        if "error" in row:
            lines.append(f"{name:<14} {row['error']}")
            continue
        tol = f"{row['tolerance']:.2e}" if "tolerance" in row else "-"
        verdict = "-" if "ok" not in row else ("ok" if row["ok"] else "TOO FAR")
        lines.append(f"{name:<14} {row['rel_l2']:9.2e} {tol:>9} {row['max_abs']:9.3f} "
                     f"{row['argmax_agreement']:7.3f} {row['loss']:9.4f}  {verdict}")
    return "\n".join(lines)
