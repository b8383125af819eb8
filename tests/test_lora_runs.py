"""LoRA's run paths (t5lite.runtime.checkpointing.lora_restore): a LoRA run from a
checkpoint without adapters (a tiny T5 run's; a Hugging Face LLaMA converted with
`t5lite.convert --from=hf`) starts at the base model's loss and leaves the base
bit-identical; a checkpoint's adapters load when they are the model's, and are refused in
one line otherwise; the frozen base's fingerprint is recorded and checked; `convert
--to=hf` writes the merged model, whose transformers logits are t5lite's LoRA logits.
In-process runs of tiny float32 models on the synthetic task (the T5 one layer a side with
a 512-entry vocabulary)."""
from __future__ import annotations

import json
import logging

import jax
import numpy as np
import pytest

import train_helpers as th
from t5lite import convert, train
from t5lite.config import parsing
from t5lite.runtime.checkpointing import lora_restore

COMMON = [th.SYNTHETIC, "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
          "--gin.LOG_PERIOD=1", "--gin.CHECKPOINT_PERIOD=1", "--gin.KEEP_CHECKPOINTS=None",
          "--gin.RANDOM_SEED=0",
          "--gin.ACTIVATION_DTYPE='float32'", "--gin.DROPOUT_RATE=0.0", th.SYNC_CHECKPOINTS,
          '--gin.train.optimizer=@adamw()', "--gin.adamw.learning_rate=1e-2"]
# The tiny T5 cut to one layer a side and a 512-entry vocabulary (the synthetic task draws
# its tokens below it): nothing here depends on the depth or the real vocabulary, whose
# embedding and logits dominated each step, save and restore. Every T5 run (the base,
# its finetunes and resumes, the two-process run) uses the same.
T5_SMALL = ["--gin.T5Config.vocab_size=512", "--gin.T5Config.num_encoder_layers=1",
            "--gin.T5Config.num_decoder_layers=1"]
T5_LORA = ["--gin.LORA_RANK=4", "--gin.LORA_TARGETS=['query', 'value', 'wi_0']"]
LLAMA_LORA = ["--gin.LORA_RANK=4", "--gin.LORA_TARGETS=['query', 'value', 'out']"]


def _train(model_gin, run, steps, *extra, capsys=None):
    args = [f"--gin_file={model_gin}"] + [a if a.startswith("--") else f"--gin_file={a}"
                                          for a in COMMON]
    if str(model_gin) == th.MODEL_FILES["t5"]:
        args += T5_SMALL
    code = train.main(args + [f'--gin.MODEL_DIR="{run}"', f"--gin.TRAIN_STEPS={steps}",
                              *extra])
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def _losses(run):
    return [v for _, v in sorted(th.scalars(run)["loss"])]


def _is_adapter(name):
    return "lora_" in name


def _params(run, step):
    return th.flat(th.load_state(run, step)["params"])


def _error(err):
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def _restore(path, model):
    from t5lite.runtime.checkpointing.finetune_restore import restore_params_for_finetuning
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                            model.abstract_variables()["params"])
    return jax.device_get(restore_params_for_finetuning(str(path), model, {"params": abstract}))


def _set_recorded(run, step, fingerprint):
    """The checkpoint as a run on another base would have saved it: its recorded base
    fingerprint, and the record of its data item's sum that goes with it (else it is a
    checkpoint damaged on disk, `formats/fingerprints.py`)."""
    from t5lite.formats import fingerprints
    step_dir = th.checkpoints_dir(run) / str(step)
    f = step_dir / "data" / "metadata"
    data = json.loads(f.read_text())
    assert data[lora_restore.KEY].startswith("sha256:")
    data[lora_restore.KEY] = fingerprint
    f.write_text(json.dumps(data))
    record_file = step_dir / fingerprints.ITEM / "metadata"
    record = json.loads(record_file.read_text())
    record["data"] = fingerprints.data_fingerprint(data)
    record_file.write_text(json.dumps(record))


