"""Each test's CPU seconds, its own and its subprocesses': the suite's measure of cost.

On the 2-core machines the suite runs on, every core is busy for the whole run (three
xdist workers, tests/conftest.py), so a test's wall time says more about what ran beside
it than about the test; its CPU time is what the run pays for it. A subprocess's CPU
counts once it has been waited for (every helper in train_helpers.py waits), and
includes the processes it waited for in turn (a launcher's python runs); a command forked
from a warm interpreter (warm_python.py) counts when it ends, as its interpreter reports
it. A warm interpreter's own start-up counts where it is reaped: in a test when it makes
room for another, else at the worker's exit, after the last test (not in any line).

    python -m pytest -n auto --dist loadfile tests --cpu-profile=DIR   # DIR/cpu_<worker>.jsonl
    python tests/cpu_profile.py DIR [--top N]                          # files and tests, costliest first

A line a test: {"id", "self" (the worker's CPU s, setup and teardown included: a module
fixture counts to the first test that uses it), "children" (its subprocesses' CPU s),
"procs" (subprocesses started), "wall" (s), and what jax did in the test process (from
jax.monitoring's events, counted from the end of the first test that imports jax):
"compiles" (XLA compilations, a persistent-cache hit included), "compile_s" (their
seconds), "cache_hits" (those the compilation cache answered), "trace_s" (tracing to
jaxprs, nested traces counted in each enclosing one), "programs" ({jitted function's
name: [compilations, seconds]})}. Most of the
suite's in-process CPU is XLA compilation, one program at a time; a test's "compiles"
says how many it asked for, its "compile_s" what they cost.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import resource
import subprocess
import sys
import time
from typing import Dict, List

import pytest

# jax.monitoring's names for what a test line counts
JAX_EVENTS = {"compile_s": "/jax/core/compile/backend_compile_duration",
              "trace_s": "/jax/core/compile/jaxpr_trace_duration"}
CACHE_HIT = "/jax/compilation_cache/cache_hits"


class JaxCounts:
    """Running totals of jax's compile events in this process, once jax is imported."""

    def __init__(self):
        self.totals = collections.Counter()
        self.compiled = collections.Counter()  # program name -> compilations
        self.compiled_s = collections.Counter()  # program name -> their seconds
        self.listening = False

    def _on_duration(self, event, duration, fun_name="?", **_):
        for name, watched in JAX_EVENTS.items():
            if event == watched:
                self.totals[name] += duration
                if name == "compile_s":
                    self.totals["compiles"] += 1
                    self.compiled[fun_name] += 1
                    self.compiled_s[fun_name] += duration

    def programs_since(self, compiled: collections.Counter, compiled_s: collections.Counter
                       ) -> Dict[str, List]:
        """{program name: [compilations, seconds]} since copies of `self.compiled` and
        `self.compiled_s` were taken."""
        return {name: [n - compiled[name], round(self.compiled_s[name] - compiled_s[name], 3)]
                for name, n in self.compiled.items() if n > compiled[name]}

    def _on_event(self, event, **_):
        if event == CACHE_HIT:
            self.totals["cache_hits"] += 1

    def snapshot(self) -> collections.Counter:
        """The totals so far; starts listening when jax has been imported (not before:
        importing it here would read its settings before conftest sets them)."""
        if not self.listening and "jax" in sys.modules:
            import jax.monitoring
            jax.monitoring.register_event_duration_secs_listener(self._on_duration)
            jax.monitoring.register_event_listener(self._on_event)
            self.listening = True
        return collections.Counter(self.totals)

    def stop(self) -> None:
        if self.listening:
            from jax._src import monitoring
            monitoring.unregister_event_duration_listener(self._on_duration)
            monitoring.unregister_event_listener(self._on_event)
            self.listening = False


