"""The bytes one kernel of an optimized HLO program reads and writes (`gpu_program`).

    moved = kernel_bytes(inst, operand_types, fused)   # fused: the fusion's computation

In full, a kernel reads its operands and writes its results. Two exceptions matter in a
loop over stacked layers (SCAN_LAYERS, microbatches), as in XLA's own HloCostAnalysis:
- a fusion that reads an operand only through slices (`dynamic-slice`, `slice`) reads
  the slices: one layer's weights out of the stacked [layers, ...] array;
- a `dynamic-update-slice` XLA does in place (the root of a fusion, or alone) writes its
  update, and does not read the buffer it updates: one layer's activations into the
  stacked array kept for the backward pass.
Counted in full, each would count the whole stack once per layer (for T5 large scanned,
about 3.5 TB a step instead of about 290 GB).

`inst` and the fused instructions need `name`, `type`, `opcode` and `operands`
(`gpu_program.Instruction`). A fused computation's parameters are XLA's `param_<i>.<n>`
(`p<i>` in a dynamic-slice fusion around a library call), parameter i being the fusion's
operand i; one named otherwise is counted in full.
"""
from __future__ import annotations

import collections
import math
import re
from typing import Dict, List, Optional, Sequence

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
               "c128": 16, "s4": 0.5, "u4": 0.5}
ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_PARAM = re.compile(r"^(?:param_|p)(\d+)(\.\d+)?$")
_SLICES = ("dynamic-slice", "slice")


def dims(text: str) -> List[int]:
    return [int(d) for d in text.split(",") if d]


def array_bytes(type_text: str, skip_scratch: bool = False) -> int:
    """Bytes of every array in an HLO type (`bf16[8,512]{1,0}` or a tuple of them);
    with `skip_scratch`, a tuple's trailing u8 / s8 buffer (a library call's scratch)
    is left out."""
    arrays = ARRAY.findall(type_text)
    if skip_scratch and type_text.startswith("(") and len(arrays) > 1 \
            and arrays[-1][0] in ("u8", "s8"):
        arrays = arrays[:-1]
    return int(sum(DTYPE_BYTES.get(dt, 4) * math.prod(dims(d)) for dt, d in arrays))


def kernel_bytes(inst, operand_types: Sequence[str], fused: Optional[list] = None) -> int:
    """What `inst` (a kernel) moves: the module docstring."""
    if fused:
        return _fused_bytes(fused, operand_types)
    if inst.opcode == "dynamic-update-slice" and len(operand_types) > 1:
        return 2 * array_bytes(operand_types[1])
    if inst.opcode == "dynamic-slice":
        return 2 * array_bytes(inst.type)
    return array_bytes(inst.type, skip_scratch=inst.opcode == "custom-call") + sum(
        array_bytes(t) for t in operand_types)


def _fused_bytes(fused: list, operand_types: Sequence[str]) -> int:
    by_name = {i.name: i for i in fused}
    users: Dict[str, list] = collections.defaultdict(list)
    for i in fused:
        for o in i.operands:
            users[o].append(i)

    def unwrapped(name: str):
        i = by_name.get(name)
        while i is not None and i.opcode == "bitcast" and i.operands:
            i = by_name.get(i.operands[0])
        return i

    root = fused[-1]
    outputs = ([by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root])
    written, in_place = 0, set()
    for out in outputs:
        base = unwrapped(out.name) if out is not None else None
        if base is not None and base.opcode == "dynamic-update-slice" and len(base.operands) > 1:
            update = by_name.get(base.operands[1])
            written += array_bytes(update.type) if update else array_bytes(base.type)
            buffer = unwrapped(base.operands[0])
            if buffer is not None and buffer.opcode == "parameter":
                in_place.add((buffer.name, base.name))
        elif out is not None and not _scratch(out, by_name):
            written += array_bytes(out.type, skip_scratch=out.opcode == "custom-call")
    read = 0
    for p in (i for i in fused if i.opcode == "parameter"):
        found = _PARAM.match(p.name)
        if not found or int(found.group(1)) >= len(operand_types):
            read += array_bytes(p.type)
            continue
        full = array_bytes(operand_types[int(found.group(1))])
        uses = [(u, used) for u, used in _uses(p.name, users)
                if (p.name, u.name) not in in_place]
        if all(u.opcode in _SLICES and u.operands[0] == used for u, used in uses):
            read += min(full, sum(array_bytes(u.type) for u, _ in uses))
        else:
            read += full
    return written + read


def _scratch(out, by_name) -> bool:
    """Whether a fusion's output is a library call's scratch buffer passed out."""
    source = by_name.get(out.operands[0]) if out.operands else None
    return (out.opcode == "get-tuple-element" and source is not None
            and source.opcode == "custom-call" and out.type.split("[")[0] in ("u8", "s8"))


def _uses(name: str, users) -> list:
    """(instruction, the name it uses) for each use of `name`, looking through bitcasts."""
    out = []
    for u in users.get(name, []):
        out.extend(_uses(u.name, users) if u.opcode == "bitcast" else [(u, name)])
    return out
