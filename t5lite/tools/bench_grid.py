"""A grid of train-step benchmarks in one process: the library behind
`python -m t5lite.bench --grid=FILE --out_dir=DIR` and `scripts_gpu/bench_grid.sh`.

A grid file is JSON:

    {"steps": 20, "warmup": 3,
     "common": {"gin_files": ["configs/synthetic_pretrain.gin"],
                "bindings": ["TASK_FEATURE_LENGTHS = {'inputs': 512, 'targets': 128}"]},
     "runs": [{"name": "large", "gin_files": ["configs/models/t5_1_1/large.gin"],
               "per_device_batch": [32, 64, 128],
               "precisions": ["bf16", "fp8"],
               "ablate": {"fused_qkv": ["FUSE_QKV = True"],
                          "cudnn": ["ATTENTION_IMPL = 'cudnn'"]}}]}

A run's own gin files come first, then the common ones (a model, then the run on top of
it); common bindings come before a run's own. Each entry expands to one run per precision
(`bf16`, native `fp8`, Transformer Engine `te_fp8`), plus one per `ablate` item (that item's bindings on top), named `large_bf16`, `large_bf16+fused_qkv`
and so on. `per_device_batch` is one size or an ascending sweep: the global batch is that
times the device count, and a sweep stops at the first size that does not fit, so its
last good entry is the largest batch that fits.

Each measured configuration is compiled once, warmed up and timed
(`tools.benchmark.bench`), and its result is written as soon as it exists:
`DIR/<run>_b<per-device batch>.json` (the format of `python -m t5lite.bench --json_out`,
plus `status`), `DIR/summary.json` and the markdown table `DIR/results.md`. A call cut off
at its time limit keeps every result written before; `time_budget_s` stops starting new
configurations when the remaining time is shorter than the slowest one so far.
Statuses: `ok`, `oom` (out of memory, at compile time or while running), `error` (one
line; the grid goes on with the next run) and `skipped` (time budget).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import gc
import json
import os
import shlex
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax

from t5lite.errors import ConfigError, PartitioningError
from t5lite.tools.benchmark import StepDoesNotFit

ENTRY_KEYS = {"name", "gin_files", "bindings", "per_device_batch", "precisions", "ablate"}
GRID_KEYS = {"steps", "warmup", "common", "runs", "description"}
PRECISION_BINDINGS = {"bf16": ("FP8 = False",),
                      "fp8": ("FP8 = True", "FP8_BACKEND = 'native'"),
                      "te_fp8": ("FP8 = True", "FP8_BACKEND = 'te'")}


@dataclasses.dataclass(frozen=True)
class GridRun:
    """One configuration of the grid, measured at one or more per-device batch sizes."""

    name: str
    gin_files: Tuple[str, ...]
    bindings: Tuple[str, ...]
    per_device_batches: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Grid:
    runs: Tuple[GridRun, ...]
    steps: int = 20
    warmup: int = 3


def _fail(path: str, what: str) -> ConfigError:
    return ConfigError(f"grid file {path}: {what}")


def _strings(path: str, where: str, value) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, f"{where} must be a list of strings, got {value!r}")
    return tuple(value)


def _batches(path: str, name: str, value) -> Tuple[int, ...]:
    sizes = [value] if isinstance(value, int) else value
    if (not isinstance(sizes, list) or not sizes
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in sizes)
            or sorted(set(sizes)) != sizes):
        raise _fail(path, f"run {name!r}: per_device_batch must be a positive integer or an "
                          f"ascending list of them, got {value!r}")
    return tuple(sizes)


def _expand(path: str, entry: Dict[str, Any], common: Dict[str, Any]) -> List[GridRun]:
    if not isinstance(entry, dict) or "name" not in entry:
        raise _fail(path, f"each run needs a name, got {entry!r}")
    name = entry["name"]
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise _fail(path, f"run {name!r}: unknown key(s) {sorted(unknown)}; "
                          f"known: {sorted(ENTRY_KEYS)}")
    files = (_strings(path, f"{name}.gin_files", entry.get("gin_files", []))
             + _strings(path, "common.gin_files", common.get("gin_files", [])))
    base = (_strings(path, "common.bindings", common.get("bindings", []))
            + _strings(path, f"{name}.bindings", entry.get("bindings", [])))
    batches = _batches(path, name, entry.get("per_device_batch"))
    precisions = entry.get("precisions", [None])
    ablate = entry.get("ablate", {})
    if not isinstance(ablate, dict):
        raise _fail(path, f"run {name!r}: ablate must map a variant name to its bindings")
    runs = []
    for precision in precisions:
        if precision is not None and precision not in PRECISION_BINDINGS:
            raise _fail(path, f"run {name!r}: precision {precision!r} is not one of "
                              f"{sorted(PRECISION_BINDINGS)}")
        stem = name if precision is None else f"{name}_{precision}"
        prec = () if precision is None else PRECISION_BINDINGS[precision]
        runs.append(GridRun(stem, files, base + prec, batches))
        for variant, extra in ablate.items():
            extra = _strings(path, f"{name}.ablate.{variant}", extra)
            runs.append(GridRun(f"{stem}+{variant}", files, base + prec + extra, batches))
    return runs


def load_grid(path: str) -> Grid:
    """The grid in JSON file `path`, expanded and checked (ConfigError in one line)."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read grid file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise _fail(path, f"not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("runs"), list):
        raise _fail(path, "expected an object with a list of runs under \"runs\"")
    unknown = set(spec) - GRID_KEYS
    if unknown:
        raise _fail(path, f"unknown key(s) {sorted(unknown)}; known: {sorted(GRID_KEYS)}")
    common = spec.get("common", {})
    runs = [r for entry in spec["runs"] for r in _expand(path, entry, common)]
    names = [r.name for r in runs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _fail(path, f"run names must be unique, repeated: {duplicates}")
    steps, warmup = spec.get("steps", 20), spec.get("warmup", 3)
    if not (isinstance(steps, int) and steps > 0 and isinstance(warmup, int) and warmup >= 0):
        raise _fail(path, f"steps must be > 0 and warmup >= 0, got {steps} and {warmup}")
    return Grid(tuple(runs), steps, warmup)


def select(runs: Sequence[GridRun], patterns: Optional[Sequence[str]]) -> List[GridRun]:
    """The runs whose name matches one of the shell patterns (all when none are given)."""
    if not patterns:
        return list(runs)
    return [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def is_out_of_memory(error: BaseException) -> bool:
    """An allocation failure on the device (XLA's RESOURCE_EXHAUSTED), or a step whose
    compiled memory exceeds the device's."""
    text = str(error)
    return (isinstance(error, StepDoesNotFit) or "RESOURCE_EXHAUSTED" in text
            or "out of memory" in text.lower())


def _one_line(error: BaseException) -> str:
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]


Measure = Callable[[GridRun, int], Dict[str, Any]]


def run_grid(grid: Grid, out_dir: str, measure: Measure, *,
             time_budget_s: Optional[float] = None,
             log: Callable[[str], None] = print) -> List[Dict[str, Any]]:
    """Measure every run of the grid (each batch sweep in ascending order) with
    `measure(run, per_device_batch) -> bench result`, writing results as they come.
    Returns the summary rows."""
    os.makedirs(out_dir, exist_ok=True)
    start, slowest, rows = time.monotonic(), 0.0, []
    for grid_run in grid.runs:
        for batch in grid_run.per_device_batches:
            remaining = None if time_budget_s is None else (
                time_budget_s - (time.monotonic() - start))
            t0 = time.monotonic()
            if remaining is not None and remaining < max(slowest, 1.0):
                row = {"status": "skipped",
                       "message": f"{remaining:.0f} s of the time budget left"}
            else:
                row = _measure_one(measure, grid_run, batch)
            slowest = max(slowest, time.monotonic() - t0)
            row.update(run=grid_run.name, per_device_batch=batch,
                       bindings=list(grid_run.bindings), gin_files=list(grid_run.gin_files))
            rows.append(row)
            _write(out_dir, row, rows)
            log(format_row(row))
            if row["status"] in ("oom", "error"):
                break  # a larger batch cannot fit either; an error repeats
    return rows


def _measure_one(measure: Measure, grid_run: GridRun, batch: int) -> Dict[str, Any]:
    try:
        return {"status": "ok", **measure(grid_run, batch)}
    except (ConfigError, PartitioningError) as e:
        return {"status": "error", "message": str(e)}
    except Exception as e:  # noqa: BLE001 - one configuration must not end the grid
        status = "oom" if is_out_of_memory(e) else "error"
        return {"status": status, "message": _one_line(e)}
    finally:
        gc.collect()        # drop the state and batches of this configuration
        jax.clear_caches()  # and its executables, before the next one compiles


def _write(out_dir: str, row: Dict[str, Any], rows: List[Dict[str, Any]]) -> None:
    name = f"{row['run']}_b{row['per_device_batch']}.json"
    _atomic_write(os.path.join(out_dir, name), json.dumps(row, indent=1))
    brief = [{k: v for k, v in r.items() if k not in ("step_durations_s", "gin_config")}
             for r in rows]
    _atomic_write(os.path.join(out_dir, "summary.json"), json.dumps(brief, indent=1))
    _atomic_write(os.path.join(out_dir, "results.md"), markdown_table(rows))


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _cells(row: Dict[str, Any]) -> List[str]:
    per_device = row.get("device_count") or 1
    compiled = (row.get("compiled_memory") or {}).get("peak_bytes")
    if row["status"] != "ok":
        return [row["run"], str(row["per_device_batch"]), row["status"], "", "", "", "", "",
                "", "", _gib(compiled), row.get("message", "")]
    mfu = row.get("mfu")
    ahead, predicted = row.get("async_step_s"), row.get("predicted_step_s")
    return [row["run"], str(row["per_device_batch"]), "ok",
            f"{1000 * row['median_step_s']:.1f}",
            "-" if ahead is None else f"{1000 * ahead:.1f}",
            "-" if predicted is None else f"{1000 * predicted:.1f}",
            f"{row['seq_per_s'] / per_device:.1f}",
            "-" if row.get("tflops_per_device") is None else f"{row['tflops_per_device']:.1f}",
            "-" if mfu is None else f"{100 * mfu:.1f}%", _gib(row.get("peak_memory_bytes")),
            _gib(compiled), _seconds(row)]


def _seconds(row: Dict[str, Any]) -> str:
    """Where a configuration's start-up went: build, step compile, init (compile + run)."""
    parts = [(name, row.get(key)) for name, key in
             (("build", "build_s"), ("compile", "compile_s"), ("init", "init_s"))]
    return ", ".join(f"{name} {value:.0f} s" for name, value in parts if value is not None)


def markdown_table(rows: Sequence[Dict[str, Any]]) -> str:
    """The grid's results as a markdown table (device and versions in the heading)."""
    first = next((r for r in rows if r["status"] == "ok"), None)
    head = ("" if first is None else
            f"{first['device_count']} x {first['device_kind']}, jax {first['jax_version']}\n\n")
    columns = ["run", "batch / device", "status", "step ms", "ahead ms", "predicted ms",
               "seq/s / device",
               "TFLOP/s / device", "MFU", "peak GiB (measured)", "step GiB (compiled)", "note"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    return head + "\n".join(lines) + "\n"


def format_row(row: Dict[str, Any]) -> str:
    """One progress line per measured configuration."""
    cells = _cells(row)
    if row["status"] != "ok":
        return f"{cells[0]} b{cells[1]}: {row['status']} {row.get('message', '')}"
    return (f"{cells[0]} b{cells[1]}: {cells[3]} ms ({cells[4]} ms dispatched ahead), "
            f"{cells[5]} seq/s/device, {cells[6]} TFLOP/s/device, MFU {cells[7]}, "
            f"peak {cells[8]} GiB; {cells[10]}")


def command_for(grid_run: GridRun, batch_size: int) -> str:
    """The single-configuration command that reproduces one grid measurement."""
    parts = ["python -m t5lite.bench"] + [f"--gin_file={f}" for f in grid_run.gin_files]
    parts += [shlex.quote(f"--gin_bindings={b}") for b in grid_run.bindings]
    parts.append(f"--gin.BATCH_SIZE={batch_size}")
    return " ".join(parts)