class CpuProfile:
    """The pytest plugin: appends a line a test to `directory`/cpu_<worker>.jsonl."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.path = os.path.join(directory, f"cpu_{worker}.jsonl")
        self.started = [0]
        self.jax = JaxCounts()
        self._original = original = subprocess.Popen.__init__
        started = self.started

        def counted(popen, *args, **kwargs):
            started[0] += 1
            return original(popen, *args, **kwargs)
        subprocess.Popen.__init__ = counted

    def restore(self) -> None:
        """Stop counting subprocesses (a whole run never needs to)."""
        subprocess.Popen.__init__ = self._original
        self.jax.stop()

    @staticmethod
    def _cpu():
        """(own CPU s, subprocesses' CPU s): the latter those waited for, plus the children
        of warm interpreters (tests/warm_python.py), which this process does not wait for."""
        import warm_python
        own, children = (resource.getrusage(who) for who in
                         (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return (own.ru_utime + own.ru_stime,
                children.ru_utime + children.ru_stime + warm_python.STATS["cpu"])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        import warm_python
        (own, children), wall = self._cpu(), time.monotonic()
        procs = self.started[0] + warm_python.STATS["started"]
        jax_before = self.jax.snapshot()
        programs_before = (collections.Counter(self.jax.compiled),
                           collections.Counter(self.jax.compiled_s))
        yield
        own_after, children_after = self._cpu()
        jax_after = self.jax.snapshot()
        line = {"id": item.nodeid, "self": round(own_after - own, 2),
                "children": round(children_after - children, 2),
                "procs": self.started[0] + warm_python.STATS["started"] - procs,
                "wall": round(time.monotonic() - wall, 2)}
        for name in ("compiles", "compile_s", "cache_hits", "trace_s"):
            line[name] = round(jax_after[name] - jax_before[name], 3)
        line["programs"] = self.jax.programs_since(*programs_before)
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def read(directory: str) -> List[Dict]:
    return [json.loads(line) for path in sorted(glob.glob(os.path.join(directory, "cpu_*.jsonl")))
            for line in open(path)]


def summary(rows: List[Dict], top: int = 30) -> str:
    cpu = lambda r: r["self"] + r["children"]  # noqa: E731
    files = collections.defaultdict(collections.Counter)
    for r in rows:
        f = files[r["id"].split("::")[0]]
        for name in ("self", "children", "procs", "compiles", "compile_s"):
            f[name] += r.get(name, 0)  # lines written before jax's counts had none
        f["tests"] += 1
    total = collections.Counter()
    for f in files.values():
        total.update(f)
    out = [f"{len(rows)} tests: {total['self'] + total['children']:.0f} CPU s "
           f"({total['self']:.0f} in the test processes, {total['children']:.0f} in "
           f"{total['procs']} subprocesses); in the test processes {total['compiles']} XLA "
           f"compilations took {total['compile_s']:.0f} s", "",
           "CPU s   own  subproc  procs tests compiles compile_s  file"]
    for name, f in sorted(files.items(), key=lambda x: -x[1]["self"] - x[1]["children"]):
        out.append(f"{f['self'] + f['children']:5.0f} {f['self']:5.0f} {f['children']:8.0f} "
                   f"{f['procs']:6d} {f['tests']:5d} {f['compiles']:8d} {f['compile_s']:9.0f}  "
                   f"{name}")
    out += ["", "CPU s procs compiles compile_s  test"]
    out += [f"{cpu(r):5.1f} {r['procs']:5d} {r.get('compiles', 0):8d} "
            f"{r.get('compile_s', 0):9.1f}  {r['id']}"
            for r in sorted(rows, key=cpu, reverse=True)[:top]]
    programs = collections.defaultdict(lambda: [0, 0.0, set()])
    for r in rows:
        for name, (n, seconds) in r.get("programs", {}).items():
            p = programs[name]
            p[0], p[1] = p[0] + n, p[1] + seconds
            p[2].add(r["id"].split("::")[0])
    if programs:
        out += ["", "compile_s compiles files  program (compiled in the test processes)"]
        out += [f"{s:9.1f} {n:8d} {len(f):5d}  {name}" for name, (n, s, f) in
                sorted(programs.items(), key=lambda x: -x[1][1])[:top]]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Summarize a --cpu-profile directory: CPU "
                                     "seconds by test file and the costliest tests.")
    parser.add_argument("directory")
    parser.add_argument("--top", type=int, default=30, help="tests to list (default 30)")
    args = parser.parse_args(argv)
    rows = read(args.directory)
    if not rows:
        print(f"error: no cpu_*.jsonl lines in {args.directory}; run pytest with "
              f"--cpu-profile={args.directory} first")
        return 1
    print(summary(rows, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
