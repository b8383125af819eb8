"""`python -m t5lite.tools.step_calibration`: refit the step-time predictor
(`tools.step_time`) on the steps measured on GPUs. Each row of
`t5lite/tools/gpu_calibration.json` names a measured configuration (gin files, bindings,
batch, GPU), its measured step time and where that number comes from; this compiles each
for its GPU here (`tools.gpu_report`), stores its kernels, fits GEMM_EFFICIENCY over all
rows and writes each row's error. A GPU session's new measurement is a new row: add its
inputs, run this, and state the new errors in docs/performance.md.

    python -m t5lite.tools.step_calibration [--only NAME]   # rows named, else all
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from t5lite.tools import gpu_target

INPUTS = ("name", "gpu", "gin_files", "bindings", "batch_size", "measured_s", "measured",
          "source", "threefry_gpu_kernel", "xla_options")


def _compile_row(row):
    from t5lite.config import parsing
    from t5lite.tools import benchmarking, gpu_report, step_time
    parsing.parse_gin(row["gin_files"], row["bindings"] + [f"BATCH_SIZE = {row['batch_size']}"],
                      [], placeholders=parsing.RUN_PLACEHOLDERS)
    import gin
    model = parsing.resolve_macro("MODEL", origin=", ".join(row["gin_files"]))
    optimizer, _ = benchmarking.run_optimizer()
    lengths = gin.get_bindings("train")["task_feature_lengths"]
    from jax._src import config  # the random bits lowered as they were when measured
    launchers = dict(gpu_target.LAUNCHER_OPTIONS)  # and the launchers' flags of then
    gpu_target.LAUNCHER_OPTIONS.clear()
    gpu_target.LAUNCHER_OPTIONS.update(row["xla_options"])
    try:
        with config.threefry_gpu_kernel_lowering(row["threefry_gpu_kernel"]):
            report = gpu_report.gpu_step_report(model, optimizer, row["gpu"],
                                                row["batch_size"], lengths, init=False)
    finally:
        gpu_target.LAUNCHER_OPTIONS.clear()
        gpu_target.LAUNCHER_OPTIONS.update(launchers)
    facts = {k: report[k] for k in ("device_kind", "peak_flops", "memory_bandwidth")}
    return {**{k: row[k] for k in INPUTS}, "gpu_facts": facts,
            "program_bytes": report["program_bytes"], "program_flops": report["program_flops"],
            "kernels": step_time.compact(report["kernels"])}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t5lite.tools.step_calibration",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="recompile only these rows")
    args = parser.parse_args(argv)
    gpu_target.use_cpu_platform()
    from t5lite.tools import step_time
    table = json.loads(step_time.CALIBRATION.read_text())
    rows = [(_compile_row(r) if not args.only or r["name"] in args.only else r)
            for r in table["rows"]]
    cases = [{"kernels": step_time.row_kernels(r), "gpu": r["gpu_facts"],
              "measured_s": r["measured_s"]} for r in rows]
    efficiency = step_time.fit_gemm_efficiency(cases)
    for row, case in zip(rows, cases):
        row["predicted_s"] = step_time.predict(case["kernels"], case["gpu"], efficiency)
        row["error"] = row["predicted_s"] / row["measured_s"] - 1
        print(f"{row['name']}: measured {1e3 * row['measured_s']:.1f} ms, predicted "
              f"{1e3 * row['predicted_s']:.1f} ms ({100 * row['error']:+.1f}%)")
    table.update(gemm_efficiency=efficiency, rows=rows)
    step_time.CALIBRATION.write_text(json.dumps(table, indent=1) + "\n")
    print(f"GEMM_EFFICIENCY {efficiency:.3f} over {len(rows)} rows -> {step_time.CALIBRATION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
