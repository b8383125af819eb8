"""`info --gpu`: a config's train step and initializer compiled for an H100 / H200 on
this machine (no GPU needed), with the compile times, the compiled memory per device,
its kernels grouped by model part and kind (FLOPs, bytes) and a predicted step time.

    report = gpu_step_report(model, optimizer, "h200", batch_size=32,
                             task_feature_lengths={"inputs": 512, "targets": 128})
    print(format_gpu_report(report))

The run is built over compile-only devices (`gpu_target.gpu_devices`), so nothing is
allocated; the step is compiled with the launchers' XLA flags (`gpu_target.
compiler_options`), which makes the program the GPU runs, less its autotuning (unless an
autotune file from a GPU session is given).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional

import gin
import jax

from t5lite.errors import ConfigError
from t5lite.runtime import train_step
from t5lite.models import pipeline
from t5lite.tools import benchmarking, comm_time, gpu_target, step_memory, step_time
from t5lite.tools.hlo import collectives, gpu_program

TOP_OPS = 12


def _cost_analysis(compiled) -> Dict[str, float]:
    """XLA's own HloCostAnalysis of the optimized module (custom calls count -1 there)."""
    try:
        from jax._src.lib import _jax
        module = compiled._executable.xla_extension_executable().hlo_modules()[0]
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
        return {"flops": float(cost.get("flops", 0)),
                "bytes": float(cost.get("bytes accessed", 0))}
    except Exception:  # noqa: BLE001 - a private API: the report goes on without it
        return {}


def gpu_facts(gpu: str) -> Dict[str, Any]:
    """The GPU's device kind, bandwidth, memory and peaks (`gpu_target.device_facts`)."""
    return gpu_target.device_facts(gpu_target.target_config(gpu))


def compile_init(the_run, autotune_file: Optional[str] = None) -> float:
    """Seconds to lower and compile the run's sharded initializer."""
    t0 = time.perf_counter()
    key = jax.ShapeDtypeStruct((2,), jax.numpy.uint32)
    the_run.step_fns.init.lower(key).compile({**gpu_target.compiler_options(autotune_file),
                                              **train_step.INIT_COMPILER_OPTIONS})
    return time.perf_counter() - t0


def gpu_step_report(model, optimizer, gpu: str, batch_size: int,
                    task_feature_lengths: Mapping[str, int], pack: bool = False,
                    autotune_file: Optional[str] = None, init: bool = True,
                    devices=None, device_bytes: Optional[int] = None) -> Dict[str, Any]:
    """The report (JSON-able but for `kernels`, the Kernel list; `kernels_by_part` and
    `top_ops` as rows), compiled for `devices` (default: one compile-only `gpu`). With
    `device_bytes`, also `step_memory`: `info --memory`'s entry for a device of that
    many bytes, from the same compiled step."""
    devices = devices or gpu_target.gpu_devices(gpu)
    the_run = benchmarking.step_run(model, batch_size=batch_size, devices=devices,
                                    task_feature_lengths=task_feature_lengths,
                                    optimizer=optimizer)
    times: Dict[str, float] = {}
    compiled = step_memory.compile_train_step(
        the_run, step_memory.abstract_batch(the_run, task_feature_lengths, pack),
        options=gpu_target.compiler_options(autotune_file), timings=times)
    text = compiled.as_text()
    kernels = gpu_program.program_kernels(text)
    facts = gpu_facts(gpu)
    memory = step_memory.compiled_memory(compiled)
    mesh = the_run.partitioner.mesh
    hosts_of = [d.process_index for d in mesh.devices.flat]
    rows = comm_time.collective_rows(collectives.program_collectives(text), dict(mesh.shape),
                                     hosts_of, facts["device_kind"])
    cfg = model.config
    report = {
        "gpu": gpu, **facts, "devices": len(devices), "hosts": len(set(hosts_of)),
        "mesh": dict(mesh.shape), "batch_size": batch_size,
        "num_microbatches": _microbatches(),
        "pipeline": {"stages": mesh.shape["stage"],
                     "microbatches": getattr(cfg, "pipeline_microbatches", None),
                     "repeats": getattr(cfg, "pipeline_repeats", 1),
                     "bubble": pipeline.bubble_fraction(
                         mesh.shape["stage"], getattr(cfg, "pipeline_microbatches", 0) or 1,
                         getattr(cfg, "pipeline_repeats", 1))},
        "task_feature_lengths": dict(task_feature_lengths), "pack": pack,
        "autotune_file": autotune_file, "step_lower_s": times["lower_s"],
        "step_compile_s": times["compile_s"],
        "init_compile_s": compile_init(the_run, autotune_file) if init else None,
        "memory": memory.as_dict() if memory else None,
        "model_flops": the_run.flops_per_example * batch_size,
        **{f"program_{k}": v for k, v in gpu_program.totals(kernels).items()},
        "xla_cost_analysis": _cost_analysis(compiled),
        "predicted_step_s": step_time.predict(kernels, facts),
        **step_time.breakdown(kernels, facts),
        "gemm_efficiency": step_time.GEMM_EFFICIENCY,
        "kernels_by_part": _rows(kernels, facts, lambda k: (k.part, k.kind)),
        "kernels_by_kind": _rows(kernels, facts, lambda k: (k.kind,)),
        "top_ops": _rows(kernels, facts, lambda k: (gpu_program.op_path(k.op_name), k.kind),
                         limit=TOP_OPS),
    }
    report["predicted_seq_per_s"] = batch_size / report["predicted_step_s"]
    report["collectives"] = rows
    report.update(comm_time.summary(rows))
    report["predicted_step_with_comm_s"] = report["predicted_step_s"] + report["predicted_comm_s"]
    report["predicted_step_overlapped_s"] = max(report["predicted_step_s"],
                                                report["predicted_comm_s"])
    if device_bytes is not None:
        report["step_memory"] = step_memory.memory_report(
            the_run.partitioner.mesh, batch_size, memory, device_bytes,
            step_memory.state_bytes_per_device(the_run))
    report["kernels"] = kernels
    return report


