"""The GPU proof's logits check (`tools.switch_check`, scripts_gpu/check_switches.py)
on CPU: exact switches come out exact, a perturbed variant is caught, a variant the
backend cannot run is a row (and a non-zero exit), FP8 is judged by its own tolerance."""
import json
import subprocess
import sys

import numpy as np
import pytest

import train_helpers as th
from t5lite.models import configs, model as model_lib
from t5lite.tools import switch_check

LENGTHS = {"inputs": 24, "targets": 12}


def _model(**fields):
    # one layer a side: each variant is a program of its own to trace and compile, and
    # what is under test is the comparison, not the depth
    return model_lib.EncoderDecoderModel(configs.T5Config(
        vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=1,
        num_decoder_layers=1, mlp_dim=64, **fields))


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_layouts_are_exact_and_bf16_error_sets_the_tolerance():
    report = switch_check.compare_variants(
        _model(), {n: switch_check.VARIANTS[n] for n in
                   ("float32", "fused_qkv", "transpose_bs", "dot_product", "fp8")},
        LENGTHS, batch_size=3)
    rows = report["variants"]
    bf16 = report["bf16_error"]
    assert 1e-4 < bf16 < 0.05 and "ok" not in rows["float32"]
    for name in ("fused_qkv", "transpose_bs"):
        assert rows[name]["rel_l2"] < 1e-6 and rows[name]["argmax_agreement"] == 1.0
        assert rows[name]["ok"] and rows[name]["tolerance"] == max(3 * bf16, 1e-3)
    assert rows["dot_product"]["ok"]
    # FP8 really quantizes (further than bf16 from float32) and is judged by its own bar
    assert rows["fp8"]["tolerance"] == switch_check.FP8_TOLERANCE
    assert rows["fp8"]["rel_l2"] > bf16
    assert abs(rows["fp8"]["loss"] - report["reference"]["loss"]) < 0.1


def test_a_different_function_is_caught():
    # same weights and shapes, another function (ReLU gate instead of GELU)
    report = switch_check.compare_variants(
        _model(), {"float32": {"dtype": "float32"},
                   "wrong": {"mlp_activations": ("relu", "linear")}},
        LENGTHS, batch_size=3)
    row = report["variants"]["wrong"]
    assert row["ok"] is False and row["rel_l2"] > row["tolerance"]
    assert "TOO FAR" in switch_check.format_report(report)


def test_packed_rows_are_two_sequences_and_the_attention_keeps_them_apart():
    """`packed=True` (the GPU check of the decoder-only recipes' cuDNN attention on packed
    batches): each row two segments with their own positions, the logits those of two
    sequences (not of the unpacked rows), and the mask as ids, through jax.nn's attention
    with the causal flag, computes the dense mask's function on them."""
    batch = {"decoder_target_tokens": np.array([[5, 6, 7, 8, 9, 1, 0, 0]])}
    got = switch_check.packed_in_two(batch)
    assert np.asarray(got["decoder_segment_ids"]).tolist() == [[1, 1, 1, 1, 2, 2, 0, 0]]
    assert np.asarray(got["decoder_positions"]).tolist() == [[0, 1, 2, 3, 0, 1, 0, 0]]
    gpt = model_lib.DecoderOnlyModel(configs.DecoderConfig(
        vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, num_layers=2, mlp_dim=64,
        norm_type="layer", position_embedding="learned", max_length=64, use_bias=True))
    lengths = {"targets": 16}
    ids = {"ids": {"attention_impl": "dot_product", "attention_mask": "lengths"}}
    report = switch_check.compare_variants(gpt, ids, lengths, batch_size=2, packed=True)
    plain = switch_check.compare_variants(gpt, ids, lengths, batch_size=2)
    assert report["packed"] and not plain["packed"]
    assert report["reference"]["loss"] != pytest.approx(plain["reference"]["loss"], abs=1e-4)
    row = report["variants"]["ids"]
    assert row["rel_l2"] < 1e-5 and row["argmax_agreement"] == 1.0, row


@pytest.mark.slow
def test_script_reports_rows_and_fails_on_a_variant_it_cannot_run(tmp_path):
    out = tmp_path / "switches.json"
    proc = subprocess.run(
        [sys.executable, "scripts_gpu/check_switches.py",
         "--gin_file=configs/models/t5_1_1/tiny.gin", "--variants=float32,fused_qkv,cudnn",
         # a 512-entry vocabulary and one layer a side: the script's rows and exit are under
         # test, not the model's size (the real one's 32,128 entries were most of the run)
         "--gin.T5Config.vocab_size=512", "--gin.T5Config.num_encoder_layers=1",
         "--gin.T5Config.num_decoder_layers=1",
         "--inputs_length=16", "--targets_length=8", "--batch=2", f"--json_out={out}"],
        cwd=th.REPO, env=th.env(devices=1), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr        # cuDNN attention needs a GPU
    report = json.loads(out.read_text())
    assert report["variants"]["fused_qkv"]["ok"] is True
    assert "error" in report["variants"]["cudnn"]
    assert report["device_kind"] and report["task_feature_lengths"] == {"inputs": 16,
                                                                      "targets": 8}
    assert "fused_qkv" in proc.stdout and "ok" in proc.stdout
    # a line as each variant is measured (what a run cut off halfway still shows)
    assert "measured fused_qkv: rel L2 " in proc.stdout and "measured cudnn: " in proc.stdout
    bad = subprocess.run([sys.executable, "scripts_gpu/check_switches.py",
                          "--gin_file=configs/models/t5_1_1/tiny.gin", "--variants=flash"],
                         cwd=th.REPO, env=th.env(devices=1), capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --variants")
    assert len(bad.stderr.strip().splitlines()) == 1
