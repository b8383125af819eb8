"""Throughput / MFU by hand, peak lookup, TensorBoard event files read back, log line."""
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys

import pytest

from t5lite.runtime.event_files import read_scalars
from t5lite.runtime.metrics import (MetricWriter, Progress, format_log_line, peak_bf16_tflops,
                                    peak_fp8_tflops, throughput)

import train_helpers as th


@pytest.mark.parametrize("kind,peak", [
    ("NVIDIA H100 80GB HBM3", 989.4),
    ("NVIDIA H200", 989.4),
    ("NVIDIA GH200 480GB", 989.4),
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("cpu", None),
    ("TFRT_CPU_0", None),
])
def test_peak_lookup(kind, peak):
    assert peak_bf16_tflops(kind) == peak


def test_peak_lookup_defaults_to_first_jax_device():
    assert peak_bf16_tflops() is None  # tests run on CPU
    assert peak_fp8_tflops("NVIDIA H100 80GB HBM3") == 1978.9
    assert peak_fp8_tflops("NVIDIA A100-SXM4-80GB") is None


def test_throughput_by_hand():
    t = throughput(0.5, 8, 128, 1e12, 2, "NVIDIA H100 80GB HBM3")
    assert t["step_time_s"] == 0.5
    assert t["seq_per_s"] == pytest.approx(16.0)           # 8 / 0.5
    assert t["target_tokens_per_s"] == pytest.approx(2048.0)  # 16 * 128
    assert t["tflops_per_device"] == pytest.approx(8.0)     # 1e12 * 16 / 2 / 1e12
    assert t["mfu"] == pytest.approx(8.0 / 989.4)
    assert "mfu_fp8" not in t


def test_throughput_cpu_and_fp8_and_unknown_flops():
    cpu = throughput(2.0, 4, 10, 3e9, 1, "cpu")
    assert cpu["seq_per_s"] == pytest.approx(2.0)
    assert cpu["target_tokens_per_s"] == pytest.approx(20.0)
    assert cpu["tflops_per_device"] == pytest.approx(6e-3)
    assert cpu["mfu"] is None
    fp8 = throughput(1.0, 2000, 128, 1e12, 4, "NVIDIA H200", fp8=True)
    assert fp8["tflops_per_device"] == pytest.approx(500.0)
    assert fp8["mfu"] == pytest.approx(500 / 989.4)
    assert fp8["mfu_fp8"] == pytest.approx(500 / 1978.9)
    none = throughput(1.0, 2, 8, None, 1, "NVIDIA H100 80GB HBM3")
    assert none["tflops_per_device"] is None and none["mfu"] is None
    with pytest.raises(ValueError, match="step_time_s"):
        throughput(0.0, 2, 8, 1.0, 1, "cpu")


def test_format_log_line():
    m = {"loss": 3.2141, "z_loss": 0.00104, "accuracy": 0.4121, "learning_rate": 0.01,
         "grad_norm": 0.951, **throughput(0.231, 8, 128, 1.23e12 * 0.231 / 8, 1, "cpu")}
    assert format_log_line(120, 1000, m) == (
        "step 120/1000 | loss 3.214 | z_loss 0.001 | acc 0.412 | lr 1.0e-02 | "
        "grad_norm 0.95 | 0.231 s/step | 34.6 seq/s | 4433 tok/s | 1.23 TFLOP/s/dev | MFU -")


def test_format_log_line_aliases_extras_and_numpy_values():
    np = pytest.importorskip("numpy")
    line = format_log_line(5, None, {"weight_sum": np.float32(1234), "lr": np.asarray(1e-4),
                                     "loss": float("nan"), "mfu": 0.4123, "acc": None})
    assert line == "step 5 | loss nan | acc - | lr 1.0e-04 | MFU 41.2% | weight_sum 1234"
    assert format_log_line(1, 10, {"z_loss": 2.5e-5}) == "step 1/10 | z_loss 2.50e-05"


