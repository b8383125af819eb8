"""`t5lite.tools.program_account` (and `python -m t5lite.info --account`): the bytes a
program lowered for CUDA writes and reads before fusion, counted by hand on a small one;
a called function counts at each call; the train step's biggest tensors; cuDNN, which
cannot be lowered without the library, refused in one line."""
import json

import jax
import jax.numpy as jnp
import pytest

import train_helpers as th
from t5lite import info
from t5lite.errors import ConfigError
from t5lite.tools import program_account


def test_bytes_by_hand_with_a_function_called_twice():
    inner = jax.jit(lambda a: jnp.tanh(a @ a.T))  # a private function, called twice
    lowered = jax.jit(lambda a: inner(a) + inner(a * 2)).trace(
        jax.ShapeDtypeStruct((64, 32), jnp.float32)).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("call @") == 2
    report = program_account.account(lowered.compiler_ir("stablehlo"))
    f32 = 4
    # each call: transpose [32, 64], dot_general [64, 64], tanh [64, 64]
    call_written = (32 * 64 + 64 * 64 + 64 * 64) * f32
    call_read = (64 * 32 + 2 * 64 * 32 + 64 * 64) * f32
    # main: the constant 2.0, its broadcast [64, 32], multiply [64, 32], add [64, 64]
    main_written = f32 + (64 * 32 + 64 * 32 + 64 * 64) * f32
    main_read = f32 + (2 * 64 * 32 + 2 * 64 * 64) * f32
    assert report["bytes_written"] == 2 * call_written + main_written == 114_692
    assert report["bytes_read"] == 2 * call_read + main_read == 131_076
    assert report["ops"] == 2 * 3 + 4 and report["while_loops"] == 0
    top = report["largest"][0]
    assert (top["shape"], top["dtype"], top["bytes"], top["count"]) == ([64, 64], "f32",
                                                                        16384, 5)
    assert top["ops"] == {"stablehlo.dot_general": 2, "stablehlo.tanh": 2, "stablehlo.add": 1}


def test_info_account_of_a_train_step(capsys):
    gin = f"--gin_file={th.REPO / th.MODEL_FILES['t5']}"
    assert info.main([gin, "--account", "--per_device_batch=2", "--inputs_length=64",
                      "--targets_length=16", "--json"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)["program_account"]
    assert (report["platform"], report["devices"], report["batch_size"]) == ("cuda", 1, 2)
    assert report["bytes_read"] > report["bytes_written"] > 0
    sizes = [t["bytes"] for t in report["largest"]]
    assert sizes == sorted(sizes, reverse=True)
    # among them the float32 logits [batch, targets, vocab] and the embedding's moments
    assert [2, 16, 32128] in [t["shape"] for t in report["largest"] if t["dtype"] == "f32"]
    assert [32128, 64] in [t["shape"] for t in report["largest"]]
    assert "program account  lowered for cuda" in out.err and "largest tensors" in out.err


def test_cudnn_is_accounted_with_the_gpu_extra_and_one_line_without(capsys, monkeypatch):
    """Its parameters are drawn through the einsum attention (the same parameters), so
    `info` answers; the step traces cuDNN's attention where the gpu-aot extra brings
    cuDNN (the test extra does), and without cuDNN says so in one line."""
    gin = f"--gin_file={th.REPO / th.MODEL_FILES['t5']}"
    assert info.main([gin, "--gin.ATTENTION_IMPL='cudnn'"]) == 0
    assert "parameters" in capsys.readouterr().out
    args = [gin, "--account", "--per_device_batch=1", "--inputs_length=16",
            "--targets_length=8", "--gin.ATTENTION_IMPL='cudnn'"]
    assert info.main(args) == 0
    assert "program account  lowered for cuda" in capsys.readouterr().out

    def no_cudnn(*a, **k):
        raise RuntimeError("cuDNN not found")  # what jax raises where it has no cuDNN
    monkeypatch.setattr(program_account, "step_account", no_cudnn)
    with pytest.raises(ConfigError, match=r"ATTENTION_IMPL='cudnn' cannot be traced .*"
                                          r"ATTENTION_IMPL='dot_product'"):
        info.main(args)