@pytest.fixture(scope="module")
def t5_base(tmp_path_factory):
    """A tiny T5 run (T5_SMALL) of one step without adapters (the base both T5 LoRA tests
    start from; they only read it): its MODEL_DIR."""
    base = tmp_path_factory.mktemp("t5_base") / "base"
    code, err = _train(th.MODEL_FILES["t5"], base, 1)
    assert code == 0, err
    assert th.complete_steps(base) == [1]
    return base


def test_t5_lora_from_a_run_adapters_and_fingerprint(tmp_path, capsys, t5_base):
    t5 = th.MODEL_FILES["t5"]
    base, plain, run = t5_base, tmp_path / "plain", tmp_path / "lora"
    # the same first batch, finetuned without and with LoRA from the base's step 1
    assert _train(t5, plain, 1, f'--gin.INITIAL_CHECKPOINT_PATH="{base}"')[0] == 0
    code, err = _train(t5, run, 2, f'--gin.INITIAL_CHECKPOINT_PATH="{base}"', *T5_LORA,
                       capsys=capsys)
    assert code == 0, err[-3000:]
    assert "initial:" in err
    lora_losses, plain_losses = _losses(run), _losses(plain)
    assert lora_losses[0] == pytest.approx(plain_losses[0], rel=1e-6, abs=0)
    assert lora_losses[1] != lora_losses[0]
    want, got = _params(base, 1), _params(run, 2)
    adapters = [k for k in got if _is_adapter(k)]
    assert adapters and set(got) - set(adapters) == set(want)
    for name in want:  # the base, bit-identical after training
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert all(np.any(got[k] != 0) for k in adapters if k.endswith("lora_b']"))

    # the recorded fingerprint is the base's (a sampled SHA-256), and resuming checks it
    data = json.loads((th.checkpoints_dir(run) / "2" / "data" / "metadata").read_text())
    other = "sha256:" + "0" * 64
    assert data[lora_restore.KEY].startswith("sha256:") and data[lora_restore.KEY] != other
    _set_recorded(run, 2, other)
    code, err = _train(t5, run, 3, *T5_LORA, capsys=capsys)
    line = _error(err)
    assert code != 0 and other[:19] in line and data[lora_restore.KEY][:19] in line, line
    # a new run given that checkpoint (its adapters) is refused the same way
    code, err = _train(t5, tmp_path / "again", 1, f'--gin.INITIAL_CHECKPOINT_PATH="{run}"',
                       *T5_LORA, capsys=capsys)
    line = _error(err)
    assert code != 0 and other[:19] in line and "INITIAL_CHECKPOINT_PATH" in line, line
    _set_recorded(run, 2, data[lora_restore.KEY])
    # LORA_ALPHA is recorded too: another one would rescale the adapters, so it is refused
    assert data[lora_restore.ALPHA_KEY] == 16.0
    code, err = _train(t5, run, 3, *T5_LORA, "--gin.LORA_ALPHA=4.0", capsys=capsys)
    line = _error(err)
    assert code != 0 and "LORA_ALPHA=16" in line and "LORA_ALPHA=4" in line, line
    code, err = _train(t5, tmp_path / "alpha", 1, f'--gin.INITIAL_CHECKPOINT_PATH="{run}"',
                       *T5_LORA, "--gin.LORA_ALPHA=4.0", capsys=capsys)
    line = _error(err)
    assert code != 0 and "INITIAL_CHECKPOINT_PATH" in line and "LORA_ALPHA=16" in line, line

    # the same adapters load (the next run starts from them); other ones are refused
    code, err = _train(t5, tmp_path / "more", 1, f'--gin.INITIAL_CHECKPOINT_PATH="{run}"',
                       *T5_LORA, "--gin.adamw.learning_rate=0.0", capsys=capsys)
    assert code == 0, err[-3000:]
    more = _params(tmp_path / "more", 1)
    for name in adapters:
        np.testing.assert_array_equal(more[name], got[name], err_msg=name)
    code, err = _train(t5, tmp_path / "other", 1, f'--gin.INITIAL_CHECKPOINT_PATH="{run}"',
                       "--gin.LORA_RANK=2", "--gin.LORA_TARGETS=['query', 'value', 'wi_0']",
                       capsys=capsys)
    line = _error(err)
    assert code != 0 and "rank 4 on query, value, wi_0" in line and "rank 2" in line, line
    # resumed with another LORA_RANK: what each holds, and how to go on (a setting: exit 2)
    steps = th.complete_steps(run)
    code, err = _train(t5, run, 3, "--gin.LORA_RANK=8",
                       "--gin.LORA_TARGETS=['query', 'value', 'wi_0']", capsys=capsys)
    line = _error(err)
    assert code == 2 and ("holds LoRA rank 4 on query, value, wi_0, the config asks for LoRA "
                          "rank 8 on query, value, wi_0 (LORA_RANK=8): set LORA_RANK=4 and "
                          in line), line
    assert th.complete_steps(run) == steps, "nothing saved, nothing set aside"


