"""The kernels of a program XLA compiled for a GPU, read from its optimized HLO text
(`compiled.as_text()`), each with its FLOPs, the bytes it moves and the model part it
comes from.

    kernels = program_kernels(compiled.as_text())   # [Kernel], loop bodies x trip count
    table = part_table(kernels)                      # rows grouped by part and kind

What a kernel is: one instruction of the entry computation (or of a loop body, a called
command buffer or a conditional branch) that launches work on the device: a fusion, a
library call (cuBLAS, cuDNN), a copy, an unfused reduce or scatter. Parameters, tuples,
bitcasts and get-tuple-elements move nothing.

What it counts, per kernel:
- bytes: its operands plus its results (`kernel_bytes`), as XLA's HloCostAnalysis
  counts them: an operand read through slices counts the slices, an in-place
  dynamic-update-slice its update; a library call's scratch buffer (the trailing u8 / s8
  result of cuBLAS and cuDNN calls) is not counted. A kernel in a `while` body counts
  `known_trip_count` times.
- FLOPs: a matmul's 2 * M * N * K (inside a GEMM fusion, or a cuBLAS call from its
  operand shapes and contracting dimensions); cuDNN's fused attention from q / k / v
  ([batch, length, heads, head_dim]): 4 * B * H * Sq * Sk * D forward, 10 * ... for the
  backward (it recomputes the scores); every other fused instruction one FLOP per element
  it makes (a reduce: per element it reads). Custom calls XLA's own cost analysis counts
  as -1 are counted here.
- part: from the instruction's `op_name` (the Flax module path JAX records) and, for the
  code outside the model (the optimizer update, the metrics), from its Python source.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from t5lite.tools.hlo.kernel_bytes import ARRAY, array_bytes, dims, kernel_bytes  # noqa: F401

_HEADER = re.compile(r"^(ENTRY )?%(\S+) \(.*\{$")
_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
         "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"}
_CONTAINERS = {"while", "call", "conditional"}
_DONE = re.compile(r"-done$")
_ELEMENTWISE_FREE = {"parameter", "constant", "bitcast", "broadcast", "reshape", "transpose",
                     "get-tuple-element", "tuple", "slice", "iota", "copy", "concatenate",
                     "pad", "dynamic-slice", "dynamic-update-slice", "convert", "gather"}


def _shape(type_text: str) -> List[int]:
    found = ARRAY.search(type_text)
    return dims(found.group(2)) if found else []


@dataclasses.dataclass
class Instruction:
    name: str
    type: str
    opcode: str
    operands: List[str]
    attrs: str

    def attr(self, key: str) -> Optional[str]:
        found = re.search(rf"\b{key}=([^,\s]+)", self.attrs)
        return found.group(1) if found else None

    @property
    def op_name(self) -> str:
        found = re.search(r'op_name="([^"]*)"', self.attrs)
        return found.group(1) if found else ""

    @property
    def frame(self) -> Optional[int]:
        found = re.search(r"stack_frame_id=(\d+)", self.attrs)
        return int(found.group(1)) if found else None


def _close(text: str, start: int) -> int:
    """Index just past the bracket group opening at text[start]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    depth, i, quoted = 0, start, False
    while i < len(text):
        c = text[i]
        if c == '"' and text[i - 1] != "\\":
            quoted = not quoted
        elif not quoted and c in pairs:
            depth += 1
        elif not quoted and c in pairs.values():
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def parse_instruction(line: str) -> Optional[Instruction]:
    """One HLO instruction line, or None for anything else."""
    line = line.strip()
    if line.startswith("ROOT "):
        line = line[5:]
    if not line.startswith("%") or " = " not in line:
        return None
    name, rest = line[1:].split(" = ", 1)
    if rest.startswith("("):
        end = _close(rest, 0)
        type_text, rest = rest[:end], rest[end:].lstrip()
    else:
        type_text, _, rest = rest.partition(" ")
    paren = rest.find("(")
    if paren < 0:
        return None
    opcode = rest[:paren]
    end = _close(rest, paren)
    operands = re.findall(r"%([\w.\-]+)", rest[paren:end])
    return Instruction(name, type_text, opcode, operands, rest[end:])


