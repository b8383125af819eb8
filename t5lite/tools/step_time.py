"""A train step's time on a GPU, predicted from the kernels of its compiled program
(`gpu_program.program_kernels`): a roofline sum, calibrated on steps measured on a GPU.

    seconds = predict(kernels, gpu_facts)       # gpu_facts: gpu_target.device_facts + peak
    rows = calibration_rows()                   # the measured steps the constants fit

Each kernel takes the longer of its compute time and its memory time, plus a fixed cost
per launch:

    t = max(flops / (peak x GEMM_EFFICIENCY), bytes / (bandwidth x MEMORY_EFFICIENCY))
        + LAUNCH_S                                  (a GEMM or cuDNN attention kernel)
    t = max(flops / VECTOR_PEAK, bytes / (bandwidth x MEMORY_EFFICIENCY)) + LAUNCH_S
                                                    (every other kernel)

summed over launches (a loop body's kernels times its trips). The constants are the same
for every configuration: MEMORY_EFFICIENCY and LAUNCH_S are set from what Hopper GPUs
reach in general (a copy kernel streams at ~85-90% of HBM's peak; back-to-back kernel
launches cost a few microseconds when the GPU has run ahead of the host), and
GEMM_EFFICIENCY, the one fitted, is the least-squares fit of the relative error over the
measured steps in `CALIBRATION` (fitted by `fit_gemm_efficiency`; docs/performance.md
states each row's error). What the sum leaves out: kernels running concurrently (a
single stream runs them one after another), caches (an operand read twice may come from
L2 the second time), GEMM shapes that tile badly, the host's dispatch when it falls
behind the GPU. A new GPU measurement is a new row: add it, refit, say the new errors.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, Iterable, List, Mapping

from t5lite.tools.hlo.gpu_program import Kernel

MEMORY_EFFICIENCY = 0.85
LAUNCH_S = 3e-6
VECTOR_PEAK_FLOPS = 60e12   # float32 on CUDA cores (H100 / H200 SXM: ~67 TFLOP/s)
MATRIX_KINDS = ("cublas gemm", "gemm fusion", "cudnn attention")

CALIBRATION = pathlib.Path(__file__).with_name("gpu_calibration.json")
"""The measured steps (each row's config, GPU, measured step time, its source, and its
program's kernels as compiled here) and the GEMM efficiency fitted on them; written by
`python -m t5lite.tools.step_calibration`."""

GEMM_EFFICIENCY: float = json.loads(CALIBRATION.read_text())["gemm_efficiency"]


def kernel_seconds(k: Kernel, gpu: Mapping[str, float], gemm_efficiency: float) -> float:
    """One launch of `k` on `gpu` ({"peak_flops", "memory_bandwidth"}; an FP8 matmul at
    "peak_fp8_flops", default twice the bf16 peak, as on Hopper)."""
    memory = k.bytes / (gpu["memory_bandwidth"] * MEMORY_EFFICIENCY)
    peak = gpu.get("peak_fp8_flops", 2 * gpu["peak_flops"]) if k.fp8 else gpu["peak_flops"]
    rate = peak * gemm_efficiency if k.kind in MATRIX_KINDS else VECTOR_PEAK_FLOPS
    return max(k.flops / rate, memory) + LAUNCH_S


def predict(kernels: Iterable[Kernel], gpu: Mapping[str, float],
            gemm_efficiency: float = GEMM_EFFICIENCY) -> float:
    """Predicted seconds of one step."""
    return sum(kernel_seconds(k, gpu, gemm_efficiency) * k.count for k in kernels)


def breakdown(kernels: Iterable[Kernel], gpu: Mapping[str, float],
              gemm_efficiency: float = GEMM_EFFICIENCY) -> Dict[str, float]:
    """The predicted seconds split into what bounds each kernel: compute, memory, launch."""
    out = {"compute_bound_s": 0.0, "memory_bound_s": 0.0, "launch_s": 0.0}
    for k in kernels:
        t = kernel_seconds(k, gpu, gemm_efficiency) - LAUNCH_S
        memory = k.bytes / (gpu["memory_bandwidth"] * MEMORY_EFFICIENCY)
        out["memory_bound_s" if t <= memory else "compute_bound_s"] += t * k.count
        out["launch_s"] += LAUNCH_S * k.count
    return out


def calibration_rows() -> List[Dict[str, Any]]:
    """The measured steps the constants were fitted on."""
    return json.loads(CALIBRATION.read_text())["rows"]


def compact(kernels: Iterable[Kernel]) -> List[List[float]]:
    """What `predict` needs of each kernel, as [matrix (0 / 1 / 2: FP8), flops, bytes,
    launches], identical kernels merged."""
    merged: Dict[tuple, int] = {}
    for k in kernels:
        key = (int(k.kind in MATRIX_KINDS) * (2 if k.fp8 else 1), k.flops, k.bytes)
        merged[key] = merged.get(key, 0) + k.count
    return [[m, f, b, n] for (m, f, b), n in sorted(merged.items())]


def row_kernels(row: Mapping[str, Any]) -> List[Kernel]:
    """A calibration row's kernels (from `compact`)."""
    return [Kernel("", MATRIX_KINDS[0] if m else "other", "", "", "", f, int(b), int(n),
                   fp8=m == 2) for m, f, b, n in row["kernels"]]


def fit_gemm_efficiency(cases: List[Dict[str, Any]]) -> float:
    """The GEMM efficiency (0.05 .. 1, in steps of 0.005) that minimizes the summed
    squared relative error of `predict` over `cases` ({"kernels", "gpu",
    "measured_s"})."""
    def error(e: float) -> float:
        return sum((predict(c["kernels"], c["gpu"], e) / c["measured_s"] - 1) ** 2
                   for c in cases)
    return min((0.05 + 0.005 * i for i in range(191)), key=error)
