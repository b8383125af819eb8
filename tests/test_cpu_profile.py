"""tests/cpu_profile.py, the suite's per-test CPU measure (--cpu-profile=DIR): a test's
own CPU seconds, its subprocesses' and their count, and the summary that ranks them."""
from __future__ import annotations

import subprocess
import sys
import time
import types

import pytest

import cpu_profile

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass"


def _burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_a_tests_own_cpu_and_its_subprocesses_are_counted_apart(tmp_path):
    profile = cpu_profile.CpuProfile(str(tmp_path))
    try:
        for name, own, children in (("test_a.py::test_spawns", 0.05, 0.6),
                                    ("test_b.py::test_computes", 0.4, 0)):
            hook = profile.pytest_runtest_protocol(types.SimpleNamespace(nodeid=name), None)
            next(hook)  # the hook wrapper, as pytest drives it around a test
            _burn(own)
            if children:
                subprocess.run([sys.executable, "-c", BURN.format(s=children)], check=True)
            with pytest.raises(StopIteration):
                hook.send(None)
    finally:
        profile.restore()
    spawns, computes = cpu_profile.read(str(tmp_path))
    assert spawns["id"] == "test_a.py::test_spawns" and spawns["procs"] == 1
    assert spawns["children"] >= 0.6 and spawns["self"] < 0.4, spawns
    assert computes["procs"] == 0 and computes["children"] == 0 and computes["self"] >= 0.4
    text = cpu_profile.summary([spawns, computes])
    lines = text.splitlines()
    assert lines[0].startswith("2 tests: ") and "in 1 subprocesses" in lines[0]
    files = [l.split()[-1] for l in lines[3:5]]
    assert files == ["test_a.py", "test_b.py"]  # costliest first


def _scaled():
    def scaled(x):  # a new function object each call, the same program
        return x * 7.0 - 1.0
    return scaled


def test_a_tests_xla_compilations_and_cache_hits_are_counted(tmp_path):
    """A test that compiles a program, then the same program again through a new function
    (jax's in-memory cache misses, the persistent one answers when the run has one):
    two compilations, their seconds, and one cache hit."""
    import jax
    import jax.numpy as jnp
    profile = cpu_profile.CpuProfile(str(tmp_path))
    x = jnp.ones((3, 5 + time.time_ns() % 89))  # a shape no other test compiled for
    try:
        hook = profile.pytest_runtest_protocol(types.SimpleNamespace(nodeid="t.py::c"), None)
        next(hook)
        jax.jit(_scaled())(x).block_until_ready()
        jax.jit(_scaled())(x).block_until_ready()
        with pytest.raises(StopIteration):
            hook.send(None)
    finally:
        profile.restore()
    (line,) = cpu_profile.read(str(tmp_path))
    assert line["compiles"] == 2 and line["compile_s"] > 0 and line["trace_s"] > 0, line
    cached = bool(jax.config.jax_compilation_cache_dir)  # the suite's own, tests/conftest.py
    assert line["cache_hits"] == (1 if cached else 0), line
    assert list(line["programs"]) == ["jit(scaled)"] and line["programs"]["jit(scaled)"][0] == 2, line
    assert line["programs"]["jit(scaled)"][1] == pytest.approx(line["compile_s"], abs=1e-2), line
    text = cpu_profile.summary([line])
    assert "2 XLA compilations" in text.splitlines()[0]
    assert text.splitlines()[-1].split() == [f"{line['compile_s']:.1f}", "2", "1", "jit(scaled)"]


def test_the_summary_command_reads_a_directory_and_refuses_an_empty_one(tmp_path, capsys):
    assert cpu_profile.main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith(f"error: no cpu_*.jsonl lines in {tmp_path}")
    (tmp_path / "cpu_gw0.jsonl").write_text(
        '{"id": "t.py::x", "self": 1.5, "children": 2.0, "procs": 3, "wall": 4.0}\n')
    assert cpu_profile.main([str(tmp_path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 tests: 4 CPU s" in out and "  3.5     3        0       0.0  t.py::x" in out
