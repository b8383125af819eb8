"""The Hugging Face round trip of a finetuned decoder-only model with LLaMA's own kind of
tokenizer: a transformers Llama (random, safetensors; BOS 1, EOS 2) -> `t5lite.convert
--from=hf` (its model.gin carries bos_id 1 / eos_id 2) -> `t5lite.train` with
configs/finetune_mnli.gin from it, on a LLaMA-style SentencePiece model (unk 0, BOS 1,
EOS 2) with EXTRA_IDS=0, evaluating by decoding -> `t5lite.convert --to=hf` of the
finetuned MODEL_DIR -> transformers loads it (BOS 1, EOS 2) and gives the logits t5lite
gives with the finetuned training state (float32, max |difference| <= 1e-4 over real
positions)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402

from t5lite.data import tasks  # noqa: E402,F401  (t5's gin configurables first)
from t5lite.data.files import demo_corpus

import train_helpers as th  # noqa: E402
from data_helpers import data_env, llama_vocabulary, reset_data_settings  # noqa: E402

VOCAB = 400  # the tokenizer's pieces, no extra ids (EXTRA_IDS=0)
TOL = 1e-4


@pytest.fixture
def env(tmp_path, monkeypatch, tmp_path_factory):
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=16, dev=4)
    vocab = llama_vocabulary(tmp_path_factory)
    data_env(monkeypatch, tmp_path, vocab, mnli_dir=tmp_path / "multinli")
    yield dict(vocab=vocab, mnli=tmp_path / "multinli")
    reset_data_settings()


def test_a_converted_llama_finetuned_on_mnli_exports_back_with_the_same_logits(env, tmp_path,
                                                                             capsys):
    import json
    from t5lite import convert, train
    torch.manual_seed(0)
    hf_in = tmp_path / "hf_in"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        max_position_embeddings=256)).eval().save_pretrained(str(hf_in),
                                                             safe_serialization=True)
    ckpt, run, hf_out = tmp_path / "ckpt", tmp_path / "run", tmp_path / "hf_out"
    assert convert.main(["--from=hf", f"--input={hf_in}", f"--output={ckpt}",
                         "--dtype=float32"]) == 0
    model_gin = (ckpt / "model.gin").read_text()
    assert "DecoderConfig.bos_id = 1" in model_gin and "DecoderConfig.eos_id = 2" in model_gin
    assert train.main([f"--gin_file={ckpt}/model.gin", "--gin_file=configs/finetune_mnli.gin",
                       f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"',
                       "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
                       "--gin.BATCH_SIZE=8", "--gin.TRAIN_STEPS=3", "--gin.EVAL_PERIOD=3",
                       "--gin.EXTRA_IDS=0",
                       "--gin.CHECKPOINT_PERIOD=3", "--gin.CheckpointSettings.async_save=False",
                       "--gin.adafactor.learning_rate=1e-2",
                       f'--gin.VOCABULARY_PATH="{env["vocab"]}"',
                       f'--gin.MNLI_DIR="{env["mnli"]}"']) == 0
    evals = [l for l in capsys.readouterr().err.splitlines() if "[inference_eval]" in l]
    assert len(evals) == 1 and "mnli/accuracy" in evals[0], evals  # decoded and scored
    assert convert.main(["--to=hf", f"--input={run}", f"--output={hf_out}",
                         f"--gin_file={ckpt}/model.gin"]) == 0
    exported = json.loads((hf_out / "config.json").read_text())
    assert (exported["bos_token_id"], exported["eos_token_id"]) == (1, 2)

    theirs_model = transformers.LlamaForCausalLM.from_pretrained(str(hf_out)).eval()
    before = transformers.LlamaForCausalLM.from_pretrained(str(hf_in)).eval()
    moved = [n for n, p in theirs_model.state_dict().items()
             if not torch.equal(p, before.state_dict()[n])]
    assert len(moved) > 10, moved  # finetuning changed the weights that went out

    from t5lite.config import parsing
    parsing.parse_gin([f"{ckpt}/model.gin"])
    model = parsing.resolve_macro("MODEL")
    params = th.load_state(run, 3)["params"]  # the finetuned training state: {"params": ...}
    rng = np.random.RandomState(1)
    tokens = rng.randint(2, VOCAB, size=(3, 40)).astype(np.int32)
    valid = np.arange(40)[None, :] < np.array([40, 17, 29])[:, None]
    tokens = tokens * valid
    ours = np.asarray(jax.jit(model.logits)(params, {"decoder_input_tokens": tokens,
                                                      "decoder_target_tokens": tokens}))
    with torch.no_grad():
        theirs = theirs_model(input_ids=torch.tensor(tokens, dtype=torch.long),
                              attention_mask=torch.tensor(valid, dtype=torch.long)
                              ).logits.float().numpy()
    diff = float(np.max(np.abs(ours - theirs)[valid]))
    print(f"\nfinetuned t5lite -> HF Llama: max |logit diff| = {diff:.3g}")
    assert diff <= TOL


def test_export_bad_input_is_one_line(env, tmp_path, capsys):
    from t5lite import convert
    assert convert.main(["--to=hf", f"--input={tmp_path / 'nothing'}",
                         f"--output={tmp_path / 'out'}",
                         "--gin_file=configs/models/llama2/tiny.gin"]) == 2
    assert convert.main(["--to=hf", f"--input={tmp_path}", f"--output={tmp_path / 'out'}"]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if l]
    assert len(lines) == 2 and all(l.startswith("error:") for l in lines), lines
    assert "does not exist" in lines[0] or "no checkpoint" in lines[0], lines[0]
    assert "--gin_file" in lines[1]
