"""Where one train step's device time goes: the compiled, warmed-up step traced with
`jax.profiler`, and the trace read back without TensorFlow or tensorboard_plugin_profile
(`jax.profiler.ProfileData`, jaxlib's reader of `.xplane.pb` files, in jax 0.11 and 0.12:
planes, lines, events with their stats and durations) into a table of the most expensive
XLA ops and fusions: name, what it is (opcode, fusion kind, custom-call target), times
per step, total ms, % of the step's op time, mean us, and the model code it came from
(the HLO instruction's `op_name`, backward ops marked `bwd`). A category table (time by
opcode / fusion kind) follows. The trace itself stays in a temporary folder.

    python -m t5lite.tools.profile_summary --gin_file=configs/large_pile_pretrain.gin \
      --gin.BATCH_SIZE=32 "--gin.TASK_FEATURE_LENGTHS={'inputs': 512, 'targets': 128}" \
      --out=profile.txt --json_out=profile.json

What the trace holds: every XLA op that runs carries an `hlo_op` stat (and `hlo_module`).
On a GPU those are the kernels on the device plane (`/device:GPU:0`, one line per
stream; CUPTI's kernel times); on the CPU the thunks the host plane (`/host:CPU`) runs on
its XLA threads. Device planes win when they hold such events; otherwise (a CPU, or a GPU
whose CUPTI gave nothing) the host plane is read and the report says so. Only the step's
own module (`jit_step_fn`) counts. On the CPU independent thunks overlap on threads, so
op time can differ from wall time; on a GPU the gap between them is idle device time.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import json
import re
import shutil
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax

from t5lite.config import command, flags
from t5lite.tools import benchmarking, step_memory

TOP = 25
DERIVED_LINES = {"XLA Modules", "XLA Ops", "Steps", "Framework Ops", "TensorFlow Ops",
                 "Framework Name Scope", "TensorFlow Name Scope", "Source code", "XLA TraceMe"}
"""Lines a profiler may derive from the kernels' own (summaries of the same time)."""


@dataclasses.dataclass
class OpTime:
    """One XLA op (or fusion) over the traced steps."""

    name: str
    count: int = 0
    total_ns: float = 0.0
    what: str = ""
    where: str = ""


def _read_xspace(trace_dir: str):
    from jax.profiler import ProfileData  # jaxlib's reader of .xplane.pb files
    paths = sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))
    if not paths:
        raise RuntimeError(f"jax.profiler wrote no .xplane.pb under {trace_dir}")
    return ProfileData.from_file(paths[-1])


def op_events(profile, module: Optional[str] = None) -> Tuple[Dict[str, OpTime], str]:
    """{hlo op name: OpTime (count, total_ns)} of one device's XLA op events in the trace,
    and where they were read (module docstring). `module`: only events of that HLO module
    count (when the trace names modules and any event matches)."""
    by_plane: Dict[str, List[Tuple[str, str, int, float]]] = collections.defaultdict(list)
    with warnings.catch_warnings():  # jaxlib's stats type warns on first use
        warnings.simplefilter("ignore", DeprecationWarning)
        read = [(p.name, [[(dict(e.stats), e.duration_ns) for e in line.events]
                          for line in p.lines if line.name not in DERIVED_LINES])
                for p in profile.planes if p.name.startswith(("/device:", "/host:CPU"))]
    for name, lines in read:
        for line in lines:
            for stats, duration in line:
                if stats.get("hlo_op"):
                    by_plane[name].append((str(stats["hlo_op"]), str(stats.get("hlo_module", "")),
                                           int(stats.get("device_ordinal", 0)), float(duration)))
    device = sorted(p for p in by_plane if p.startswith("/device:"))
    plane = device[0] if device else next(iter(sorted(by_plane)), None)
    events = by_plane.get(plane, [])
    if module and any(e[1] == module for e in events):
        events = [e for e in events if e[1] == module]
    first = min((e[2] for e in events), default=0)  # one device of a host plane's several
    ops: Dict[str, OpTime] = {}
    for op, _, ordinal, duration in events:
        if ordinal == first:
            entry = ops.setdefault(op, OpTime(op))
            entry.count += 1
            entry.total_ns += duration
    return ops, f"{plane}, device {first}" if plane else "no XLA op events"


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")


