"""A model's footprint without allocating it: the exact parameter count (from
`jax.eval_shape` of the model's init), training model FLOPs under the MFU convention of
`t5lite.models.flops` (the model reports them: `model.flops_report`), the bytes of
float32 parameters plus the state of the optimizer the run uses (from `jax.eval_shape`
of its own `init`, so any optax chain counts exactly), and optionally the per-device
memory of the compiled train step (`tools.step_memory`). The library behind
`python -m t5lite.info`.
"""
from __future__ import annotations

import math
from typing import Any, Dict

import jax

from t5lite.errors import ConfigError
from t5lite.models.model import BaseModel
from t5lite.tools import step_memory

FLOAT32_BYTES = 4


def abstract_params(model):
    """The `params` collection as a tree of jax.ShapeDtypeStruct (nothing is allocated).
    Parameter shapes do not depend on the lengths: the model's short dummy batch traces."""
    return model.abstract_variables(batch_size=1)["params"]


def _shapes(tree):
    return [tuple(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)]


def param_count(params) -> int:
    return sum(math.prod(s) for s in _shapes(params))


def optimizer_state_bytes(params, optimizer, param_axes=None) -> int:
    """Bytes of the state `optimizer` (a t5lite Optimizer) keeps for `params` (with
    logical axis names `param_axes`: Adafactor factors by them)."""
    state = jax.eval_shape(optimizer.transformation(param_axes).init, params)
    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize
               for leaf in jax.tree_util.tree_leaves(state))


def model_report(model, optimizer, *, inputs_length: int = 512, targets_length: int = 128,
                 seq_length: int = 2048, optimizer_source: str = "") -> Dict[str, Any]:
    """Everything `info` prints, as a dict (`optimizer`: a t5lite Optimizer)."""
    if not isinstance(model, BaseModel):
        raise ConfigError(f"MODEL must be a t5lite model (EncoderDecoderModel, "
                          f"DecoderOnlyModel), got {type(model).__name__}")
    params = abstract_params(model)
    n = param_count(params)
    report: Dict[str, Any] = {"model": type(model).__name__,
                              "config": type(model.config).__name__, "params": n}
    report.update(model.flops_report(inputs_length=inputs_length,
                                     targets_length=targets_length, seq_length=seq_length))
    trainable = model.split_trainable(params)[0]  # with LoRA: the adapters only
    opt_bytes = optimizer_state_bytes(trainable, optimizer,
                                      model.split_trainable(model.logical_axes()["params"])[0])
    report.update(param_bytes=FLOAT32_BYTES * n, optimizer=optimizer.name,
                  optimizer_source=optimizer_source, optimizer_state_bytes=opt_bytes,
                  total_bytes=FLOAT32_BYTES * n + opt_bytes)
    return report


def step_memory_report(the_run, task_feature_lengths, pack: bool,
                       device_bytes: int) -> Dict[str, Any]:
    """Per-device memory of `the_run`'s compiled train step (nothing is allocated) and
    the plain answer for a device of `device_bytes`."""
    compiled = step_memory.compile_train_step(
        the_run, step_memory.abstract_batch(the_run, task_feature_lengths, pack))
    memory = step_memory.compiled_memory(compiled)
    if memory is None:
        raise ConfigError("this backend reports no memory analysis for compiled programs")
    mesh = the_run.partitioner.mesh
    return {"devices": mesh.size, "mesh": dict(mesh.shape), "batch_size": the_run.batch_size,
            "per_device_batch": the_run.batch_size // mesh.size,
            "platform": mesh.devices.flat[0].platform, "device_bytes": device_bytes,
            **memory.as_dict(), "verdict": step_memory.verdict(memory.peak_bytes, device_bytes)}


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
    source = f"  ({report['optimizer_source']})" if report.get("optimizer_source") else ""
    rows += [("params (float32)", _human_bytes(report["param_bytes"])),
             (f"{report['optimizer']} state", _human_bytes(report["optimizer_state_bytes"])
              + source),
             ("total", _human_bytes(report["total_bytes"]))]
    mem = report.get("step_memory")
    if mem:
        mesh = " x ".join(f"{k} {v}" for k, v in mem["mesh"].items())
        rows += [("train step memory", f"per device, compiled for {mem['devices']} simulated "
                  f"{mem['platform'].upper()} devices (mesh {mesh}), {mem['per_device_batch']} "
                  f"examples per device"),
                 ("  arguments", _human_bytes(mem["argument_bytes"])),
                 ("  temporaries", _human_bytes(mem["temp_bytes"])),
                 ("  outputs not aliased", _human_bytes(mem["output_bytes"] - mem["alias_bytes"])),
                 ("  peak", _human_bytes(mem["peak_bytes"])),
                 ("verdict", mem["verdict"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