@dataclasses.dataclass
class Module:
    """The computations of an HLO module and its stack-frame tables."""

    computations: Dict[str, List[Instruction]]
    entry: str
    frames: Dict[int, Tuple[int, int]]          # frame id -> (location id, parent id)
    locations: Dict[int, Tuple[str, str]]       # location id -> (file, function)

    def source(self, frame: Optional[int]) -> List[Tuple[str, str]]:
        """(file, function) from the innermost call outwards."""
        out, seen = [], set()
        while frame and frame in self.frames and frame not in seen:
            seen.add(frame)
            loc, parent = self.frames[frame]
            if loc in self.locations:
                out.append(self.locations[loc])
            frame = parent - 1  # parents are printed one past the frame they name
        return out


def parse_module(text: str) -> Module:
    """Parse `compiled.as_text()`."""
    computations: Dict[str, List[Instruction]] = {}
    entry, current = "", None
    tables: Dict[str, Dict[int, str]] = {"FileNames": {}, "FunctionNames": {},
                                         "FileLocations": {}, "StackFrames": {}}
    table = None
    for line in text.splitlines():
        if line in tables:
            table = line
            continue
        header = _HEADER.match(line)
        if header:
            table, current = None, header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
            continue
        if table:
            found = re.match(r"^(\d+) (.*)$", line)
            if found:
                tables[table][int(found.group(1))] = found.group(2)
            continue
        if current is not None:
            if line == "}":
                current = None
                continue
            inst = parse_instruction(line)
            if inst:
                computations[current].append(inst)
    names = {k: v.strip('"') for k, v in tables["FileNames"].items()}
    functions = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
    locations = {}
    for k, v in tables["FileLocations"].items():
        f, fn = re.search(r"file_name_id=(\d+)", v), re.search(r"function_name_id=(\d+)", v)
        locations[k] = (names.get(int(f.group(1)), "?") if f else "?",
                        functions.get(int(fn.group(1)), "?") if fn else "?")
    frames = {}
    for k, v in tables["StackFrames"].items():
        loc, parent = re.search(r"file_location_id=(\d+)", v), re.search(r"parent_frame_id=(\d+)", v)
        frames[k] = (int(loc.group(1)) if loc else 0, int(parent.group(1)) if parent else 0)
    return Module(computations, entry, frames, locations)


@dataclasses.dataclass
class Kernel:
    """One launch of the program (`count` times when in a loop body)."""

    name: str
    kind: str          # cublas gemm, triton gemm, cudnn attention, loop / reduction fusion, ...
    part: str          # the model part or step phase it belongs to (PARTS)
    phase: str         # forward | backward | update
    op_name: str
    flops: float       # for one launch
    bytes: int         # for one launch
    count: int = 1
    fp8: bool = False  # a matmul of FP8 operands (it runs at the FP8 peak)


PARTS = ("attention scores", "attention projections", "MLP", "layer norm",
         "embeddings and position bias", "logits and loss", "optimizer update",
         "norms and metrics", "other")


def _trip_count(inst: Instruction) -> int:
    found = re.search(r'"known_trip_count":\{"n":"(\d+)"', inst.attrs)
    return int(found.group(1)) if found else 1


def _called(inst: Instruction) -> List[str]:
    if inst.opcode == "while":
        return [inst.attr("body").lstrip("%")] if inst.attr("body") else []
    if inst.opcode == "call":
        return [inst.attr("to_apply").lstrip("%")] if inst.attr("to_apply") else []
    found = re.search(r"branch_computations=\{([^}]*)\}", inst.attrs)
    return [b.strip().lstrip("%") for b in found.group(1).split(",")] if found else []


def _dot_flops(dot: Instruction, types: Mapping[str, str]) -> float:
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", dot.attrs)
    lhs = _shape(types.get(dot.operands[0], "")) if dot.operands else []
    k = math.prod(lhs[int(d)] for d in dims(contracting.group(1))) if contracting and lhs else 1
    return 2.0 * math.prod(_shape(dot.type)) * k