def _opcode(rhs: str) -> str:
    """The opcode after an instruction's shape (a tuple shape is skipped as a whole)."""
    i = 0
    if rhs.startswith("("):
        depth = 0
        for i, ch in enumerate(rhs):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        i += 1
    match = re.match(r"\s*\S*?\s*([a-z][\w\-]*)\(", rhs[i:])
    return match.group(1) if match else "?"


def _where(op_name: str) -> str:
    """The model code an op came from: `fwd` / `bwd` (forward, backward: op names under
    `jvp(...)` / `transpose(...)`) or `step` (the optimizer update, metrics), then the
    module path and primitive, e.g. `bwd decoder/layers_3/mlp/wi_0/dot_general`. An op
    XLA combined from several (`step_fn/(a:b:...)`) says how many, and names the first."""
    path = op_name.split("/", 1)[1] if op_name.startswith("jit(") and "/" in op_name else op_name
    combined = path.startswith("(") and ":" in path
    if combined:
        path = path[1:].split(":")[0]
    parts = [p for p in path.split("/") if re.fullmatch(r"[A-Za-z_]\w*", p)]
    tag = "bwd" if "transpose(" in path else "fwd" if "jvp(" in path else "step"
    count = f"{op_name.count(':') + 1} combined, 1st " if combined else ""
    return f"{tag} {count}{'/'.join(parts[-5:])}".strip()


def hlo_ops(hlo_text: str) -> Dict[str, Tuple[str, str]]:
    """{instruction name: (what, where)} from a compiled module's HLO text: what =
    opcode plus fusion kind or custom-call target; where = `_where` of its op_name."""
    out = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match or line.lstrip().startswith(("HloModule", "ENTRY")):
            continue
        name, rhs = match.groups()
        what = _opcode(rhs)
        target = re.search(r'custom_call_target="([^"]+)"', rhs)
        kind = re.search(r"kind=(k\w+)", rhs)
        custom = re.search(r'"kind":"([^"]+)"', rhs)
        if target:
            what += f" {target.group(1)}"
        elif kind:
            what += f" {custom.group(1) if kind.group(1) == 'kCustom' and custom else kind.group(1)}"
        op_name = re.search(r'op_name="([^"]*)"', rhs)
        out[name] = (what, _where(op_name.group(1)) if op_name else "")
    return out


def summarize(ops: Dict[str, OpTime], hlo: Dict[str, Tuple[str, str]], steps: int,
              wall_s: Sequence[float], top: int = TOP) -> Dict[str, Any]:
    """The report: per-step rows of the `top` ops by time, the time by category, and the
    totals (op time against the traced steps' wall time)."""
    for op in ops.values():
        op.what, op.where = hlo.get(op.name, ("", ""))
    total = sum(o.total_ns for o in ops.values())
    ranked = sorted(ops.values(), key=lambda o: -o.total_ns)

    def row(name, count, total_ns, **extra):
        return dict(name=name, count=count / steps, total_ms=total_ns / steps / 1e6,
                    percent=100 * total_ns / total if total else 0.0,
                    mean_us=total_ns / max(count, 1) / 1e3, **extra)

    categories: Dict[str, List[float]] = collections.defaultdict(lambda: [0, 0.0])
    for o in ranked:
        category = categories[o.what or "?"]
        category[0] += o.count
        category[1] += o.total_ns
    return dict(steps=steps, wall_ms=1e3 * sum(wall_s) / max(len(wall_s), 1),
                op_ms=total / steps / 1e6, distinct_ops=len(ops),
                ops_per_step=sum(o.count for o in ops.values()) / steps,
                top=[row(o.name, o.count, o.total_ns, what=o.what, where=o.where)
                     for o in ranked[:top]],
                categories=[row(k, c, t) for k, (c, t) in
                            sorted(categories.items(), key=lambda kv: -kv[1][1])])


def _clip(text: str, width: int, keep_end: bool = False) -> str:
    if len(text) <= width:
        return text
    return "~" + text[-(width - 1):] if keep_end else text[:width - 1] + "~"


