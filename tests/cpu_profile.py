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
"procs" (subprocesses started), "wall" (s)}.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import resource
import subprocess
import time
from typing import Dict, List

import pytest


class CpuProfile:
    """The pytest plugin: appends a line a test to `directory`/cpu_<worker>.jsonl."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.path = os.path.join(directory, f"cpu_{worker}.jsonl")
        self.started = [0]
        self._original = original = subprocess.Popen.__init__
        started = self.started

        def counted(popen, *args, **kwargs):
            started[0] += 1
            return original(popen, *args, **kwargs)
        subprocess.Popen.__init__ = counted

    def restore(self) -> None:
        """Stop counting subprocesses (a whole run never needs to)."""
        subprocess.Popen.__init__ = self._original

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
        yield
        own_after, children_after = self._cpu()
        line = {"id": item.nodeid, "self": round(own_after - own, 2),
                "children": round(children_after - children, 2),
                "procs": self.started[0] + warm_python.STATS["started"] - procs,
                "wall": round(time.monotonic() - wall, 2)}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def read(directory: str) -> List[Dict]:
    return [json.loads(line) for path in sorted(glob.glob(os.path.join(directory, "cpu_*.jsonl")))
            for line in open(path)]


def summary(rows: List[Dict], top: int = 30) -> str:
    cpu = lambda r: r["self"] + r["children"]  # noqa: E731
    files = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
    for r in rows:
        f = files[r["id"].split("::")[0]]
        f[0] += r["self"]
        f[1] += r["children"]
        f[2] += r["procs"]
        f[3] += 1
    total_self, total_children = sum(r["self"] for r in rows), sum(r["children"] for r in rows)
    out = [f"{len(rows)} tests: {total_self + total_children:.0f} CPU s ({total_self:.0f} in "
           f"the test processes, {total_children:.0f} in {sum(r['procs'] for r in rows)} "
           "subprocesses)", "", "CPU s   own  subproc  procs tests  file"]
    for name, (own, children, procs, n) in sorted(files.items(), key=lambda x: -x[1][0] - x[1][1]):
        out.append(f"{own + children:5.0f} {own:5.0f} {children:8.0f} {procs:6d} {n:5d}  {name}")
    out += ["", "CPU s procs  test"]
    out += [f"{cpu(r):5.1f} {r['procs']:5d}  {r['id']}"
            for r in sorted(rows, key=cpu, reverse=True)[:top]]
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
