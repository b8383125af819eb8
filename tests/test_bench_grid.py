"""The benchmark grid (`python -m t5lite.bench --grid`, `scripts_gpu/bench_grid.sh`):
grid files expand as documented, a batch sweep stops at the first size that does not
fit, one failing configuration does not end the grid, results are on disk as soon as
each configuration is measured, and a real grid runs on CPU without TensorFlow."""
import json

import pytest

import train_helpers as th
from t5lite.tools import bench_grid
from t5lite.errors import ConfigError
from t5lite.tools.benchmark import StepDoesNotFit


def _grid_file(tmp_path, spec):
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_grid_entries_expand_into_precisions_and_ablations(tmp_path):
    grid = bench_grid.load_grid(_grid_file(tmp_path, {
        "steps": 5, "warmup": 1,
        "common": {"gin_files": ["run.gin"], "bindings": ["A = 1"]},
        "runs": [{"name": "large", "gin_files": ["large.gin"], "bindings": ["B = 2"],
                  "per_device_batch": [16, 32], "precisions": ["bf16", "fp8", "te_fp8"],
                  "ablate": {"cudnn": ["ATTENTION_IMPL = 'cudnn'"]}},
                 {"name": "small", "per_device_batch": 8}]}))
    assert (grid.steps, grid.warmup) == (5, 1)
    by_name = {r.name: r for r in grid.runs}
    assert list(by_name) == ["large_bf16", "large_bf16+cudnn", "large_fp8", "large_fp8+cudnn",
                             "large_te_fp8", "large_te_fp8+cudnn", "small"]
    assert by_name["large_fp8+cudnn"].bindings == ("A = 1", "B = 2", "FP8 = True",
                                                   "FP8_BACKEND = 'native'",
                                                   "ATTENTION_IMPL = 'cudnn'")
    assert by_name["large_te_fp8"].bindings[2:] == ("FP8 = True", "FP8_BACKEND = 'te'")
    assert by_name["large_bf16"].bindings == ("A = 1", "B = 2", "FP8 = False")
    assert by_name["large_bf16"].gin_files == ("large.gin", "run.gin")
    assert by_name["large_bf16"].per_device_batches == (16, 32)
    assert by_name["small"].per_device_batches == (8,)
    assert by_name["small"].bindings == ("A = 1",)
    assert [r.name for r in bench_grid.select(grid.runs, ["large_fp8*"])] == [
        "large_fp8", "large_fp8+cudnn"]


@pytest.mark.parametrize("spec,words", [
    ({"runs": [{"name": "a", "per_device_batch": [32, 16]}]}, ["ascending"]),
    ({"runs": [{"name": "a", "per_device_batch": 0}]}, ["positive"]),
    ({"runs": [{"name": "a", "per_device_batch": 1, "batch": 2}]}, ["unknown", "batch"]),
    ({"runs": [{"name": "a", "per_device_batch": 1}] * 2}, ["unique", "a"]),
    ({"runs": [{"name": "a", "per_device_batch": 1, "precisions": ["fp16"]}]}, ["fp16"]),
    ({"run": []}, ["runs"]),
])
def test_bad_grid_files_are_one_line_errors(tmp_path, spec, words):
    path = _grid_file(tmp_path, spec)
    with pytest.raises(ConfigError) as e:
        bench_grid.load_grid(path)
    message = str(e.value)
    assert "\n" not in message and path in message
    for word in words:
        assert word in message, message