def test_base_fingerprint_sees_values_shapes_and_not_adapters():
    from t5lite.models.configs import DecoderConfig
    from t5lite.models.model import model_for_config
    cfg = DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                        num_layers=2, mlp_dim=64, dtype="float32", lora_rank=2,
                        lora_targets=("query",))
    params = jax.jit(model_for_config(cfg).init)(jax.random.PRNGKey(0))["params"]  # one program
    fp = lora_restore.base_fingerprint(params, cfg)
    assert fp == lora_restore.base_fingerprint(jax.tree.map(np.array, params), cfg)
    moved = jax.tree_util.tree_map_with_path(  # the adapters are not the base
        lambda p, x: x + 1 if "lora" in jax.tree_util.keystr(p) else x, params)
    assert lora_restore.base_fingerprint(moved, cfg) == fp
    emb = params["token_embedder"]["embedding"]
    edited = {**params, "token_embedder": {"embedding": emb.at[0, 0].add(1e-3)}}
    assert lora_restore.base_fingerprint(edited, cfg) != fp  # element 0 is always sampled


def test_llama_lora_from_hugging_face_exports_merged(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    hf_in, ckpt, hf_out = tmp_path / "hf_in", tmp_path / "ckpt", tmp_path / "hf_out"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        max_position_embeddings=64)).eval().save_pretrained(str(hf_in), safe_serialization=True)
    assert convert.main(["--from=hf", f"--input={hf_in}", f"--output={ckpt}",
                         "--dtype=float32"]) == 0
    model_gin, plain, run = ckpt / "model.gin", tmp_path / "plain", tmp_path / "lora"
    start = f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"'
    assert _train(model_gin, plain, 1, start)[0] == 0
    code, err = _train(model_gin, run, 3, start, *LLAMA_LORA, capsys=capsys)
    assert code == 0, err[-3000:]
    assert _losses(run)[0] == pytest.approx(_losses(plain)[0], rel=1e-6, abs=0)
    got = _params(run, 3)
    parsing.parse_gin([str(model_gin)], ["ACTIVATION_DTYPE = 'float32'"])
    base_model = parsing.resolve_macro("MODEL")
    want = th.flat(_restore(ckpt, base_model))
    assert set(got) - {k for k in got if _is_adapter(k)} == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)

    # convert --to=hf: the merged model; without the LoRA settings the same one (the
    # checkpoint's adapters and recorded alpha adopted, as eval and infer adopt them)
    assert convert.main(["--to=hf", f"--input={run}", f"--output={hf_out}",
                         f"--gin_file={model_gin}", *LLAMA_LORA]) == 0
    adopted = tmp_path / "adopted"
    assert convert.main(["--to=hf", f"--input={run}", f"--output={adopted}",
                         f"--gin_file={model_gin}"]) == 0
    assert "holds LoRA rank 4 adapters on out, query, value" in capsys.readouterr().err
    given, taken = _hf_tensors(hf_out), _hf_tensors(adopted)
    assert sorted(given) == sorted(taken) and len(given) > 10
    for name, value in given.items():
        np.testing.assert_array_equal(taken[name], value, err_msg=name)
    theirs_model = transformers.LlamaForCausalLM.from_pretrained(str(hf_out)).eval()
    assert not [n for n in theirs_model.state_dict() if "lora" in n]
    parsing.parse_gin([str(model_gin)], ["ACTIVATION_DTYPE = 'float32'", "LORA_RANK = 4",
                                         "LORA_TARGETS = ['query', 'value', 'out']"])
    model = parsing.resolve_macro("MODEL")
    tokens = np.random.RandomState(1).randint(2, 128, size=(2, 24)).astype(np.int32)
    ours = np.asarray(jax.jit(model.logits)(th.load_state(run, 3)["params"],
                                            {"decoder_input_tokens": tokens,
                                             "decoder_target_tokens": tokens}))
    with torch.no_grad():
        theirs = theirs_model(input_ids=torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)  # float32, merged vs adapted



