"""T5X checkpoints used where T5X users use them (issue 27): a checkpoint in T5X's layout,
written from a random `transformers` T5 (v1.1 and v1.0, float32 and bfloat16 on disk),
loads into t5lite with transformers' logits; INITIAL_CHECKPOINT_PATH at it finetunes
through the CLI; `t5lite.convert --from=t5x` writes a t5lite checkpoint; bad input is one
line with nothing written."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402

from t5lite.data import tasks  # noqa: E402,F401  (t5's gin configurables first)
del tasks  # imported for its registrations alone
from t5lite.data.files import demo_corpus

import t5x_helpers as tx  # noqa: E402
import train_helpers as th  # noqa: E402
from data_helpers import VOCAB_SIZE, data_env, reset_data_settings, vocabulary  # noqa: E402
from test_hf import hf_t5_logits, t5_batch  # noqa: E402

VOCAB = VOCAB_SIZE + 100  # the test vocabulary and T5's 100 extra ids
TOL = 1e-4


def _hf_t5(path, v1_0: bool, bf16_weights: bool = False, num_layers: int = 2):
    torch.manual_seed(3 if v1_0 else 4)
    cfg = transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=num_layers, num_heads=4,
        feed_forward_proj="relu" if v1_0 else "gated-gelu", tie_word_embeddings=v1_0,
        relative_attention_num_buckets=32, relative_attention_max_distance=128)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    if bf16_weights:  # the reference holds exactly the weights a bfloat16 checkpoint holds
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def _abstract(model):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {"params": jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
        model.abstract_variables()["params"])}


@pytest.mark.parametrize("v1_0,dtype,layout,orbax", [
    (False, "float32", {}, False),
    (False, "bfloat16", {"fuse_qkv": True, "scan_layers": True}, False),
    (True, "float32", {"scan_layers": True}, False),
    (False, "float32", {"fuse_qkv": True}, True),  # T5X's Orbax layout
])
def test_a_t5x_checkpoint_gives_transformers_logits(tmp_path, v1_0, dtype, layout, orbax):
    from t5lite.interop import hf as hf_import
    from t5lite.runtime.checkpointing import finetune_restore
    hf = _hf_t5(tmp_path / "hf", v1_0, bf16_weights=dtype == "bfloat16")
    target = tx.t5x_tree_from_hf(hf.state_dict(), 2)
    if orbax:
        ckpt = tx.write_t5x_orbax_checkpoint(tmp_path / "t5x_run", target, step=1000)
    else:
        ckpt = tx.write_t5x_checkpoint(tmp_path / "checkpoint_1000", target, step=1000,
                                       dtype=dtype)
    model, _ = hf_import.load_pretrained(tmp_path / "hf", dtype="float32", **layout)
    assert model.config.logits_via_embedding == v1_0
    params = finetune_restore.restore_params_for_finetuning(ckpt, model, _abstract(model))
    batch = t5_batch(0, enc_valid=(40, 25, 33))
    batch = {k: np.minimum(v, VOCAB - 1) for k, v in batch.items()}
    ours = np.asarray(jax.jit(model.logits)(params, batch))
    theirs = hf_t5_logits(hf, batch)
    valid = batch["decoder_target_tokens"] > 0
    diff = float(np.max(np.abs(ours - theirs)[valid]))
    print(f"\nT5X ({'v1.0' if v1_0 else 'v1.1'}, {dtype}, {layout}, orbax={orbax}) -> t5lite: "
          f"max |logit diff| = {diff:.3g}")
    assert diff <= TOL


@pytest.fixture
def env(tmp_path, monkeypatch, tmp_path_factory):
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=16, dev=4)
    vocab = vocabulary(tmp_path_factory)
    data_env(monkeypatch, tmp_path, vocab, mnli_dir=tmp_path / "multinli")
    yield dict(vocab=vocab, mnli=tmp_path / "multinli")
    reset_data_settings()


# configs/models/t5_1_1/tiny.gin cut to one layer a side (what the runs below check does
# not depend on the depth; each program they compile is smaller).
MODEL_GIN = """include 'models/t5_1_1/tiny.gin'
T5Config.vocab_size = {vocab}
T5Config.num_encoder_layers = 1
T5Config.num_decoder_layers = 1
"""


def _tiny_t5x_checkpoint(tmp_path):
    """A T5X checkpoint of MODEL_GIN's shapes (tiny.gin's, one layer a side, vocab VOCAB)."""
    torch.manual_seed(5)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    (tmp_path / "model.gin").write_text(MODEL_GIN.format(vocab=VOCAB))
    return tx.write_t5x_checkpoint(tmp_path / "t5x" / "checkpoint_1000",
                                   tx.t5x_tree_from_hf(hf.state_dict(), 1), step=1000,
                                   dtype="bfloat16")


def test_initial_checkpoint_path_at_a_t5x_checkpoint_finetunes_and_converts(env, tmp_path,
                                                                            capsys):
    from t5lite import convert, train
    ckpt = _tiny_t5x_checkpoint(tmp_path)
    run = tmp_path / "run"
    args = [f"--gin_file={tmp_path}/model.gin", "--gin_file=configs/finetune_mnli.gin",
            f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"',
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}",
            "--gin.BATCH_SIZE=8", "--gin.TRAIN_STEPS=2", "--gin.EVAL_PERIOD=None",
            "--gin.CHECKPOINT_PERIOD=2", "--gin.CheckpointSettings.async_save=False"]
    assert train.main(args) == 0
    import train_helpers as th
    from t5lite.formats import t5x_checkpoint
    from t5lite.formats import t5x_params
    from t5lite.config import parsing
    parsing.parse_gin([f"{tmp_path}/model.gin"])
    model = parsing.resolve_macro("MODEL")
    start = t5x_params.params_from_t5x(t5x_checkpoint.read_checkpoint(ckpt)["target"], model)
    trained = th.load_state(run, 2)["params"]["params"]
    # finetuning started from the T5X weights: two Adafactor steps at lr 1e-3 move each
    # kernel by well under its size, never to something unrelated
    a = np.asarray(start["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"], np.float32)
    b = np.asarray(trained["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"])
    assert 0 < np.max(np.abs(a - b)) < 0.1 * np.max(np.abs(a))

    out = tmp_path / "converted"
    assert convert.main(["--from=t5x", f"--input={ckpt}", f"--output={out}",
                         f"--gin_file={tmp_path}/model.gin", "--fuse_qkv"]) == 0
    assert "FUSE_QKV = True" in (out / "model.gin").read_text()
    from t5lite.interop import checkpoint_format
    converted = checkpoint_format.load_params(out / "checkpoints" / "1000")
    qkv = np.asarray(converted["params"]["encoder"]["layers_0"]["attention"]["qkv"]["kernel"])
    np.testing.assert_array_equal(  # [embed, stack(q, k, v), heads, kv]
        qkv[:, 0], np.asarray(start["encoder"]["layers_0"]["attention"]["query"]["kernel"],
                              np.float32))
    capsys.readouterr()


def test_a_lora_run_takes_its_frozen_base_from_a_t5x_checkpoint(env, tmp_path, capsys):
    """LoRA (issue 41) from a T5X checkpoint: the base is T5X's weights, bit for bit,
    after training; only the adapters moved; the base's fingerprint is recorded."""
    import json
    import train_helpers as th
    from t5lite import train
    from t5lite.config import parsing
    from t5lite.formats import t5x_checkpoint, t5x_params
    from t5lite.runtime.checkpointing import lora_restore
    ckpt = _tiny_t5x_checkpoint(tmp_path)
    run = tmp_path / "lora"
    lora = ["--gin.LORA_RANK=4", "--gin.LORA_TARGETS=['query', 'value', 'wo']"]
    assert train.main([f"--gin_file={tmp_path}/model.gin", "--gin_file=configs/finetune_mnli.gin",
                       f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"',
                       "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}",
                       "--gin.BATCH_SIZE=8", "--gin.TRAIN_STEPS=2", "--gin.EVAL_PERIOD=None",
                       "--gin.CHECKPOINT_PERIOD=2", "--gin.train.optimizer=@adamw()",
                       "--gin.adamw.learning_rate=1e-2",
                       "--gin.CheckpointSettings.async_save=False", *lora]) == 0
    parsing.parse_gin([f"{tmp_path}/model.gin"])
    start = th.flat(t5x_params.params_from_t5x(t5x_checkpoint.read_checkpoint(ckpt)["target"],
                                               parsing.resolve_macro("MODEL")))
    trained = th.flat(th.load_state(run, 2)["params"]["params"])
    adapters = {k for k in trained if "lora_" in k}
    assert adapters and set(trained) - adapters == set(start)
    for name, value in start.items():
        np.testing.assert_array_equal(trained[name], np.asarray(value, np.float32), name)
    assert any(np.any(trained[k] != 0) for k in adapters if k.endswith("lora_b']"))
    data = json.loads((th.checkpoints_dir(run) / "2" / "data" / "metadata").read_text())
    assert data[lora_restore.KEY].startswith("sha256:")
    capsys.readouterr()


