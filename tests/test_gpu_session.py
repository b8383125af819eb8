"""scripts_gpu/gpu_session.sh's frame, cheaply (scripts_gpu/image_smoke.sh runs the
whole session on the CPU in CI): its usage, phases skipped when the deadline leaves them
too little time, what OUT_DIR holds (at most 8 files, no folders), the priority grid's
order, and the one-page summary built from a session cut off halfway."""
import json
import os
import subprocess
import sys

import train_helpers as th
from t5lite.tools import bench_grid

SCRIPT = th.REPO / "scripts_gpu" / "gpu_session.sh"


def _env(tmp_path, **extra):
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               WORK_DIR=str(tmp_path / "work"), CACHE_DIR=str(tmp_path / "cache"))
    env.update(extra)
    return env


def test_usage_and_phases_the_deadline_leaves_no_time_for(tmp_path):
    usage = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert usage.returncode == 2 and "gpu_session.sh OUT_DIR" in usage.stderr
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True,
                          timeout=120, env=_env(tmp_path, DEADLINE_S="20",
                                                PHASES="profile init_ab grid_tail"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("profile", "init_ab", "grid_tail"):
        assert f"== {name} skipped:" in proc.stdout
    names = sorted(os.listdir(out))
    assert names == ["session.log", "session.tar.gz", "summary.txt"]
    summary = (out / "summary.txt").read_text()
    assert "phases: profile skipped" in summary and "of the 20 s deadline" in summary
    assert summary in proc.stdout


def test_priority_grid_order():
    grid = bench_grid.load_grid(str(th.REPO / "scripts_gpu" / "grids" / "priority.json"))
    assert [(r.name, r.per_device_batches) for r in grid.runs] == [
        ("large_bf16", (32, 64)), ("large_bf16_2026-11-26", (32,)),
        ("large_bf16_einsum+bf16_logits", (32,)), ("large_fp8", (32,)), ("small_bf16", (128,)),
        ("small_bf16_2026-11-26", (128,)), ("base_bf16", (64,)), ("xl_bf16", (8,))]
    assert all(r.bindings[0] == "TASK_FEATURE_LENGTHS = {'inputs': 512, 'targets': 128}"
               for r in grid.runs)
    # the first measured settings, pinned (the recipes' defaults have changed since)
    old = {"ATTENTION_IMPL = 'xla'", "ATTENTION_MASK = 'dense'", "FUSE_QKV = False",
           "ATTENTION_LOGITS_DTYPE = 'float32'"}
    assert old <= set(grid.runs[1].bindings) and old <= set(grid.runs[5].bindings)
    assert "ATTENTION_LOGITS_DTYPE = 'bfloat16'" in grid.runs[2].bindings
    assert (grid.steps, grid.warmup) == (10, 2)


def test_summary_of_a_session_cut_off_halfway(tmp_path):
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "proof").mkdir()
    (work / "grid_head").mkdir()
    (work / "session.env").write_text("device=NVIDIA H100 80GB HBM3, 81559 MiB\n"
                                      "deadline=450\nelapsed=300\n")
    (work / "logs" / "versions.log").write_text(
        "imported: jax 0.11.2, jaxlib 0.11.2, flax 0.12.12\n"
        "transformer_engine: does not import (ModuleNotFoundError)\n")
    (work / "phases.tsv").write_text("versions\tok, 5 s\nproof\tcut off at 150 s, 150 s\n"
                                     "grid_head\tok, 140 s\n")
    (work / "proof" / "switches.log").write_text(
        "measured float32: rel L2 3.10e-03, max |d| 0.1, argmax 0.999, loss 10.4\n")
    ok = {"run": "large_bf16", "per_device_batch": 32, "status": "ok", "median_step_s": 0.2577,
          "async_step_s": 0.25, "predicted_step_s": 0.2697, "seq_per_s": 124.2,
          "tflops_per_device": 186.5, "mfu": 0.188,
          "peak_memory_bytes": 58.6 * 2**30, "device_count": 1, "device_kind": "NVIDIA H100",
          "build_s": 4.4, "compile_s": 50.7, "init_s": 12.0,
          "compilation_cache": {"hits": 0, "misses": 2}}
    skipped = {"run": "large_bf16", "per_device_batch": 64, "status": "skipped",
               "message": "60 s of the time budget left"}
    (work / "grid_head" / "summary.json").write_text(json.dumps([ok, skipped]))
    text = subprocess.run([sys.executable, "scripts_gpu/session_summary.py", str(work)],
                          cwd=th.REPO, capture_output=True, text=True, check=True).stdout
    lines = text.splitlines()
    assert lines[0].startswith("t5lite GPU session: NVIDIA H100 80GB HBM3")
    assert "300 s of the 450 s deadline" in lines[0]
    assert lines[1] == "versions: jax 0.11.2, jaxlib 0.11.2, flax 0.12.12"
    assert "phases: versions ok, 5 s; proof cut off at 150 s, 150 s; grid_head ok" in text
    assert "measured: float32: rel L2 3.10e-03" in text and "resume: no verdict" in text
    row = next(line for line in lines if line.startswith("large_bf16") and " ok " in line)
    assert row.split() == ["large_bf16", "32", "ok", "257.7", "250.0", "269.7", "124.2", "186.5",
                           "18.8%", "58.6", "4", "51", "12", "0h", "2m"]
    assert any(line.split()[:3] == ["large_bf16", "64", "skipped"] and
               line.endswith("60 s of the time budget left") for line in lines)
    assert "profile" not in text and "init A/B" not in text