def _microbatches() -> int:
    return int(gin.get_bindings("train").get("num_microbatches", 1) or 1)


def _rows(kernels: List[gpu_program.Kernel], facts, key, limit: Optional[int] = None):
    groups: Dict[Any, List[gpu_program.Kernel]] = {}
    for k in kernels:
        groups.setdefault(key(k), []).append(k)
    rows = [{"group": list(g), **gpu_program.totals(ks),
             "predicted_s": step_time.predict(ks, facts)} for g, ks in groups.items()]
    rows.sort(key=lambda r: -r["bytes"])
    return rows[:limit] if limit else rows


def _gb(b: float) -> str:
    return f"{b / 1e9:,.1f} GB"


def format_gpu_report(r: Mapping[str, Any]) -> str:
    """The report as tables."""
    mem = r.get("memory") or {}
    init = (f", initializer {r['init_compile_s']:.1f} s "
            f"({100 * r['init_compile_s'] / r['step_compile_s']:.0f}% of the step's)"
            if r.get("init_compile_s") is not None else "")
    xla = r.get("xla_cost_analysis") or {}
    lines = [
        f"compiled for {r['device_kind']} on this machine (no GPU; "
        f"{'autotune results loaded' if r.get('autotune_file') else 'not autotuned'}), "
        f"global batch {r['batch_size']}",
        f"  compile        step {r['step_compile_s']:.1f} s (lowering {r['step_lower_s']:.1f} s)"
        + init,
        f"  memory         {mem.get('peak_bytes', 0) / 2**30:,.1f} GiB a device (temporaries "
        f"{mem.get('temp_bytes', 0) / 2**30:,.1f} GiB) of {r['device_memory_size'] / 2**30:,.0f}",
        f"  program        {r['program_launches']:,.0f} kernel launches, "
        f"{r['program_flops'] / 1e12:,.2f} TFLOP (model: {r['model_flops'] / 1e12:,.2f}), "
        f"{_gb(r['program_bytes'])} moved"
        + (f" (XLA's cost analysis: {xla['flops'] / 1e12:,.2f} TFLOP, {_gb(xla['bytes'])}, "
           f"library calls uncounted)" if xla else ""),
        f"  predicted step {1e3 * r['predicted_step_s']:,.1f} ms, "
        f"{r['predicted_seq_per_s']:,.1f} seq/s (compute-bound kernels "
        f"{1e3 * r['compute_bound_s']:,.1f} ms, memory-bound {1e3 * r['memory_bound_s']:,.1f}, "
        f"launches {1e3 * r['launch_s']:,.1f}; GEMMs at {r['gemm_efficiency']:.0%} of peak)",
        "  by part and kind                          launches     TFLOP        GB   pred ms"]
    lines += [_row(" / ".join(row["group"]), row, 40) for row in r["kernels_by_part"]]
    lines.append("  by kind")
    lines += [_row(row["group"][0], row, 40) for row in r["kernels_by_kind"]]
    if r.get("collectives"):
        lines += _collective_lines(r)
    lines.append("  the ops that move the most (layers merged)")
    lines += [_row(f"{row['group'][0][-60:]} [{row['group'][1]}]", row, 40, wide=True)
              for row in r["top_ops"]]
    return "\n".join(lines)


