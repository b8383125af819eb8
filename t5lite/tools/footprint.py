"""A model's footprint without allocating it: the exact parameter count (from
`jax.eval_shape` of the model's init), training model FLOPs under the MFU convention of
`t5lite.models.flops` (the model reports them: `model.flops_report`), the bytes of
float32 parameters plus the state of the optimizer the run uses (from `jax.eval_shape`
of its own `init`, so any optax chain counts exactly), and optionally the per-device
memory of the compiled train step (`tools.step_memory`) and the account of its program
lowered for CUDA (`tools.program_account`). The library behind `python -m t5lite.info`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import gin
import jax

from t5lite.errors import ConfigError
from t5lite.models.model import BaseModel
from t5lite.tools import benchmarking, program_account, step_memory

FLOAT32_BYTES = 4


def abstract_params(model):
    """The `params` collection as a tree of jax.ShapeDtypeStruct (nothing is allocated).
    Parameter shapes do not depend on the lengths: the model's short dummy batch traces."""
    return model.abstract_variables(batch_size=1)["params"]


def _shapes(tree):
    return [tuple(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)]


def param_count(params) -> int:
    return sum(math.prod(s) for s in _shapes(params))


def active_param_count(model, params) -> int:
    """Parameters a token uses: all of them, less the experts it is not routed to (a
    kernel with an `expert` axis counts top_k / num_experts of its size)."""
    cfg = model.config
    experts = getattr(cfg, "num_experts", 0)
    if not experts:
        return param_count(params)
    names = jax.tree_util.tree_leaves(model.logical_axes()["params"],
                                      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return sum(math.prod(shape) * cfg.moe_top_k // experts if "expert" in tuple(axes)
               else math.prod(shape) for shape, axes in zip(_shapes(params), names))


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
                              "config": type(model.config).__name__, "params": n,
                              "active_params": active_param_count(model, params),
                              "lora_rank": int(getattr(model.config, "lora_rank", 0) or 0)}
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
    return step_memory.memory_report(the_run.partitioner.mesh, the_run.batch_size,
                                     step_memory.compiled_memory(compiled), device_bytes,
                                     step_memory.state_bytes_per_device(the_run))


def step_reports(report: Dict[str, Any], model, optimizer, devices, per_device_batch,
                 memory_gib: Optional[float], account: bool) -> str:
    """`info --memory` (with `memory_gib`, a device's memory) and `--account`: the train
    step's compiled memory and its account (`program_account`) into `report`; the
    account's table ("" without it). ATTENTION_IMPL='cudnn' without cuDNN: one line."""
    batch = benchmarking.global_batch(per_device_batch, len(devices))
    lengths = report["task_feature_lengths"]
    pack = bool(gin.get_bindings("train").get("pack", False))
    try:
        # the account alone lowers for CUDA whatever the devices (never run here)
        platform = "cuda" if account and memory_gib is None else None
        the_run = benchmarking.step_run(model, batch_size=batch, devices=devices,
                                        task_feature_lengths=lengths, optimizer=optimizer,
                                        platform=platform)
        if memory_gib is not None:
            report["step_memory"] = step_memory_report(the_run, lengths, pack,
                                                       int(memory_gib * 2 ** 30))
        if account:
            report["program_account"] = program_account.step_account(the_run, lengths, pack)
    except RuntimeError as e:
        if "cuDNN" not in str(e):
            raise
        raise ConfigError("ATTENTION_IMPL='cudnn' cannot be traced on a machine without "
                          "cuDNN (jax looks for the library as it traces): use "
                          "ATTENTION_IMPL='dot_product' (the same jax.nn call) here, or "
                          "run this on the GPU") from None
    return "\n" + program_account.format_account(report["program_account"]) if account else ""


def _frozen(report: Dict[str, Any]) -> str:
    return "; LoRA: no gradient of a frozen weight" if report.get("lora_rank") else ""


def _optimizer_split(mem: Dict[str, Any]) -> str:
    """How the optimizer state is split beyond the parameters' shardings, if it is."""
    return ("  (SHARD_OPTIMIZER_OVER_DATA: split over data too)"
            if mem.get("shard_optimizer_over_data") else "")


def _human_bytes(b: int) -> str:
    return f"{b:,} B ({b / 2**30:,.2f} GiB)"


def format_report(report: Dict[str, Any], source: str = "") -> str:
    rows = [("model", f"{report['model']}({report['config']})" + (f"  [{source}]" if source else "")),
            ("parameters", f"{report['params']:,}" + (
                f"  ({report['active_params']:,} active a token: its top-k experts)"
                if report.get("active_params", report["params"]) != report["params"] else ""))]
    if "train_flops_per_token" in report:
        s = report["seq_length"]
        rows += [("train FLOPs / token", f"{report['train_flops_per_token'] / 1e9:,.3f} GFLOP"
                  f"  (seq {s}, fwd+bwd, matmuls only{_frozen(report)})"),
                 ("train FLOPs / sequence", f"{report['train_flops_per_example'] / 1e12:,.3f} TFLOP")]
    else:
        rows += [("train FLOPs / example", f"{report['train_flops_per_example'] / 1e9:,.1f} GFLOP"
                  f"  (inputs {report['inputs_length']}, targets {report['targets_length']},"
                  f" fwd+bwd, matmuls only{_frozen(report)})")]
    source = f"  ({report['optimizer_source']})" if report.get("optimizer_source") else ""
    rows += [("params (float32)", _human_bytes(report["param_bytes"])),
             (f"{report['optimizer']} state", _human_bytes(report["optimizer_state_bytes"])
              + source),
             ("total", _human_bytes(report["total_bytes"]))]
    mem = report.get("step_memory")
    if mem:
        mesh = " x ".join(f"{k} {v}" for k, v in mem["mesh"].items())
        where = (f"compile-only {mem['device_kind']}" if mem.get("device_kind")
                 else f"simulated {mem['platform'].upper()}")
        rows += [("train step memory", f"per device, compiled for {mem['devices']} {where} "
                  f"devices (mesh {mesh}), {mem['per_device_batch']:g} "
                  f"examples per device"),
                 ("  arguments", _human_bytes(mem["argument_bytes"])),
                 ("    parameters", _human_bytes(mem["params_bytes_per_device"])),
                 ("    optimizer state", _human_bytes(mem["optimizer_state_bytes_per_device"])
                  + _optimizer_split(mem)),
                 ("  temporaries", _human_bytes(mem["temp_bytes"])),
                 ("  outputs not aliased", _human_bytes(mem["output_bytes"] - mem["alias_bytes"])),
                 ("  peak", _human_bytes(mem["peak_bytes"])),
                 ("verdict", mem["verdict"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