def _fused_flops(module: Module, name: str) -> Tuple[float, bool]:
    """(FLOPs, has a matmul) of a fused computation."""
    instructions = module.computations.get(name, [])
    types = {i.name: i.type for i in instructions}
    flops, has_dot = 0.0, False
    for inst in instructions:
        if inst.opcode in ("dot", "convolution"):
            flops += _dot_flops(inst, types)
            has_dot = True
        elif inst.opcode == "fusion" and inst.attr("calls"):
            inner, dot = _fused_flops(module, inst.attr("calls").lstrip("%"))
            flops, has_dot = flops + inner, has_dot or dot
        elif inst.opcode == "reduce" and inst.operands:
            flops += math.prod(_shape(types.get(inst.operands[0], "")))
        elif inst.opcode not in _ELEMENTWISE_FREE:
            flops += math.prod(_shape(inst.type))
    return flops, has_dot


def _custom_call(inst: Instruction, types: Mapping[str, str]) -> Tuple[str, float]:
    target = inst.attr("custom_call_target") or ""
    target = target.strip('"')
    shapes = [_shape(types.get(o, "")) for o in inst.operands]
    if "cublas" in target and len(shapes) >= 2:
        contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', inst.attrs)
        dims = [int(d.strip('" ')) for d in contracting.group(1).split(",")
                if d.strip('" ')] if contracting else [len(shapes[0]) - 1]
        k = math.prod(shapes[0][d] for d in dims if d < len(shapes[0]))
        return "cublas gemm", 2.0 * math.prod(_shape(inst.type)) * k
    if "cudnn$fmha" in target and len(shapes) >= 3 and len(shapes[0]) == 4:
        (b, sq, h, d), sk = shapes[0], shapes[1][1]
        per_matmul = 2.0 * b * h * sq * sk * d
        return "cudnn attention", per_matmul * (5 if "Backward" in target else 2)
    return f"custom call {target}", 0.0


def _phase(op_name: str) -> str:
    if "transpose(jvp" in op_name:
        return "backward"
    return "forward" if "jvp(" in op_name else "update"


def _part(op_name: str, source: Sequence[Tuple[str, str]]) -> str:
    path = re.sub(r"layers_\d+", "layers_N", op_name)
    if "layer_norm" in path or "_norm/" in path:  # (pre_attention_layer_norm: a norm)
        return "layer norm"
    if "attention" in path:
        if "_project" in path or re.search(r"attention/(out|query|key|value|qkv|kv)/", path):
            return "attention projections"
        return "attention scores"
    if "/mlp/" in path:
        return "MLP"
    if "token_embedder" in path or "relpos_bias" in path or "position" in path:
        return "embeddings and position bias"
    files = " ".join(f"{f}:{fn}" for f, fn in source)
    if "masks.py" in files:
        return "attention scores"  # the attention mask
    if "logits" in path or "take_along_axis" in path or "losses.py" in files:
        return "logits and loss"
    if "tree_norm" in files and "clip" not in files:
        return "norms and metrics"  # the step's grad_norm / param_norm metrics
    if "/optax/" in files or "optimizers.py" in files or "adafactor.py" in files:
        return "optimizer update"
    return "other"


def program_kernels(text: str) -> List[Kernel]:
    """Every kernel the compiled program launches (see the module docstring)."""
    module = parse_module(text)
    kernels: List[Kernel] = []
    _walk(module, module.entry, 1, kernels)
    return kernels