def _collective_lines(r: Mapping[str, Any]) -> List[str]:
    mesh = " ".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1) or "one device"
    pipe = r["pipeline"]
    lines = [f"  communication  {r['devices']} devices on {r['hosts']} host(s), mesh {mesh}"
             + (f"; pipeline {pipe['stages']} stages x {pipe['microbatches']} microbatches"
                f" x {pipe['repeats']} repeat(s), bubble {pipe['bubble']:.1%}"
                if pipe["stages"] > 1 else ""),
             f"    predicted (uncalibrated) {1e3 * r['predicted_comm_s']:,.1f} ms a step: "
             f"within hosts {r['within_hosts_bytes'] / 1e9:,.2f} GB sent a device "
             f"({1e3 * r['within_hosts_s']:,.1f} ms), across hosts "
             f"{r['across_hosts_bytes'] / 1e9:,.2f} GB ({1e3 * r['across_hosts_s']:,.1f} ms); "
             f"step {1e3 * r['predicted_step_overlapped_s']:,.1f} to "
             f"{1e3 * r['predicted_step_with_comm_s']:,.1f} ms (all overlapped .. none)",
             "    kind                 mesh axes          hosts   launches   GB a device  pred ms"]
    for row in r["collectives"]:
        lines.append(f"    {row['kind']:<20} {','.join(row['mesh_axes']) or '-':<18} "
                     f"{'across' if row['across_hosts'] else 'within':<7} "
                     f"{row['launches']:>8,} {row['bytes'] / 1e9:>12,.3f} "
                     f"{1e3 * row['predicted_s']:>8,.2f}")
    return lines


def _row(label: str, row: Mapping[str, Any], width: int, wide: bool = False) -> str:
    text = f"    {label}" if wide else f"    {label:<{width}}"
    values = (f"{row['launches']:>8,.0f} {row['flops'] / 1e12:>9,.2f} "
              f"{row['bytes'] / 1e9:>9,.1f} {1e3 * row['predicted_s']:>9,.1f}")
    return f"{text}\n    {'':<{width}}{values}" if wide else f"{text}{values}"


# ---------------------------------------------------------------------------------------
# `python -m t5lite.info --gpu` / `--memory`
# ---------------------------------------------------------------------------------------
def add_flags(parser) -> None:
    """`info`'s flags that compile for a GPU, or for a cluster of them."""
    parser.add_argument("--gpu", help="compile for this GPU here (h100, h200 or a target "
                        "config file): kernels, bytes, memory, predicted step time")
    parser.add_argument("--autotune_results", help="with --gpu: a GPU session's autotune file")
    parser.add_argument("--hosts", type=int, default=1, help="with --gpu: a cluster of this "
                        "many hosts (DCN_MESH_SHAPE lays them out)")
    parser.add_argument("--gpus_per_host", type=int, help="with --hosts: GPUs a host (8)")


def gpu_for(gpu: Optional[str], memory: bool, hosts: int = 1) -> Optional[str]:
    """The GPU info compiles for: --gpu, else an H100 for --memory where the gpu-aot extra
    is installed (a GPU's memory plan is not a CPU's), else None (simulated CPUs). Makes
    jax run on the CPU when a GPU is compiled for. `hosts` > 1 (a cluster) needs --gpu."""
    if hosts > 1 and gpu is None:
        raise ConfigError("--hosts compiles for a GPU cluster: give --gpu=h100 (or h200)")
    if gpu is None and memory and gpu_target.available():
        gpu = "h100"
    if gpu is not None:
        gpu_target.target_config(gpu)  # a wrong name: one line, before jax starts
        gpu_target.use_cpu_platform()
    return gpu


def devices(gpu: str, count: int, hosts: int = 1):
    """`count` compile-only devices of `gpu` on each of `hosts` hosts."""
    if count < 1 or hosts < 1:
        raise ConfigError(f"--devices / --gpus_per_host and --hosts must be >= 1, got "
                          f"{count} and {hosts}")
    return gpu_target.gpu_devices(gpu, count, hosts)


def memory_gib(gpu: Optional[str]) -> float:
    """A device's memory for --memory's verdict: the GPU's, or an H100's 80 GiB."""
    if gpu is None:
        return 80.0
    return gpu_target.device_facts(gpu_target.target_config(gpu))["device_memory_size"] / 2**30


def info_section(report: Dict[str, Any], model, optimizer, gpu: str, devices_,
                 memory_gib: Optional[float], per_device_batch: Optional[int],
                 autotune_file: Optional[str]) -> str:
    """`info --gpu`: the report into report["gpu_step"] (without its kernel list) and,
    with `memory_gib` (`--memory`: a device's memory), its compiled step's memory into
    report["step_memory"] (no second compile); its tables."""
    batch = benchmarking.global_batch(per_device_batch, len(devices_))
    pack = bool(gin.get_bindings("train").get("pack", False))
    device_bytes = None if memory_gib is None else int(memory_gib * step_memory.GiB)
    result = gpu_step_report(model, optimizer, gpu, batch, report["task_feature_lengths"],
                             pack, autotune_file, devices=devices_, device_bytes=device_bytes)
    result.pop("kernels")
    if memory_gib is not None:
        report["step_memory"] = result.pop("step_memory")
    report["gpu_step"] = result
    return "\n" + format_gpu_report(result)