def _hf_tensors(directory):
    """{name: array} of every .safetensors file of a Hugging Face directory."""
    from safetensors.numpy import load_file
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def _two_processes(args, logs):
    """`python -m t5lite.train args` as two processes of one run (one CPU device each);
    their exit statuses."""
    import sys
    port, procs = th.free_port(), []
    try:
        for i in range(2):
            procs.append(th.start([sys.executable, "-m", "t5lite.train", *args,
                                   f"--coordinator_address=127.0.0.1:{port}",
                                   "--process_count=2", f"--process_index={i}"],
                                  logs / f"{i}.log"))
        return [th.finish(p, timeout=300) for p in procs]
    finally:
        for p in procs:
            th.kill(p)


def test_two_processes_record_and_check_the_base_fingerprint(tmp_path, capsys, t5_base):
    """A LoRA run of two processes, the frozen base sharded over them (FSDP across the
    processes): both fingerprint the base as one process does, record it, and a resume
    whose base differs is refused in one line by each. The base is `t5_base`, shared
    with the in-process T5 test."""
    t5 = th.MODEL_FILES["t5"]
    base, run = t5_base, tmp_path / "lora"
    args = [f"--gin_file={th.REPO / t5}"] + [
        a if a.startswith("--") else f"--gin_file={th.REPO / a}" for a in COMMON] + T5_SMALL + [
        f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{base}"', *T5_LORA,
        "--gin.ICI_MESH_SHAPE=[1,1,1]", "--gin.DCN_MESH_SHAPE=[1,2,1]"]
    logs = lambda: "\n".join(th.tail(th.read_log(tmp_path / f"{i}.log")) for i in range(2))
    assert _two_processes(args + ["--gin.TRAIN_STEPS=2"], tmp_path) == [0, 0], logs()

    parsing.parse_gin([str(th.REPO / t5)], ["ACTIVATION_DTYPE = 'float32'",
                                             *[f[len("--gin."):] for f in T5_SMALL],
                                             "LORA_RANK = 4",
                                             "LORA_TARGETS = ['query', 'value', 'wi_0']"])
    cfg = parsing.resolve_macro("MODEL").config
    want = lora_restore.base_fingerprint(th.load_state(base, 1)["params"]["params"], cfg)
    data = json.loads((th.checkpoints_dir(run) / "2" / "data" / "metadata").read_text())
    assert data[lora_restore.KEY] == want and data[lora_restore.ALPHA_KEY] == 16.0
    got, base_params = _params(run, 2), _params(base, 1)
    for name in base_params:  # the sharded base, bit-identical after training
        np.testing.assert_array_equal(got[name], base_params[name], err_msg=name)

    _set_recorded(run, 2, "sha256:" + "0" * 64)
    rcs = _two_processes(args + ["--gin.TRAIN_STEPS=3"], tmp_path)
    assert rcs[0] == rcs[1] != 0, logs()
    for i in range(2):
        log = th.read_log(tmp_path / f"{i}.log")
        lines = [l for l in log.splitlines() if l.startswith("error:")]
        assert len(lines) == 1 and "sha256:000000000000" in lines[0] \
            and want[:19] in lines[0], log[-3000:]
    assert th.complete_steps(run) == [1, 2]
