"""`python -m t5lite.bench` times the train step and writes a traceable JSON result, with
no TensorFlow / SeqIO / t5 / clu imported (the GPU image has none of them)."""
import json

import train_helpers as th


def test_bench_runs_and_writes_traceable_json(tmp_path):
    out = tmp_path / "bench.json"
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['bench', '--gin_file=configs/models/llama2/tiny.gin',"
        f" '--gin_file=configs/synthetic_pretrain.gin', '--gin.BATCH_SIZE=8',"
        f" \"--gin.TASK_FEATURE_LENGTHS={{'inputs': 16, 'targets': 16}}\","
        f" '--steps=3', '--warmup=1', '--json_out={out}']\n"
        "try:\n"
        "    runpy.run_module('t5lite.bench', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n")
    proc, imported = th.imports_after(code, cwd=tmp_path, devices=1)
    assert imported == []
    assert "median step" in proc.stdout and "TFLOP/s per device" in proc.stdout
    result = json.loads(out.read_text())
    assert len(result["step_durations_s"]) == 3
    median = sorted(result["step_durations_s"])[1]
    assert result["median_step_s"] == median
    assert abs(result["seq_per_s"] - 8 / median) < 1e-6 * result["seq_per_s"]
    assert abs(result["target_tokens_per_s"] - 8 * 16 / median) < 1e-3
    # 2 layers, d 64, 4 heads (2 kv) of 16, ff 172, vocab 32000, seq 16, gated MLP:
    # per token fwd = 2*(2*64*(4+4)*16 + 2*64*4*16 + 2*64*172*3 + 4*16*4*16/2) + 2*64*32000
    per_token = 2 * (2 * 64 * 128 + 2 * 64 * 64 + 2 * 64 * 172 * 3 + 2048) + 2 * 64 * 32000
    assert result["flops_per_example"] == 3 * per_token * 16
    assert result["device_count"] >= 1 and result["jax_version"]
    assert "DecoderConfig.num_kv_heads = 2" in result["gin_config"]
    assert "--steps=3" in result["command"]
    # start-up and steps dispatched ahead: 2 windows of 3 steps, the median reported
    assert result["init_s"] > 0 and result["compile_s"] > 0 and result["build_s"] > 0
    windows = result["async_window_step_s"]
    assert len(windows) == 2 and abs(result["async_step_s"] - sum(windows) / 2) < 1e-12
    assert "step dispatched ahead" in proc.stdout and "init (compile + run)" in proc.stdout
