"""The one-page summary of a GPU session (scripts_gpu/gpu_session.sh), from what its
phases left in WORK_DIR so far: versions, phase verdicts and times, the proof's
verdicts, the grid table with start-up times, the init A/B and the profile's top ops.
Standard library only (it runs even where jax does not import).

    python3 scripts_gpu/session_summary.py WORK_DIR > OUT_DIR/summary.txt
"""
import json
import os
import re
import sys


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _json(path):
    text = _read(path)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def _header(work):
    info = dict(line.split("=", 1) for line in (_read(f"{work}/session.env") or "").split("\n")
                if "=" in line)
    lines = [f"t5lite GPU session: {info.get('device', '?')}; started {info.get('started', '?')}"
             f", {info.get('elapsed', '?')} s of the {info.get('deadline', '?')} s deadline"]
    versions = _read(f"{work}/logs/versions.log") or ""
    used = re.search(r"^imported: (.*)$", versions, re.M)
    te = re.search(r"^transformer_engine: (.*)$", versions, re.M)
    lines.append(f"versions: {used.group(1) if used else 'not read yet'}")
    lines.append(f"transformer_engine: {te.group(1) if te else 'not checked'}")
    lines.append(f"compilation cache: {info.get('cache', '?')}; now {info.get('cache_now', '?')}")
    phases = [line.split("\t") for line in (_read(f"{work}/phases.tsv") or "").splitlines()]
    lines.append("phases: " + ("; ".join(f"{p[0]} {p[1]}" for p in phases if len(p) > 1)
                               or "none finished"))
    return lines


def _switch_line(work, name, title):
    """One line of a switch check's report (proof/NAME.json), or what its log measured."""
    switches = _json(f"{work}/proof/{name}.json")
    if switches:
        cells = []
        for variant, row in switches.get("variants", {}).items():
            if "error" in row:
                cells.append(f"{variant} ERROR ({row['error'][:80]})")
            else:
                verdict = "" if "ok" not in row else (" ok" if row["ok"] else " TOO FAR")
                cells.append(f"{variant} {row['rel_l2']:.1e}{verdict}")
        return f"{title} (rel L2 of logits vs as configured): " + ", ".join(cells)
    # cut off or failed: the variants measured so far
    measured = re.findall(r"^measured (.*)$", _read(f"{work}/proof/{name}.log") or "", re.M)
    return (f"{title}: no report (cut off or failed: proof/{name}.log); measured: "
            + ("; ".join(measured) or "none"))


def _proof(work):
    lines = []
    if os.path.isdir(f"{work}/proof"):
        lines.append(_switch_line(work, "switches", "switches"))
        if os.path.exists(f"{work}/proof/switches_packed.log"):
            lines.append(_switch_line(work, "switches_packed", "packed switches"))
    proof = _read(f"{work}/proof/proof.txt")
    if proof:
        lines += [line for line in proof.splitlines() if line.startswith("resume:")]
    elif os.path.isdir(f"{work}/proof"):
        lines.append("resume: no verdict (cut off or failed: proof/*.log)")
    return lines


def _seconds(row, key):
    value = row.get(key)
    return "-" if value is None else f"{value:.0f}"


def _cache(row):
    """The configuration's compilation cache hits / misses (`h` / `m`): after a hit a
    compile time is a load's."""
    cache = row.get("compilation_cache")
    return "-" if not cache else f"{cache.get('hits', 0)}h {cache.get('misses', 0)}m"


def _grid(work):
    rows = []
    for part in ("grid_head", "grid_tail"):
        rows += _json(f"{work}/{part}/summary.json") or []
    if not rows:
        return []
    columns = ("run", "b/dev", "status", "step ms", "ahead ms", "pred ms", "seq/s", "TFLOP/s",
               "MFU",
               "peak GiB", "build s", "compile s", "init s", "cache")
    table = []
    for r in rows:
        ok = r.get("status") == "ok"
        mfu, ahead, peak = r.get("mfu"), r.get("async_step_s"), r.get("peak_memory_bytes")
        table.append((r["run"], str(r["per_device_batch"]), r["status"],
                      f"{1000 * r['median_step_s']:.1f}" if ok else "",
                      "-" if not ok or ahead is None else f"{1000 * ahead:.1f}",
                      "-" if not ok or r.get("predicted_step_s") is None
                      else f"{1000 * r['predicted_step_s']:.1f}",
                      f"{r['seq_per_s'] / (r.get('device_count') or 1):.1f}" if ok else "",
                      "-" if not ok or r.get("tflops_per_device") is None
                      else f"{r['tflops_per_device']:.1f}",
                      "-" if not ok or mfu is None else f"{100 * mfu:.1f}%",
                      "-" if peak is None else f"{peak / 2**30:.1f}",
                      _seconds(r, "build_s"), _seconds(r, "compile_s"), _seconds(r, "init_s"),
                      _cache(r)))
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(columns)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    for r, t in zip(rows, table):
        line = "  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip()
        if r.get("status") not in ("ok", None) and r.get("message"):
            line += f"  {r['message'][:90]}"
        out.append(line)
    first = next((r for r in rows if r.get("status") == "ok"), None)
    head = "grid" + ("" if first is None else
                     f" ({first.get('device_count')} x {first.get('device_kind')}; pred: the step-time "
                     f"predictor on the program this GPU compiled; seconds: "
                     f"build the run, compile the step, init = compile + run; cache: "
                     f"hits, misses):")
    return [head] + out


def _init_ab(work):
    cells, what = [], ""
    for name in ("off", "on"):
        r = _json(f"{work}/init_ab/{name}.json")
        if r:
            recipe = re.search(r"--gin_file=(\S+)", r.get("command", ""))
            what = f" ({recipe.group(1) if recipe else '?'}, batch {r.get('batch_size')})"
            cells.append(f"{name}: init compile {r['init_compile_s']:.1f} s, run "
                         f"{r['init_run_s']:.1f} s (step compile {r['step_compile_s']:.1f} s)")
        elif os.path.isdir(f"{work}/init_ab"):
            cells.append(f"{name}: no result")
    return [f"init A/B{what}, jax_threefry_gpu_kernel_lowering:"] + [f"  {c}" for c in cells] \
        if cells else []


def _profile(work, kinds=8):
    text = _read(f"{work}/profile/profile.txt")
    if not text:
        return ["profile: no table (not run, cut off or failed: logs/profile.log)"] \
            if os.path.isdir(f"{work}/profile") else []
    lines = text.rstrip().splitlines()
    if "" in lines:  # the op table, then the first `kinds` rows of the kind table
        cut = lines.index("")
        lines = lines[:cut + 2 + kinds]
    return ["profile of one step:"] + lines


def summary(work):
    parts = [_header(work), _proof(work), _grid(work), _init_ab(work), _profile(work)]
    return "\n\n".join("\n".join(p) for p in parts if p) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit(f"usage: {sys.argv[0]} WORK_DIR")
    sys.stdout.write(summary(sys.argv[1]))