def test_tensorboard_writer_round_trip_and_process_gating(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="t5lite.runtime.metrics")
    with MetricWriter(str(tmp_path), 0, log_every=2, total_steps=5) as w:
        assert w.backend == "tensorboard" and w.logdir == str(tmp_path / "train")
        for step in range(1, 6):
            w.write_scalars(step, {"loss": 4.0 - step / 4, "lr": 0.01 * step, "mfu": None})
        w.flush()
    got = read_scalars(str(tmp_path / "train"))
    assert sorted(got) == ["loss", "lr"]  # None is left out of TensorBoard
    assert [s for s, _ in got["loss"]] == [1, 2, 3, 4, 5]
    assert [v for _, v in got["loss"]] == pytest.approx([3.75, 3.5, 3.25, 3.0, 2.75])
    assert [v for _, v in got["lr"]] == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
    lines = [r.getMessage() for r in caplog.records if r.name == "t5lite.runtime.metrics"]
    assert [ln.split(" | ")[0] for ln in lines] == ["step 2/5", "step 4/5", "step 5/5"]
    assert "MFU -" in lines[0]

    other = tmp_path / "p1"
    w1 = MetricWriter(str(other), 1, backend="tensorboard")
    w1.write_scalars(1, {"loss": 1.0})
    w1.flush()
    w1.close()
    assert not other.exists()  # process 1 writes nothing


def test_eval_writer_and_none_backend(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="t5lite.runtime.metrics")
    w = MetricWriter(str(tmp_path), 0, log_every=1, subdir="eval", backend="tensorboard")
    w.write_scalars(1000, {"accuracy": 0.5})
    w.close()
    assert read_scalars(str(tmp_path / "eval")) == {"accuracy": [(1000, 0.5)]}
    assert any(r.getMessage().startswith("[eval] step 1000 | acc 0.500")
               for r in caplog.records)
    n = MetricWriter(str(tmp_path / "n"), 0, backend="none")
    n.write_scalars(0, {"loss": 1.0})
    n.close()
    assert not (tmp_path / "n").exists()


def test_default_backend_writes_readable_scalars(tmp_path):
    w = MetricWriter(str(tmp_path), 0, log_every=10)
    assert w.backend == "tensorboard"
    w.write_scalars(3, {"loss": 2.5})
    w.write_scalars(7, {"loss": 1.25})
    w.close()
    assert read_scalars(str(tmp_path / "train")) == {"loss": [(3, 2.5), (7, 1.25)]}


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="needs TensorFlow to read events independently")
def test_tensorflow_reads_our_event_files(tmp_path):
    w = MetricWriter(str(tmp_path), 0, backend="tensorboard")
    w.write_scalars(10, {"loss": 3.5, "accuracy": 0.25})
    w.write_scalars(20, {"loss": 2.0, "accuracy": 0.5})
    w.close()
    code = (
        "import glob, json, sys\n"
        "import tensorflow as tf\n"
        "out = []\n"
        "for path in sorted(glob.glob(sys.argv[1] + '/*tfevents*')):\n"
        "    for e in tf.compat.v1.train.summary_iterator(path):\n"
        "        if e.file_version: out.append(['version', e.file_version])\n"
        "        for v in e.summary.value:\n"
        "            out.append([e.step, v.tag, v.simple_value])\n"
        "print(json.dumps(out))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "train")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [
        ["version", "brain.Event:2"], [10, "loss", 3.5], [10, "accuracy", 0.25],
        [20, "loss", 2.0], [20, "accuracy", 0.5]]


def test_progress_bar_only_on_a_tty():
    buf = io.StringIO()  # not a tty
    p = Progress(100, file=buf)
    assert not p.enabled
    p.update(10, {"loss": 1.0})
    p.close()
    assert buf.getvalue() == ""

    pytest.importorskip("tqdm")
    buf = io.StringIO()
    with Progress(100, initial=5, file=buf, enable=True) as p:
        assert p.enabled
        p.update(40, {"loss": 1.23456, "mfu": None})
    out = buf.getvalue()
    assert "40/100" in out and "loss=1.235" in out and "mfu=-" in out
    assert not Progress(100, file=buf, enable=None, process_index=1).enabled


def test_metrics_import_no_tensorflow_or_clu_and_tensorboard_only_when_writing():
    code = ("import tempfile\n"
            "import t5lite.runtime.metrics as m\n"
            "w = m.MetricWriter(tempfile.mkdtemp(), 0, backend='none')\n"
            "w.write_scalars(1, {'loss': 1.0}); w.close()\n")
    _, imported = th.imports_after(code, th.HEAVY_PACKAGES + ("tensorboard",))
    assert imported == []
    code = code.replace("backend='none'", "backend='tensorboard'")
    _, imported = th.imports_after(code, th.HEAVY_PACKAGES)
    assert imported == []