def test_unreadable_grid_file(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        bench_grid.load_grid(str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="cannot read"):
        bench_grid.load_grid(str(tmp_path / "missing.json"))


def _fake_result(batch):
    return {"median_step_s": 0.1, "seq_per_s": 10.0 * batch, "tflops_per_device": 1.0,
            "mfu": 0.5, "peak_memory_bytes": batch * 2**30, "compile_s": 3.0,
            "async_step_s": 0.09, "predicted_step_s": 0.095, "build_s": 2.0, "init_s": 1.0, "device_count": 1, "device_kind": "fake", "jax_version": "0",
            "compiled_memory": {"peak_bytes": batch * 2**30}, "step_durations_s": [0.1]}


def test_sweep_stops_at_the_first_batch_that_does_not_fit_and_the_grid_goes_on(tmp_path):
    grid = bench_grid.Grid((
        bench_grid.GridRun("big", ("m.gin",), (), (8, 16, 32, 64)),
        bench_grid.GridRun("broken", ("m.gin",), (), (8, 16)),
        bench_grid.GridRun("planned", ("m.gin",), (), (8, 16)),
        bench_grid.GridRun("after", ("m.gin",), (), (8,)),
    ), steps=1, warmup=0)
    calls, out = [], tmp_path / "out"

    def measure(run, batch):
        # every earlier measurement is already on disk when the next one starts
        for name, b in calls:
            assert (out / f"{name}_b{b}.json").exists()
        calls.append((run.name, batch))
        if run.name == "big" and batch >= 32:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to "
                               "allocate 123 bytes.\nmore lines")
        if run.name == "broken":
            raise ValueError("a bug\nwith a long story")
        if run.name == "planned" and batch == 16:
            raise StepDoesNotFit("the compiled step needs 99 GiB")
        return _fake_result(batch)

    rows = bench_grid.run_grid(grid, str(out), measure, log=lambda _: None)
    assert calls == [("big", 8), ("big", 16), ("big", 32), ("broken", 8), ("planned", 8),
                     ("planned", 16), ("after", 8)]
    assert [(r["run"], r["per_device_batch"], r["status"]) for r in rows] == [
        ("big", 8, "ok"), ("big", 16, "ok"), ("big", 32, "oom"), ("broken", 8, "error"),
        ("planned", 8, "ok"), ("planned", 16, "oom"), ("after", 8, "ok")]
    assert rows[3]["message"] == "ValueError: a bug"
    saved = json.loads((out / "big_b32.json").read_text())
    assert saved["status"] == "oom" and "RESOURCE_EXHAUSTED" in saved["message"]
    assert json.loads((out / "big_b16.json").read_text())["seq_per_s"] == 160.0
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary) == 7 and "step_durations_s" not in summary[0]
    table = (out / "results.md").read_text().splitlines()
    assert table[0] == "1 x fake, jax 0"
    assert len([l for l in table if l.startswith("| big ")]) == 3
    assert ("| big | 16 | ok | 100.0 | 90.0 | 95.0 | 160.0 | 1.0 | 50.0% | 16.0 | 16.0 | "
            "build 2 s, compile 3 s, init 1 s |") in table[5]


def test_time_budget_skips_what_would_not_finish(tmp_path):
    grid = bench_grid.Grid((bench_grid.GridRun("a", (), (), (1, 2)),), 1, 0)
    rows = bench_grid.run_grid(grid, str(tmp_path), lambda r, b: _fake_result(b),
                               time_budget_s=0.0, log=lambda _: None)
    assert [r["status"] for r in rows] == ["skipped", "skipped"]


def test_reproducing_command_names_every_binding():
    run = bench_grid.GridRun("x", ("configs/large_pile_pretrain.gin",),
                             ("TASK_FEATURE_LENGTHS = {'inputs': 512, 'targets': 128}",
                              "FP8 = True"), (64,))
    cmd = bench_grid.command_for(run, 512)
    assert cmd.startswith("python -m t5lite.bench --gin_file=configs/large_pile_pretrain.gin")
    assert "'--gin_bindings=FP8 = True'" in cmd and cmd.endswith("--gin.BATCH_SIZE=512")


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_cpu_smoke_grid_runs_end_to_end_without_tensorflow(tmp_path):
    """The shipped CPU grid through the real command: every configuration measured and
    written, each JSON traceable, and nothing of TensorFlow / SeqIO imported. Its runs,
    precisions, ablation and batches as shipped; its tiny models cut further by bindings
    added to its common ones (a vocabulary of 512, one layer a stack: the grid's machinery
    is under test, not the models, which run as shipped in many other tests), which
    takes a quarter off the compiles."""
    out = tmp_path / "grid"
    spec = json.loads((th.REPO / "scripts_gpu" / "grids" / "cpu_smoke.json").read_text())
    spec["common"]["bindings"] += [
        "T5Config.vocab_size = 512", "T5Config.num_encoder_layers = 1",
        "T5Config.num_decoder_layers = 1", "DecoderConfig.vocab_size = 512",
        "DecoderConfig.num_layers = 1"]
    grid = _grid_file(tmp_path, spec)
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['bench', '--grid={grid}', '--out_dir={out}']\n"
        "try:\n"
        "    runpy.run_module('t5lite.bench', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n")
    # on one device: the grid's machinery is what this tests, and one device compiles each
    # configuration's programs in about half the time of the tests' eight
    proc, imported = th.imports_after(code, cwd=tmp_path, devices=1)
    assert imported == []
    names = sorted(p.name for p in out.glob("*_b*.json"))
    assert names == ["llama_tiny_b1.json", "t5_tiny_bf16+fused_qkv_b1.json",
                     "t5_tiny_bf16+fused_qkv_b2.json", "t5_tiny_bf16_b1.json",
                     "t5_tiny_bf16_b2.json"]
    for name in names:
        result = json.loads((out / name).read_text())
        assert result["status"] == "ok", result
        assert len(result["step_durations_s"]) == 2
        assert result["batch_size"] == result["per_device_batch"] * result["device_count"]
        assert result["compiled_memory"]["peak_bytes"] > 0
        assert result["command"].startswith("python -m t5lite.bench --gin_file=")
    fused = json.loads((out / "t5_tiny_bf16+fused_qkv_b2.json").read_text())
    assert "FUSE_QKV = True" in fused["gin_config"]
    assert "FP8 = False" in fused["bindings"]
    assert "5 of 5 configurations measured" in proc.stdout
    assert (out / "results.md").read_text().count("| ok |") == 5