def format_report(report: Dict[str, Any], categories: int = 10) -> str:
    """The report as text: a heading with the totals, the top ops, the top categories."""
    top = report["top"]
    share = sum(r["percent"] for r in top)
    wall, op = report["wall_ms"], report["op_ms"]
    lines = [f"{report.get('device', '')}, batch {report.get('batch_size', '?')}: "
             f"{report['steps']} traced step(s), wall {wall:.1f} ms a step, XLA op time "
             f"{op:.1f} ms a step ({100 * op / wall if wall else 0:.0f}% of the wall time)"
             + ("" if report.get("compile_s") is None else
                f"; before it: step compile {report['compile_s']:.1f} s, init "
                f"{report['init_s']:.1f} s"),
             f"{report['ops_per_step']:.0f} op runs a step, {report['distinct_ops']} distinct "
             f"ops, read from {report.get('planes', '?')}; % = share of the op time (the top "
             f"{len(top)}: {share:.1f}%)",
             f"{'#':>2}  {'op':<30} {'what':<24} {'n/step':>6} {'ms/step':>8} {'%':>5} "
             f"{'mean us':>9}  where"]
    for i, r in enumerate(top, 1):
        lines.append(f"{i:>2}  {_clip(r['name'], 30):<30} {_clip(r['what'], 24):<24} "
                     f"{r['count']:>6.0f} {r['total_ms']:>8.3f} {r['percent']:>5.1f} "
                     f"{r['mean_us']:>9.1f}  {_clip(r['where'], 56, keep_end=True)}")
    lines += ["", f"    {'by kind':<55} {'n/step':>6} {'ms/step':>8} {'%':>5}"]
    for r in report["categories"][:categories]:
        lines.append(f"    {_clip(r['name'], 55):<55} {r['count']:>6.0f} "
                     f"{r['total_ms']:>8.3f} {r['percent']:>5.1f}")
    return "\n".join(lines)


def profile_run(run, *, warmup: int = 2, steps: int = 1, top: int = TOP,
                trace_dir: Optional[str] = None) -> Dict[str, Any]:
    """Compile `run`'s train step (as `python -m t5lite.bench` does), initialize, run
    `warmup` steps, trace `steps` more (each waited for) and summarize the trace."""
    batch = run.next_batch()
    t0 = time.perf_counter()
    step = step_memory.compile_train_step(run, batch)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state = jax.block_until_ready(run.step_fns.init(jax.random.PRNGKey(0)))
    init_s = time.perf_counter() - t0
    for _ in range(warmup + 1):
        state, metrics = step(state, batch)
        batch = run.next_batch()
    jax.block_until_ready((state, metrics, batch))
    hlo_text = step.as_text()
    module = re.match(r"HloModule ([^\s,]+)", hlo_text)
    own_dir = trace_dir is None
    trace_dir = tempfile.mkdtemp(prefix="t5lite-profile-") if own_dir else trace_dir
    wall = []
    try:
        jax.profiler.start_trace(trace_dir)
        try:
            for _ in range(steps):
                t0 = time.perf_counter()
                state, metrics = step(state, batch)
                jax.block_until_ready(metrics)
                wall.append(time.perf_counter() - t0)
        finally:
            jax.profiler.stop_trace()
        ops, planes = op_events(_read_xspace(trace_dir), module.group(1) if module else None)
    finally:
        if own_dir:
            shutil.rmtree(trace_dir, ignore_errors=True)
    del state
    report = summarize(ops, hlo_ops(hlo_text), steps, wall, top)
    report.update(planes=planes, compile_s=compile_s, init_s=init_s,
                  device=f"{jax.device_count()} x {jax.devices()[0].device_kind}",
                  jax_version=jax.__version__, batch_size=run.batch_size)
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    flags.add_gin_flags(parser)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before the trace")
    parser.add_argument("--steps", type=int, default=1, help="traced steps")
    parser.add_argument("--top", type=int, default=TOP, help="rows of the op table")
    parser.add_argument("--out", help="also write the table here")
    parser.add_argument("--json_out", help="write the report (every row) as JSON here")
    args = flags.parse_flags(parser, argv)
    the_run = benchmarking.build_bench_run(args.gin_file, args.gin_bindings,
                                           args.gin_search_paths)
    report = profile_run(the_run, warmup=args.warmup, steps=max(args.steps, 1), top=args.top)
    text = format_report(report)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    command.run_main(main)