def test_bad_t5x_input_is_one_line_and_writes_nothing(env, tmp_path, capsys):
    import shutil
    from t5lite import convert, train
    ckpt = _tiny_t5x_checkpoint(tmp_path)
    base = [f"--gin_file={tmp_path}/model.gin", "--gin_file=configs/finetune_mnli.gin",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}", "--gin.BATCH_SIZE=8",
            "--gin.TRAIN_STEPS=2", "--gin.EVAL_PERIOD=None"]
    missing = tmp_path / "t5x" / "checkpoint_missing"
    shutil.copytree(ckpt, missing)
    shutil.rmtree(missing / "target.encoder.layers_0.mlp.wo.kernel")
    chunk = tmp_path / "t5x" / "checkpoint_chunk"  # one chunk file lost (issue 39)
    shutil.copytree(ckpt, chunk)
    (chunk / "target.decoder.layers_0.mlp.wi_1.kernel" / "1.0").unlink()
    wrong = tmp_path / "t5x" / "checkpoint_wrong"
    shutil.copytree(ckpt, wrong)
    (tmp_path / "small.gin").write_text(MODEL_GIN.format(vocab=VOCAB) +
                                        "T5Config.mlp_dim = 96\n")
    cases = [  # (INITIAL_CHECKPOINT_PATH, model gin, what the line must name)
        (missing, f"{tmp_path}/model.gin", "encoder/layers_0/mlp/wo/kernel"),
        (chunk, f"{tmp_path}/model.gin",
         "decoder/layers_0/mlp/wi_1/kernel' (t5lite's params/decoder/layers_0/mlp/wi_1/kernel) "
         "has no chunk 1.0"),
        (wrong, f"{tmp_path}/small.gin", "mlp/wi_0/kernel"),
        (tmp_path / "t5x", f"{tmp_path}/model.gin", str(tmp_path / "t5x")),
    ]
    for i, (path, gin, named) in enumerate(cases):
        run = tmp_path / f"run{i}"
        code = train.main([f"--gin_file={gin}"] + base[1:] + [
            f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{path}"'])
        lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
        assert code != 0 and len(lines) == 1 and named in lines[0], (code, lines)
        assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    # convert: a T5 v1.0 checkpoint read as a v1.1 model (another network), no output left
    hf = _hf_t5(tmp_path / "hf10", v1_0=True, num_layers=1)
    v10 = tx.write_t5x_checkpoint(tmp_path / "v10" / "checkpoint_5",
                                  tx.t5x_tree_from_hf(hf.state_dict(), 1), step=5)
    capsys.readouterr()
    out = tmp_path / "out"
    assert convert.main(["--from=t5x", f"--input={v10}", f"--output={out}",
                         f"--gin_file={tmp_path}/model.gin"]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if l]
    assert len(lines) == 1 and "mlp/wi/kernel" in lines[0], lines
    assert not out.exists() or not any(out.iterdir())


def test_convert_refuses_a_t5x_checkpoint_with_a_chunk_lost(tmp_path):
    """Issue 39's example through the real command: a chunk file deleted (TensorStore
    would read it as zeros) or emptied is one `error:` line naming the parameter and the
    chunk, status 2, no output; the intact checkpoint converts. The deleted chunk runs
    as a real `python -m t5lite.convert` subprocess; the emptied chunk and the intact
    checkpoint run through the command's main in one interpreter (th.run_mains)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parent.parent
    ckpt = _tiny_t5x_checkpoint(tmp_path)
    query = "target.encoder.layers_0.attention.query.kernel"

    def argv(path, out):
        return ["--from=t5x", f"--input={path}", f"--output={out}",
                f"--gin_file={tmp_path}/model.gin"]

    def convert(path, out):
        return subprocess.run([sys.executable, "-m", "t5lite.convert", *argv(path, out)],
                              cwd=repo, capture_output=True, text=True, timeout=300)

    deleted = tmp_path / "t5x" / "checkpoint_deleted"
    shutil.copytree(ckpt, deleted)
    (deleted / query / "0.0").unlink()
    empty = tmp_path / "t5x" / "checkpoint_empty"
    shutil.copytree(ckpt, empty)
    (empty / "target.token_embedder.embedding" / "1.1").write_bytes(b"")
    in_one, intact = th.run_mains([argv(empty, tmp_path / f"out_{empty.name}"),
                                   argv(ckpt, tmp_path / "out")], module="t5lite.convert")
    for path, named in ((deleted, f"'target/encoder/layers_0/attention/query/kernel' (t5lite's "
                                  f"params/encoder/layers_0/attention/query/kernel) has no "
                                  f"chunk 0.0 in {query}/ (1 of its 2 x 2 = 4 chunks missing)"),
                        (empty, "chunk 1.1 of parameter 'target/token_embedder/embedding'")):
        out = tmp_path / f"out_{path.name}"
        proc = convert(path, out) if path == deleted else in_one
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"error: T5X checkpoint {path} is missing data: ")
        assert named in lines[0] and "copy" in lines[0], lines[0]
        assert not out.exists()
    assert intact.returncode == 0, th.describe(intact)


def test_a_t5x_run_continues_at_its_step_with_its_adafactor_state(env, tmp_path, capsys):
    """INITIAL_CHECKPOINT_STATE='train_state': the T5X step, its Adafactor moments (here
    kept whole: MODEL_GIN's matrices are under 128 on a side) and TRAIN_STEPS counting from
    the T5X step, as in T5X; what cannot continue is one line, nothing written."""
    from t5lite import train
    import train_helpers as th
    torch.manual_seed(6)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    (tmp_path / "model.gin").write_text(MODEL_GIN.format(vocab=VOCAB))
    target = tx.t5x_tree_from_hf(hf.state_dict(), 1)
    from t5lite.models.common import param_paths
    slots = tx.adafactor_slots(param_paths.flatten(target), np.random.default_rng(0))
    ckpt = tx.write_t5x_checkpoint(tmp_path / "t5x" / "checkpoint_1000", target, step=1000,
                                   param_states=tx.param_states(slots))
    base = [f"--gin_file={tmp_path}/model.gin", "--gin_file=configs/finetune_mnli.gin",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}", "--gin.BATCH_SIZE=8",
            "--gin.EVAL_PERIOD=None", "--gin.CHECKPOINT_PERIOD=2",
            "--gin.CheckpointSettings.async_save=False",
            "--gin.INITIAL_CHECKPOINT_STATE='train_state'"]
    run = tmp_path / "run"
    assert train.main(base + [f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"',
                              "--gin.TRAIN_STEPS=1002"]) == 0
    assert "at step 1000" in capsys.readouterr().err
    assert th.complete_steps(run) == [1002]
    state = th.load_state(run, 1002)
    assert int(state["step"]) == 1002
    counts = [int(x) for x in jax.tree_util.tree_leaves(state["opt_state"]) if np.ndim(x) == 0]
    assert counts and set(counts) == {1002}, counts  # the schedule and the moments went on

    converted = tmp_path / "t5lite_ckpt"
    from t5lite import convert
    assert convert.main(["--from=t5x", f"--input={ckpt}", f"--output={converted}",
                         f"--gin_file={tmp_path}/model.gin"]) == 0
    capsys.readouterr()
    cases = [  # (extra flags, what the one line must name)
        ([f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"', "--gin.train.optimizer=@adamw()",
          "--gin.adamw.learning_rate=1e-3"], "INITIAL_CHECKPOINT_STATE='params'"),
        ([f'--gin.INITIAL_CHECKPOINT_PATH="{converted}"'], "no T5X checkpoint"),
        ([f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"', "--gin.INITIAL_CHECKPOINT_STATE='all'"],
         "INITIAL_CHECKPOINT_STATE='all'"),
    ]
    for i, (extra, named) in enumerate(cases):
        other = tmp_path / f"bad{i}"
        code = train.main(base + [f'--gin.MODEL_DIR="{other}"', "--gin.TRAIN_STEPS=1002"]
                          + extra)
        lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
        assert code != 0 and len(lines) == 1 and named in lines[0], (code, lines)
        assert not th.complete_steps(other) if (other / "checkpoints").exists() else True


def _doc_model_file(name: str) -> str:
    """The gin file `name` as docs/migrating_from_t5x.md shows it (a fenced block whose
    first line is `# <name>...`)."""
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[1] / "docs" / "migrating_from_t5x.md").read_text()
    blocks = re.findall(r"```\n(# " + re.escape(name) + r"[^\n]*\n.*?)```", doc, re.S)
    assert len(blocks) == 1, name
    return blocks[0]


def _t5x_target(params):
    """t5lite's unfused, unscanned T5 params as T5X stores them: the same names, the
    attention kernels with their heads joined."""
    from t5lite.models.common.param_paths import flatten, unflatten
    out = {}
    for name, value in flatten(params).items():
        value = np.asarray(value)
        if name.endswith(("query/kernel", "key/kernel", "value/kernel")):
            value = value.reshape(value.shape[0], -1)
        elif name.endswith("out/kernel"):
            value = value.reshape(-1, value.shape[-1])
        out[name] = value
    return unflatten(out)


DOC_MODELS = ["my_t5x_v1_1.gin", "my_t5x_v1_0.gin"]
# The docs' files with a small vocabulary and two layers a side: the widths (emb_dim,
# heads, head_dim, mlp_dim) are the sizes no shipped file matches; every layer of a stack
# converts alike, and two keep a layer past the first.
DOC_SMALLER = {"vocab_size": 256, "num_encoder_layers": 2, "num_decoder_layers": 2}


@pytest.fixture(scope="module")
def doc_conversions(tmp_path_factory):
    """{name: (directory, params, the conversion, the one with the heads split otherwise)}
    for DOC_MODELS: the four conversions run through `t5lite.convert`'s main in one
    interpreter (th.run_mains)."""
    from t5lite.config import parsing
    root = tmp_path_factory.mktemp("doc_models")
    smaller = [f"--gin.T5Config.{k}={v}" for k, v in DOC_SMALLER.items()]
    argvs, made = [], {}
    for name in DOC_MODELS:
        directory = root / name.split(".")[0]
        directory.mkdir()
        (directory / name).write_text(_doc_model_file(name))
        parsing.parse_gin([str(directory / name)],
                          [f"T5Config.{k} = {v}" for k, v in DOC_SMALLER.items()])
        model = parsing.resolve_macro("MODEL")
        rng = np.random.default_rng(1)
        params = jax.tree_util.tree_map(
            lambda a: rng.standard_normal(a.shape, dtype=np.float32).astype(a.dtype),
            model.abstract_variables()["params"])
        ckpt = tx.write_t5x_checkpoint(directory / "t5x" / "checkpoint_10",
                                       _t5x_target(params), step=10)
        argvs += [
            ["--from=t5x", f"--input={ckpt}", f"--output={directory / 'converted'}",
             f"--gin_file={directory / name}", *smaller],
            # the joined width of 8 heads of 64 read as 16 heads of 32: the relative
            # position table's [num_heads, buckets] refuses it
            ["--from=t5x", f"--input={ckpt}", f"--output={directory / 'wrong'}",
             f"--gin_file={directory / name}", *smaller, "--gin.T5Config.num_heads=16",
             "--gin.T5Config.head_dim=32"]]
        made[name] = (directory, params)
    procs = th.run_mains(argvs, module="t5lite.convert")
    return {name: (directory, params, procs[2 * i], procs[2 * i + 1])
            for i, (name, (directory, params)) in enumerate(made.items())}


@pytest.mark.parametrize("name", DOC_MODELS)
def test_the_docs_model_files_for_a_size_no_shipped_file_matches_convert(name,
                                                                         doc_conversions):
    """A T5X checkpoint of the sizes docs/migrating_from_t5x.md's example files give
    converts with those files as written (the vocabulary and the layer count made small,
    DOC_SMALLER), back to the same values; the same width split into other heads is
    refused. The checkpoint holds random values of the model's shapes (numpy: the model's
    own init costs seconds of CPU here, and any values test the round trip); the
    conversions of both files run through `t5lite.convert`'s main in one interpreter
    (doc_conversions; the command's real subprocess test is
    test_convert_refuses_a_t5x_checkpoint_with_a_chunk_lost)."""
    from t5lite.interop import checkpoint_format
    directory, params, proc, wrong = doc_conversions[name]
    assert proc.returncode == 0, th.describe(proc)
    converted = checkpoint_format.load_params(directory / "converted" / "checkpoints" / "10"
                                              / "params")
    th.assert_trees_equal(converted.get("params", converted), params, "converted params")
    th.assert_one_error(wrong, "relpos_bias/rel_embedding", "[8, 32]", "[16, 32]")
    assert not (directory / "wrong").exists()
