"""A model's footprint without allocating it: the exact parameter count (from
`jax.eval_shape` of the model's init), training model FLOPs under the MFU convention of
`t5lite.models.flops` (the model reports them: `model.flops_report`), and the bytes of
float32 parameters plus optimizer state. The library behind `python -m t5lite.info`.
"""
from __future__ import annotations

import math
from typing import Any, Dict

import jax

from t5lite.errors import ConfigError
from t5lite.models.model import BaseModel

FLOAT32_BYTES = 4
OPTIMIZERS = ("adafactor", "adamw")


def abstract_params(model):
    """The `params` collection as a tree of jax.ShapeDtypeStruct (nothing is allocated).
    Parameter shapes do not depend on the lengths: the model's short dummy batch traces."""
    return model.abstract_variables(batch_size=1)["params"]


def _shapes(tree):
    return [tuple(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)]


def param_count(params) -> int:
    return sum(math.prod(s) for s in _shapes(params))


def optimizer_state_count(params, optimizer: str) -> int:
    """Float32 values of optimizer state.

    adamw: two moments per parameter. adafactor: no first moment; a >=2-D parameter keeps
    a row and a column second-moment vector over its last two dims (leading dims, e.g. a
    scanned `layers` axis, kept); a 1-D parameter keeps a full vector.
    """
    if optimizer == "adamw":
        return 2 * param_count(params)
    if optimizer != "adafactor":
        raise ConfigError(f"--optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    total = 0
    for shape in _shapes(params):
        if len(shape) >= 2:
            lead = math.prod(shape[:-2])
            total += lead * shape[-2] + lead * shape[-1]
        else:
            total += math.prod(shape)
    return total


def model_report(model, *, inputs_length: int = 512, targets_length: int = 128,
                 seq_length: int = 2048, optimizer: str = "adafactor") -> Dict[str, Any]:
    """Everything `info` prints, as a dict."""
    if not isinstance(model, BaseModel):
        raise ConfigError(f"MODEL must be a t5lite model (EncoderDecoderModel, "
                          f"DecoderOnlyModel), got {type(model).__name__}")
    params = abstract_params(model)
    n = param_count(params)
    report: Dict[str, Any] = {"model": type(model).__name__,
                              "config": type(model.config).__name__, "params": n}
    report.update(model.flops_report(inputs_length=inputs_length,
                                     targets_length=targets_length, seq_length=seq_length))
    opt_bytes = FLOAT32_BYTES * optimizer_state_count(params, optimizer)
    report.update(param_bytes=FLOAT32_BYTES * n, optimizer=optimizer,
                  optimizer_state_bytes=opt_bytes, total_bytes=FLOAT32_BYTES * n + opt_bytes)
    return report


def _human_bytes(b: int) -> str:
    return f"{b:,} B ({b / 2**30:,.2f} GiB)"


def format_report(report: Dict[str, Any], source: str = "") -> str:
    rows = [("model", f"{report['model']}({report['config']})" + (f"  [{source}]" if source else "")),
            ("parameters", f"{report['params']:,}")]
    if "train_flops_per_token" in report:
        s = report["seq_length"]
        rows += [("train FLOPs / token", f"{report['train_flops_per_token'] / 1e9:,.3f} GFLOP"
                  f"  (seq {s}, fwd+bwd, matmuls only)"),
                 ("train FLOPs / sequence", f"{report['train_flops_per_example'] / 1e12:,.3f} TFLOP")]
    else:
        rows += [("train FLOPs / example", f"{report['train_flops_per_example'] / 1e9:,.1f} GFLOP"
                  f"  (inputs {report['inputs_length']}, targets {report['targets_length']},"
                  " fwd+bwd, matmuls only)")]
    rows += [("params (float32)", _human_bytes(report["param_bytes"])),
             (f"{report['optimizer']} state", _human_bytes(report["optimizer_state_bytes"])),
             ("total", _human_bytes(report["total_bytes"]))]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