def _walk(module: Module, name: str, times: int, out: List[Kernel]) -> None:
    instructions = module.computations.get(name, [])
    types = {i.name: i.type for i in instructions}
    for inst in instructions:
        if inst.opcode in _FREE or _DONE.search(inst.opcode):
            continue
        if inst.opcode in _CONTAINERS:
            inner = times * (_trip_count(inst) if inst.opcode == "while" else 1)
            for called in _called(inst):
                _walk(module, called, inner, out)
            continue
        fused = _fused(module, inst) if inst.opcode in ("fusion", "fusion-start") else []
        library = _library_call(module, inst)
        if inst.opcode == "custom-call":
            kind, flops = _custom_call(inst, types)
        elif library is not None:  # XLA's dynamic-slice fusion: cuBLAS on operand slices
            kind, flops = _custom_call(library, {i.name: i.type for i in fused})
        elif inst.opcode == "fusion":
            flops, has_dot = _fused_flops(module, (inst.attr("calls") or "").lstrip("%"))
            fusion_kind = inst.attr("kind") or ""
            kind = ("gemm fusion" if has_dot else {"kLoop": "loop fusion",
                    "kInput": "reduction fusion", "kOutput": "output fusion"}.get(
                        fusion_kind, "custom fusion"))
        else:
            kind, flops = inst.opcode, 0.0
        fp8 = kind in ("cublas gemm", "gemm fusion") and _fp8_operands(module, inst, types)
        moved = kernel_bytes(inst, [types.get(o, "") for o in inst.operands], fused)
        op_name, frame = _origin(module, inst)
        part = _fusion_part(module, inst) or _part(op_name, module.source(frame))
        out.append(Kernel(inst.name, kind, part, _phase(op_name), op_name, flops, moved,
                          times, fp8))


def _fused(module: Module, inst: Instruction) -> List[Instruction]:
    """The computation a fusion calls ([] for anything else)."""
    return module.computations.get((inst.attr("calls") or "").lstrip("%"), [])


def _library_call(module: Module, inst: Instruction) -> Optional[Instruction]:
    """The custom call a fusion wraps (kind=kCustom, a library call with its operands
    sliced), if any."""
    if inst.attr("kind") != "kCustom":
        return None
    return next((i for i in _fused(module, inst) if i.opcode == "custom-call"), None)


def _origin(module: Module, inst: Instruction) -> Tuple[str, Optional[int]]:
    """The op_name and stack frame of a kernel: its own, or (a fusion XLA made of several
    ops, with none of its own) the most common among the instructions it fuses."""
    if inst.op_name or inst.opcode != "fusion":
        return inst.op_name, inst.frame
    library = _library_call(module, inst)
    if library is not None and library.op_name:  # a GEMM on slices: the GEMM's
        return library.op_name, library.frame
    inner = [i for i in _fused(module, inst) if i.op_name]
    if not inner:
        return "", None
    name, _ = collections.Counter(i.op_name for i in inner).most_common(1)[0]
    return name, next(i.frame for i in inner if i.op_name == name)


def _fusion_part(module: Module, inst: Instruction) -> Optional[str]:
    """"optimizer update" for a fusion that updates parameters or moments, whatever else
    it fuses (XLA fuses AdamW's update with the norms the step logs, and names the kernel
    after the norm's reduce); None otherwise."""
    if inst.opcode != "fusion":
        return None
    for i in _fused(module, inst):
        if i.frame and _part(i.op_name, module.source(i.frame)) == "optimizer update":
            return "optimizer update"
    return None


def _fp8_operands(module: Module, inst: Instruction, types: Mapping[str, str]) -> bool:
    """Whether a GEMM multiplies FP8 arrays (a cuBLAS call's operands, or the dot's
    inside a GEMM fusion)."""
    if inst.opcode == "fusion":
        inner = _fused(module, inst)
        inner_types = {i.name: i.type for i in inner}
        dots = [i for i in inner if i.opcode == "dot"]
        return any(inner_types.get(o, "").startswith("f8") for d in dots for o in d.operands)
    return any(types.get(o, "").startswith("f8") for o in inst.operands[:2])


def totals(kernels: Iterable[Kernel]) -> Dict[str, float]:
    """FLOPs, bytes and launches of a whole program (loop bodies times their trips)."""
    ks = list(kernels)
    return {"flops": sum(k.flops * k.count for k in ks),
            "bytes": sum(k.bytes * k.count for k in ks),
            "launches": sum(k.count for k in ks)}


def op_path(op_name: str) -> str:
    """An op_name with the step's prefix and the layer numbers taken out, so that one
    op of every layer reads as one."""
    path = re.sub(r"layers_\d+", "layers_N", op_name)
    return re.sub(r"^jit\(step_fn\)/", "", path) or "(unnamed)"
