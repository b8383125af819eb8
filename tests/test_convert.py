"""`python -m t5lite.convert --from=hf`: Orbax params + model.gin from an HF directory."""
import dataclasses
import json
import sys
from pathlib import Path

import gin
import jax
import numpy as np
import pytest

import train_helpers as th

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import t5lite.config.registry  # noqa: E402,F401  (gin registrations)
from t5lite.config import parsing  # noqa: E402
from t5lite.interop import checkpoint_format, convert, hf  # noqa: E402
from t5lite.models.configs import moe_macros, switch_macros  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args):
    return th.run([sys.executable, "-m", "t5lite.convert", *args], cwd=REPO, timeout=120)


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def assert_trees_equal(a, b):
    la = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(a)}
    lb = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(b)}
    assert la.keys() == lb.keys()
    for k in la:
        np.testing.assert_array_equal(np.asarray(la[k]), np.asarray(lb[k]), err_msg=k)


def model_from_gin(path, *bindings):
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings([str(path)], list(bindings))
        return parsing.resolve_macro("MODEL", str(path))
    finally:
        gin.clear_config()


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("hf_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(path), safe_serialization=True)
    return path


def test_convert_t5_fused_scanned(hf_t5, tmp_path):
    out = tmp_path / "ckpt"
    proc = run_cli("--from=hf", f"--input={hf_t5}", f"--output={out}", "--fuse_qkv",
                   "--scan_layers")
    assert proc.returncode == 0, proc.stderr
    assert (out / "checkpoints" / "0" / "params").is_dir()

    model, variables = hf.load_pretrained(hf_t5, fuse_qkv=True, scan_layers=True)
    assert_trees_equal(checkpoint_format.load_params(out), variables)
    assert_trees_equal(checkpoint_format.load_params(out / "checkpoints" / "0"), variables)

    built = model_from_gin(out / "model.gin")
    assert type(built).__name__ == "EncoderDecoderModel"
    assert built.config == model.config
    assert built.config.fuse_qkv and built.config.scan_layers


def test_convert_llama_gin_and_params(hf_llama, tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()  # an existing empty directory is fine
    proc = run_cli("--from=hf", f"--input={hf_llama}", f"--output={out}", "--dtype=float32")
    assert proc.returncode == 0, proc.stderr
    model, variables = hf.load_pretrained(hf_llama, dtype="float32")
    assert model.config.tie_embeddings and model.config.num_kv_heads == 2
    assert_trees_equal(checkpoint_format.load_params(out), variables)
    built = model_from_gin(out / "model.gin")
    assert type(built).__name__ == "DecoderOnlyModel"
    assert built.config == model.config
    assert "BATCH_PRIORITIZED_ROUTING" not in (out / "model.gin").read_text()  # encoder only
    changed = model_from_gin(out / "model.gin", "REMAT_POLICY = 'full'",
                             "CAPACITY_FACTOR = 1.5").config
    assert changed == dataclasses.replace(model.config, remat_policy="full",
                                          capacity_factor=1.5)


def test_convert_in_process_matches_gin_text(hf_t5, tmp_path):
    """The library entry point, and the gin text against the registered names."""
    out = convert.convert_hf(str(hf_t5), str(tmp_path / "c"))
    text = (out / "model.gin").read_text()
    assert "MODEL = @EncoderDecoderModel()" in text
    assert "EncoderDecoderModel.config = @T5Config()" in text
    assert "T5Config.emb_dim = 32" in text and "FUSE_QKV = False" in text
    # every switch and every mixture-of-experts setting stays a macro (FP8_BACKEND and
    # CAPACITY_FACTOR were written as plain values before)
    for field, macro in {**switch_macros(), **moe_macros()}.items():
        assert f"T5Config.{field} = %{macro}" in text
    built = model_from_gin(out / "model.gin", "FP8_RECIPE = 'current'",
                           "CAPACITY_FACTOR = 1.5")
    assert built.config.fp8_recipe == "current" and built.config.capacity_factor == 1.5
    assert set(t5lite.config.registry.REGISTERED) >= {"EncoderDecoderModel", "T5Config"}


def test_save_params_rejects_existing_step_and_load_missing(tmp_path):
    tree = {"params": {"w": np.arange(4, dtype=np.float32)}}
    checkpoint_format.save_params(tmp_path, tree, step=3)
    with pytest.raises(FileExistsError):
        checkpoint_format.save_params(tmp_path, tree, step=3)
    assert_trees_equal(checkpoint_format.load_params(tmp_path / "checkpoints"), tree)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint found"):
        checkpoint_format.load_params(empty)
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory"):
        checkpoint_format.load_params(tmp_path / "nope")


def test_cli_errors(hf_t5, tmp_path):
    assert_one_line_error(run_cli("--from=hf", f"--input={tmp_path / 'missing'}",
                                  f"--output={tmp_path / 'o1'}"), "missing", "not a directory")

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((hf_t5 / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    assert_one_line_error(run_cli("--from=hf", f"--input={pickled}",
                                  f"--output={tmp_path / 'o2'}"), "pickle", "safetensors")
    assert not (tmp_path / "o2").exists()

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (bert / "model.safetensors").symlink_to(hf_t5 / "model.safetensors")
    assert_one_line_error(run_cli("--from=hf", f"--input={bert}", f"--output={tmp_path / 'o3'}"),
                          "model_type", "bert")

    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("x")
    assert_one_line_error(run_cli("--from=hf", f"--input={hf_t5}", f"--output={full}"),
                          "not an empty directory")


def test_cli_refuses_weights_not_all_there(hf_t5, tmp_path):
    """Issue 39: a model.safetensors cut short, an index naming a shard that is gone or a
    tensor its shard lacks: one `error:` line naming the file and tensor, status 2, no
    traceback, nothing written."""
    from safetensors.numpy import load_file, save_file

    def copy(name):
        out = tmp_path / name
        out.mkdir()
        (out / "config.json").write_text((hf_t5 / "config.json").read_text())
        return out

    cut = copy("cut")
    weights = (hf_t5 / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[:len(weights) // 2])
    assert_one_line_error(run_cli("--from=hf", f"--input={cut}", f"--output={tmp_path / 'o1'}"),
                          f"{cut / 'model.safetensors'} is cut short", "tensor '")
    sharded = copy("sharded")
    tensors = load_file(hf_t5 / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for shard, held in shards.items():
        save_file({n: tensors[n] for n in held if n != names[1]}, sharded / shard)
    (sharded / hf.INDEX_NAME).write_text(json.dumps({"weight_map": {
        n: shard for shard, held in shards.items() for n in held}}))
    assert_one_line_error(run_cli("--from=hf", f"--input={sharded}",
                                  f"--output={tmp_path / 'o2'}"),
                          f"names tensor {names[1]!r} in shard model-00002-of-00002")
    (sharded / "model-00001-of-00002.safetensors").unlink()
    assert_one_line_error(run_cli("--from=hf", f"--input={sharded}",
                                  f"--output={tmp_path / 'o3'}"),
                          "missing shard model-00001-of-00002.safetensors", repr(names[0]))
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_reading_a_model_shows_a_bar_of_its_tensors_on_a_terminal(hf_t5, monkeypatch):
    """convert's (and INITIAL_CHECKPOINT_PATH's) read of a Hugging Face directory: a bar
    of the tensors read and their gigabytes on a terminal's stderr, nothing otherwise."""
    import io
    import re
    from t5lite.interop import hf
    terminal = type("Terminal", (io.StringIO,), {"isatty": lambda self: True})()
    monkeypatch.setattr(sys, "stderr", terminal)
    n = len(hf.read_safetensors(hf_t5))
    assert n > 10 and re.search(rf"reading tensors: 100%.*\b{n}/{n}\b.*GB=",
                                terminal.getvalue()), terminal.getvalue()[-1000:]
    quiet = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", quiet)
    hf.read_safetensors(hf_t5)
    assert quiet.getvalue() == ""
