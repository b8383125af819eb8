"""An account of a train step's program: its biggest tensors and the bytes its
operations write and read, from the StableHLO lowered for a GPU on any machine
(`PartitionedFunction.lower_for("cuda", ...)`), before XLA fuses anything.

    report = step_account(run, task_feature_lengths, pack)   # lowered for CUDA
    print(format_account(report))

What it counts: every operation's results (written) and operands (read), in bytes, the
callees of `func.call` as often as they are called. It is the program as traced, before
fusion, so the totals are an upper bound of the memory traffic (XLA fuses elementwise
chains into one kernel that writes only its output), and a `while` body (SCAN_LAYERS,
microbatches) is counted once. What it is for: comparing two settings of one step, and
seeing which tensors dominate (a float32 [batch, heads, q, k] score tensor shows as such)
without a GPU. Shapes are global: lower for one device to read them per device.
"""
from __future__ import annotations

import collections
import math
import re
from typing import Any, Dict, Iterator, Mapping, Tuple

from jaxlib.mlir import ir

TOP = 12  # the largest tensors listed
_NOT_WRITES = {"func.return", "stablehlo.return", "func.call", "func.func"}


def _bytes_and_shape(value_type) -> Tuple[int, Tuple[int, ...], str]:
    """(bytes, shape, element type) of a ranked tensor type; (0, (), kind) otherwise."""
    try:
        t = ir.RankedTensorType(value_type)
    except (ValueError, TypeError):  # a token, a tuple: nothing of size
        return 0, (), str(value_type)
    element = str(t.element_type)
    bits = int(m.group(1)) if (m := re.search(r"(\d+)", element)) else 32
    if element.startswith("complex"):
        bits *= 2
    return math.prod(t.shape) * max(1, bits // 8), tuple(t.shape), element


def _operations(block) -> Iterator[Any]:
    for op in block.operations:
        yield op
        for region in op.operation.regions:
            for inner in region.blocks:
                yield from _operations(inner)


class _Counter:
    def __init__(self, module):
        self.functions = {}
        for op in module.body.operations:
            if op.operation.name == "func.func":
                name = ir.StringAttr(op.operation.attributes["sym_name"]).value
                self.functions[name] = op
        self.memo: Dict[str, Dict[str, Any]] = {}

    def function(self, name: str) -> Dict[str, Any]:
        if name not in self.memo:
            self.memo[name] = self._count(self.functions[name])
        return self.memo[name]

    def _count(self, fn) -> Dict[str, Any]:
        out = {"ops": 0, "while_loops": 0, "written": 0, "read": 0,
               "tensors": collections.Counter(), "by_op": collections.Counter(),
               "tensor_ops": collections.defaultdict(collections.Counter)}
        for block in fn.operation.regions[0].blocks:
            for op in _operations(block):
                name = op.operation.name
                if name == "func.call":
                    callee = ir.FlatSymbolRefAttr(op.operation.attributes["callee"]).value
                    _add(out, self.function(callee))
                    continue
                if name in _NOT_WRITES:
                    continue
                out["ops"] += 1
                out["while_loops"] += name == "stablehlo.while"
                for value in op.operation.operands:
                    out["read"] += _bytes_and_shape(value.type)[0]
                for value in op.operation.results:
                    size, shape, element = _bytes_and_shape(value.type)
                    out["written"] += size
                    out["by_op"][name] += size
                    out["tensors"][(shape, element, size)] += 1
                    out["tensor_ops"][(shape, element, size)][name] += 1
        return out


def _add(into: Dict[str, Any], other: Mapping[str, Any]) -> None:
    for key in ("ops", "while_loops", "written", "read"):
        into[key] += other[key]
    into["tensors"].update(other["tensors"])
    into["by_op"].update(other["by_op"])
    for key, ops in other["tensor_ops"].items():
        into["tensor_ops"][key].update(ops)


def account(module, top: int = TOP) -> Dict[str, Any]:
    """The account of a lowered program's `main` (an `ir.Module`, from
    `lowered.compiler_ir("stablehlo")`), as plain JSON-able values."""
    counted = _Counter(module).function("main")
    largest = sorted(counted["tensors"].items(), key=lambda kv: (-kv[0][2], -kv[1]))[:top]
    return {
        "ops": counted["ops"], "while_loops": counted["while_loops"],
        "bytes_written": counted["written"], "bytes_read": counted["read"],
        "largest": [{"shape": list(shape), "dtype": element, "bytes": size, "count": n,
                     "ops": dict(counted["tensor_ops"][(shape, element, size)].most_common(4))}
                    for (shape, element, size), n in largest],
        "bytes_written_by_op": dict(counted["by_op"].most_common(8)),
    }


def step_account(run, task_feature_lengths: Mapping[str, int], pack: bool = False,
                 platform: str = "cuda") -> Dict[str, Any]:
    """The account of `run`'s train step lowered for `platform` (nothing is compiled or
    allocated)."""
    from t5lite.tools import step_memory
    batch = step_memory.abstract_batch(run, task_feature_lengths, pack)
    lowered = run.step_fns.train_step.lower_for(platform, step_memory.abstract_state(run),
                                                dict(batch))
    report = account(lowered.compiler_ir("stablehlo"))
    mesh = run.partitioner.mesh
    return {"platform": platform, "devices": mesh.size, "batch_size": run.batch_size,
            **report}


def _gb(b: int) -> str:
    return f"{b / 1e9:,.2f} GB"


def format_account(report: Mapping[str, Any]) -> str:
    """The account as a table."""
    lines = [f"program account  lowered for {report.get('platform', '?')} (before fusion: "
             f"an upper bound of the traffic), global batch {report.get('batch_size', '?')} "
             f"on {report.get('devices', '?')} device(s)",
             f"  operations     {report['ops']:,} ({report['while_loops']} while loops, "
             f"their bodies counted once)",
             f"  written        {_gb(report['bytes_written'])}",
             f"  read           {_gb(report['bytes_read'])}",
             "  largest tensors (bytes each x how many; the ops that make them)"]
    for t in report["largest"]:
        ops = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in t["ops"].items())
        lines.append(f"    {'x'.join(map(str, t['shape'])) + ' ' + t['dtype']:<28} "
                     f"{t['bytes'] / 1e6:>10,.1f} MB x {t['count']:<4} {ops}")
    lines.append("  written by op  " + ", ".join(
        f"{k.split('.')[-1]} {_gb(v)}" for k, v in report["bytes_written_by_op"].items()))
    return "\n".join(lines)
