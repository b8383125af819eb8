"""The collectives of a compiled SPMD program, read from its optimized HLO text: kind,
bytes, how many times a step runs them, and which mesh axes their device groups span.

    found = program_collectives(compiled.as_text())     # [Collective], loop trips counted
    axes = group_axes(c.groups, {"data": 2, "fsdp": 8, ...})   # the mesh axes it spans

`bytes` is one launch's buffer on one device, the one a ring moves in (n - 1) / n parts of
(`link_bytes`): an all-gather's result, a reduce-scatter's operand, an all-reduce's data
(twice the (n - 1) / n share: reduce-scatter then all-gather), an all-to-all's buffer, and
a collective permute's operand (sent whole). Device groups are partition ids, which are
the mesh's devices in row-major order of its axes: `replica_groups` written out
(`{{0,1},{2,3}}`), as an iota (`[4,2]<=[2,4]T(1,0)`) or by mesh axes
(`mesh['fsdp'=2,'stage'=4] {'fsdp'}`), and a permute's `source_target_pairs`. Async forms
(`all-gather-start`, an `async-start` around a reduce-scatter) count once.

Needs nothing of t5lite but the HLO reader (`gpu_program.parse_module`).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from t5lite.tools.hlo.gpu_program import Instruction, Module, parse_module
from t5lite.tools.hlo.kernel_bytes import ARRAY, DTYPE_BYTES, dims

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


@dataclasses.dataclass
class Collective:
    name: str
    kind: str                      # one of KINDS
    bytes: int                     # one launch, one device (module docstring)
    groups: List[List[int]]        # partition ids that communicate (permute: each pair)
    count: int = 1                 # launches a step (loop trips)
    op_name: str = ""

    @property
    def group_size(self) -> int:
        return max((len(g) for g in self.groups), default=1)

    def link_bytes(self) -> float:
        """What one device sends over its links in one launch (a ring's share)."""
        n = self.group_size
        if self.kind == "collective-permute":
            return float(self.bytes)
        if n <= 1:
            return 0.0
        share = (n - 1) / n
        return (2 * share if self.kind == "all-reduce" else share) * self.bytes


def _arrays(type_text: str) -> List[int]:
    return [int(DTYPE_BYTES.get(dt, 4) * math.prod(dims(d)))
            for dt, d in ARRAY.findall(type_text)]


def _iota_groups(text: str) -> List[List[int]]:
    """`[4,2]<=[2,4]T(1,0)`: arange over the reshape dims, transposed, reshaped."""
    found = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    shape, reshape = dims(found.group(1)), dims(found.group(2))
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if found.group(3):
        ids = ids.transpose(dims(found.group(3)))
    return ids.reshape(shape).tolist()


def _mesh_groups(text: str) -> List[List[int]]:
    """`mesh['fsdp'=2,'stage'=4] {'fsdp'}`: devices that differ only along the named axes."""
    axes = re.findall(r"'(\w+)'=(\d+)", text[:text.index("]") + 1])
    over = set(re.findall(r"'(\w+)'", text[text.index("]") + 1:]))
    names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
    ids = np.arange(math.prod(sizes)).reshape(sizes)
    moved = [i for i, a in enumerate(names) if a in over]
    kept = [i for i, a in enumerate(names) if a not in over]
    ids = ids.transpose(kept + moved)
    return ids.reshape(-1, math.prod(sizes[i] for i in moved) if moved else 1).tolist()


def _groups(inst: Instruction, all_devices: int) -> List[List[int]]:
    attrs = inst.attrs
    pairs = re.search(r"source_target_pairs=\{(\{[^=]*?\})\}", attrs)
    if pairs:
        return [dims(p) for p in re.findall(r"\{([\d,]+)\}", pairs.group(1))]
    at = attrs.find("replica_groups=")
    if at < 0:
        return [list(range(all_devices))]
    text = attrs[at + len("replica_groups="):]
    if text.startswith("mesh["):
        return _mesh_groups(text[:text.index("}") + 1])
    if text.startswith("["):
        return _iota_groups(text)
    explicit = re.match(r"\{((?:\{[\d,]*\},?)*)\}", text)
    groups = [dims(g) for g in re.findall(r"\{([\d,]*)\}", explicit.group(1))] if explicit else []
    return [g for g in groups if g] or [list(range(all_devices))]


def _kind(inst: Instruction, module: Module) -> Tuple[str, Instruction]:
    """(kind, the instruction carrying the attributes) or ('', inst)."""
    op = inst.opcode[:-len("-start")] if inst.opcode.endswith("-start") else inst.opcode
    if op in KINDS:
        return op, inst
    if inst.opcode == "async-start":
        for inner in module.computations.get((inst.attr("calls") or "").lstrip("%"), []):
            if inner.opcode in KINDS:
                return inner.opcode, inner
    return "", inst


def _bytes(kind: str, inst: Instruction, carrier: Instruction, group: int) -> int:
    arrays = _arrays(carrier.type if carrier is not inst else inst.type)
    if inst.opcode.endswith("-start") and inst.type.startswith("(") and len(arrays) > 1:
        if kind == "collective-permute":
            arrays = arrays[:1]                           # (operand, result, u32, u32)
        elif kind != "all-reduce":
            arrays = arrays[len(arrays) // 2:]           # (operands..., results...)
    total = sum(arrays)
    return total * group if kind == "reduce-scatter" else total


def program_collectives(text: str) -> List[Collective]:
    """Every collective the compiled program runs, with its launches a step."""
    module = parse_module(text)
    devices = int(re.search(r"num_partitions=(\d+)", text).group(1)) if re.search(
        r"num_partitions=(\d+)", text) else 1
    out: List[Collective] = []
    _walk(module, module.entry, 1, out, devices, set())
    return out


def _walk(module: Module, name: str, times: int, out: List[Collective], devices: int,
          stack: set) -> None:
    if name in stack:
        return
    stack = stack | {name}
    for inst in module.computations.get(name, []):
        kind, carrier = _kind(inst, module)
        if kind:
            groups = _groups(carrier, devices)
            size = max((len(g) for g in groups), default=1)
            out.append(Collective(inst.name, kind, _bytes(kind, inst, carrier, size), groups,
                                  times, carrier.op_name or inst.op_name))
            continue
        if inst.opcode == "while":
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', inst.attrs)
            body = (inst.attr("body") or "").lstrip("%")
            _walk(module, body, times * (int(trips.group(1)) if trips else 1), out, devices,
                  stack)
        elif inst.opcode in ("call", "conditional", "async-start"):
            called = [inst.attr("to_apply"), inst.attr("calls")]
            branches = re.search(r"branch_computations=\{([^}]*)\}", inst.attrs)
            called += branches.group(1).split(",") if branches else []
            for c in called:
                if c:
                    _walk(module, c.strip().lstrip("%"), times, out, devices, stack)


def group_axes(groups: Sequence[Sequence[int]], mesh_shape: Mapping[str, int]
               ) -> Tuple[str, ...]:
    """The mesh axes along which the devices of some group differ (mesh_shape: axis ->
    size, in the mesh's order; partition id = row-major index)."""
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    varying = set()
    for group in groups:
        coords = np.array(np.unravel_index(np.asarray(group, int), sizes)).T
        if len(coords) > 1:
            varying.update(names[i] for i in np.nonzero((coords != coords[0]).any(0))[0])
    return tuple(n for n in names if n in varying)


def spans_hosts(groups: Sequence[Sequence[int]], host_of: Sequence[int]) -> bool:
    """Whether some group holds devices of two hosts (host_of: partition id -> host)."""
    return any(len({host_of[d] for d in g}) > 1 for g in groups)


def by_kind(found: Sequence[Collective]) -> Dict[str, Dict[str, float]]:
    """{kind: {"launches": ..., "bytes": ... a step}}."""
    out: Dict[str, Dict[str, float]] = {}
    for c in found:
        row = out.setdefault(c.kind, {"launches": 0, "bytes": 0.0})
        row["launches"] += c.count
        row["bytes"] += c.count * c.bytes
    return out
