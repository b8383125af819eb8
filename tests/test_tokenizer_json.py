"""A Hugging Face tokenizer.json as the tasks' vocabulary (vocabularies.TokenizerJsonVocabulary,
over t5lite/data/files/tokenizer_file.py):
a byte-level BPE made by the `tokenizers` library as LLaMA-3's and Qwen's are (id 0 is
'!'). Its ids equal `tokenizers`' own on a thousand lines of mixed text, in Python and in
TensorFlow, and decode back; special ids come from tokenizer_config.json; a real id 0
keeps its loss weight through the feature converters, packed or not, where padding has
none; the pipeline saves and restores its position; a LLaMA-3.1-style model converted
from transformers finetunes on MultiNLI with it through the CLI and evaluates; what is
not a usable tokenizer.json is one line."""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from t5lite.data import features, pipeline, tasks, vocabularies  # noqa: F401
from t5lite.data.sharding.layout import DataLayout
from t5lite.data.files import demo_corpus
from t5lite.errors import ConfigError, VocabularyError

from data_helpers import byte_bpe_tokenizer, data_env, mixed_lines, reset_data_settings

tf = pytest.importorskip("tensorflow")
LENGTHS = {"inputs": 48, "targets": 8}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return byte_bpe_tokenizer(tmp_path_factory)


@pytest.fixture
def mnli_env(tmp_path, monkeypatch, tokenizer):
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=16, dev=4)
    data_env(monkeypatch, tmp_path, tokenizer, mnli_dir=tmp_path / "multinli")
    monkeypatch.setenv("T5LITE_EXTRA_IDS", "0")
    yield tmp_path / "multinli"
    reset_data_settings()


def test_ids_equal_tokenizers_own_and_decode_back(tokenizer):
    from tokenizers import Tokenizer
    theirs = Tokenizer.from_file(tokenizer)
    vocab = vocabularies.get_vocabulary(tokenizer, extra_ids=0)
    assert isinstance(vocab, vocabularies.TokenizerJsonVocabulary) and vocab.zero_is_token
    lines = mixed_lines(1000, seed=3)
    expected = [e.ids for e in theirs.encode_batch(lines, add_special_tokens=False)]
    assert [list(vocab.encode(line)) for line in lines] == expected
    assert sum(ids.count(0) for ids in expected) > 100  # '!' (id 0) is a token of this text
    # in TensorFlow (a task's stream) id 0 is written as the stand-in, one past the last id
    assert vocab.zero_stand_in == vocab.vocab_size
    in_tf = tf.data.Dataset.from_tensor_slices(lines).map(vocab.encode_tf)
    streamed = [x.tolist() for x in in_tf.as_numpy_iterator()]
    assert streamed == [[vocab.zero_stand_in if i == 0 else i for i in ids] for ids in expected]
    assert [vocab.decode(ids) for ids in expected] == lines
    assert [vocab.decode(ids) for ids in streamed] == lines
    # decoding stops at EOS (left out, as the padding after it); decode_tf likewise
    eos = vocab.eos_id
    rows = tf.constant([expected[0] + [eos, 0, 0], expected[0] + [0, eos, 5]])
    assert [t.decode() for t in vocab.decode_tf(rows).numpy()] == [lines[0], lines[0] + "!"]


def test_special_ids_from_tokenizer_config_or_the_families_names(tokenizer, tmp_path_factory,
                                                                 tmp_path):
    vocab = vocabularies.TokenizerJsonVocabulary(tokenizer)
    assert (vocab.bos_id, vocab.eos_id) == (vocab.vocab_size - 2, vocab.vocab_size - 1)
    plain = vocabularies.TokenizerJsonVocabulary(byte_bpe_tokenizer(tmp_path_factory,
                                                                      config=False))
    assert (plain.bos_id, plain.eos_id) == (vocab.bos_id, vocab.eos_id)  # by their names
    # Qwen's way: eos_token <|endoftext|>, no BOS
    shutil.copy(tokenizer, tmp_path / "tokenizer.json")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": None, "eos_token": "<|endoftext|>"}))
    qwen = vocabularies.TokenizerJsonVocabulary(str(tmp_path / "tokenizer.json"))
    assert qwen.eos_id == tok.token_to_id("<|endoftext|>") and qwen.bos_id == vocab.bos_id


@pytest.mark.parametrize("case, fragment", [
    ("not_json", "is not a Hugging Face tokenizer.json"),
    ("not_a_tokenizer", "is not a Hugging Face tokenizer.json"),
    ("no_eos", "has no EOS token"),
    ("config_names_absent_token", "names eos_token '<|im_end|>'"),
])
def test_what_is_not_a_usable_tokenizer_json_is_one_line(case, fragment, tmp_path, tokenizer):
    path = tmp_path / "tokenizer.json"
    if case == "not_json":
        path.write_bytes(b"\x00\x01 not json")
    elif case == "not_a_tokenizer":
        path.write_text(json.dumps({"vocab": {"a": 0}}))
    elif case == "no_eos":
        from tokenizers import Tokenizer, models
        Tokenizer(models.BPE(vocab={"!": 0, "a": 1}, merges=[])).save(str(path))
    else:
        shutil.copy(tokenizer, path)
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    vocabularies._check_model_file.cache_clear()
    with pytest.raises(VocabularyError) as e:
        vocabularies.resolve_path(str(path))
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


STAND_IN = 600  # a real id 0 as a task's stream writes it (one past a 600-id vocabulary)


def _rows(model_kind, pack, with_inputs, examples, lengths):
    """The feature converter's rows for token-id examples, their zeros written as the
    tokenizer.json vocabulary's encode_tf writes them."""
    def gen():
        for ex in examples:
            yield {k: np.where(v == 0, STAND_IN, v).astype(np.int32) for k, v in ex.items()}
    spec = {k: tf.TensorSpec([None], tf.int32) for k in examples[0]}
    ds = tf.data.Dataset.from_generator(gen, output_signature=spec)
    convert = features.feature_converter(model_kind, pack, with_inputs, bos_id=7,
                                         zero_stand_in=STAND_IN)
    return list(convert(ds, lengths).as_numpy_iterator())


@pytest.mark.parametrize("pack", [False, True], ids=["unpacked", "packed"])
def test_a_real_id_0_keeps_its_loss_weight_and_padding_has_none(pack):
    """LM rows ("!" = 0 inside and at the ends of sequences): the targets hold the zeros
    with weight 1, the padding is 0 with weight 0, inputs begin with BOS (7) and are the
    targets shifted right; packed, the segment ids count the sequences by their lengths."""
    seqs = [[0, 5, 0, 0, 9], [3, 0], [0]]
    rows = _rows("decoder_only", pack, False, [{"targets": np.array(s, np.int32)}
                                                for s in seqs], {"targets": 12})
    if pack:
        (row,) = rows
        joined = sum(seqs, [])
        np.testing.assert_array_equal(row["decoder_target_tokens"], joined + [0] * 4)
        np.testing.assert_array_equal(row["decoder_loss_weights"], [1] * 8 + [0] * 4)
        np.testing.assert_array_equal(row["decoder_segment_ids"],
                                      [1] * 5 + [2] * 2 + [3] + [0] * 4)
        np.testing.assert_array_equal(row["decoder_input_tokens"][[0, 5, 7]], [7, 7, 7])
        return
    for row, seq in zip(rows, seqs):
        n = len(seq)
        np.testing.assert_array_equal(row["decoder_target_tokens"], seq + [0] * (12 - n))
        np.testing.assert_array_equal(row["decoder_loss_weights"], [1] * n + [0] * (12 - n))
        np.testing.assert_array_equal(row["decoder_input_tokens"][:n], [7] + seq[:-1])


def test_a_prompt_and_answer_keep_their_zeros():
    """Prefix LM (an inputs -> targets task): the prompt's and the answer's zeros stay
    tokens, the loss weights cover the answer (zeros included) and nothing past it."""
    (row,) = _rows("decoder_only", False, True,
                   [{"inputs": np.array([0, 4, 0], np.int32),
                     "targets": np.array([0, 2], np.int32)}], {"inputs": 6, "targets": 4})
    np.testing.assert_array_equal(row["decoder_target_tokens"], [0, 4, 0, 0, 2] + [0] * 5)
    np.testing.assert_array_equal(row["decoder_loss_weights"], [0, 0, 0, 1, 1] + [0] * 5)
    np.testing.assert_array_equal(row["decoder_causal_attention"], [1, 1, 1, 1] + [0] * 6)


def test_the_mnli_pipeline_tokenizes_with_it_and_resumes_exactly(mnli_env, tokenizer):
    """MultiNLI for a decoder-only model read with the tokenizer.json: the rows hold its
    ids (the vocabulary's EOS ends each answer); the tf.data state saves (the stateless
    numpy_function) and a new iterator restored from it continues with the same rows."""
    def iterator():
        return pipeline.make_iterator("mnli", split="train", feature_lengths=LENGTHS,
                                      layout=DataLayout(4), model_kind="decoder_only",
                                      bos_id=520, pack=True, shuffle=True, seed=1)
    first = iterator()
    assert first.vocabulary.zero_is_token and first.vocabulary.eos_id == 521
    next(first)
    state = first.get_state()
    assert state.get("iterator"), "the tf.data state was not saved"
    expected = [next(first) for _ in range(2)]
    second = iterator()
    second.set_state(state)
    for want in expected:
        got = next(second)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    tokens = expected[0]["decoder_target_tokens"]
    assert (expected[0]["decoder_loss_weights"] > 0).sum() > 0 and tokens.max() < 522
    first.close()
    second.close()


def test_text_files_stream_as_the_tokenizer_reads_them(tmp_path, monkeypatch, tokenizer):
    """text_lm (the text pretraining recipes' task: documents joined, EOS after each, cut
    into rows by T5's `split_tokens`, which drops every 0 it sees) on a .jsonl of mixed
    lines with the tokenizer.json: the rows' weighted tokens are exactly the documents'
    ids and one EOS each, real zeros included."""
    from tokenizers import Tokenizer
    lines = [l for l in mixed_lines(40, seed=5) if l.strip()]
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps({"text": l}) + "\n"
                                                  for l in lines))
    data_env(monkeypatch, tmp_path, tokenizer, text_files=tmp_path / "notes.jsonl")
    monkeypatch.setenv("T5LITE_EXTRA_IDS", "0")
    try:
        it = pipeline.make_iterator("text_lm", split="train", feature_lengths={"targets": 64},
                                    layout=DataLayout(4), model_kind="decoder_only",
                                    bos_id=520, pack=True, shuffle=False, repeat=False,
                                    drop_remainder=False)
        rows = [(b["decoder_target_tokens"], b["decoder_loss_weights"]) for b in it]
        it.close()
    finally:
        reset_data_settings()
    streamed = [int(t) for tokens, weights in rows for row_t, row_w in zip(tokens, weights)
                for t, w in zip(row_t, row_w) if w > 0]
    theirs = Tokenizer.from_file(tokenizer)
    expected = [t for line in lines
                for t in theirs.encode(line, add_special_tokens=False).ids + [521]]
    assert sorted(streamed) == sorted(expected) and streamed.count(0) == expected.count(0) > 0


def test_a_model_smaller_than_the_vocabulary_refuses_it(tokenizer):
    """The tokenizer's 522 ids and T5's 100 extra ids (EXTRA_IDS left at its default)
    do not fit a 600-row embedding: one line naming the count."""
    from t5lite.models.configs import DecoderConfig
    from t5lite.models.model import DecoderOnlyModel
    vocab = vocabularies.get_vocabulary(tokenizer, extra_ids=100)
    model = DecoderOnlyModel(DecoderConfig(vocab_size=600, emb_dim=16, num_heads=2,
                                           head_dim=8, num_layers=1, mlp_dim=32,
                                           bos_id=vocab.bos_id, eos_id=vocab.eos_id))
    with pytest.raises(ConfigError, match=f"has {vocab.vocab_size} ids .* only 600"):
        model.check_vocabulary(vocab)
    assert vocab.vocab_size == 622


def test_an_encoder_decoder_model_refuses_it(mnli_env, tokenizer):
    from t5lite.models.configs import T5Config
    from t5lite.models.model import EncoderDecoderModel
    model = EncoderDecoderModel(T5Config(vocab_size=640, emb_dim=16, num_heads=2, head_dim=8,
                                         num_encoder_layers=1, num_decoder_layers=1,
                                         mlp_dim=32, eos_id=521))
    with pytest.raises(ConfigError, match="token of text at id 0"):
        model.check_vocabulary(vocabularies.get_vocabulary(tokenizer, extra_ids=0))


def test_a_llama3_model_finetunes_on_mnli_with_it_through_the_cli(mnli_env, tokenizer,
                                                                 tmp_path, capsys):
    """transformers' LlamaForCausalLM with LLaMA-3.1's RoPE scaling and the tokenizer's
    special ids -> `t5lite.convert --from=hf` -> `t5lite.train` with
    configs/finetune_mnli.gin and VOCABULARY_PATH = the tokenizer.json, decoding MultiNLI
    and scoring it at step 3 -> `t5lite.infer` on a prompt with '!' in it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from t5lite import convert, infer, train
    vocab = vocabularies.TokenizerJsonVocabulary(tokenizer)
    dev = mnli_env / "multinli_1.0_dev_matched.jsonl"  # every hypothesis ends in '!' (id 0)
    records = [json.loads(l) for l in dev.open()]
    dev.write_text("".join(json.dumps({**r, "sentence2": r["sentence2"].rstrip(".") + "!"})
                           + "\n" for r in records))
    torch.manual_seed(0)
    hf_in = tmp_path / "hf_in"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab.vocab_size, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, bos_token_id=vocab.bos_id, eos_token_id=vocab.eos_id,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32},
    )).eval().save_pretrained(str(hf_in), safe_serialization=True)
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    assert convert.main(["--from=hf", f"--input={hf_in}", f"--output={ckpt}",
                         "--dtype=float32"]) == 0
    model_gin = (ckpt / "model.gin").read_text()
    assert "rope_scaling = 'llama3'" in model_gin, model_gin
    common = [f'--gin.VOCABULARY_PATH="{tokenizer}"', "--gin.EXTRA_IDS=0",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}"]
    assert train.main([f"--gin_file={ckpt}/model.gin", "--gin_file=configs/finetune_mnli.gin",
                       f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"',
                       "--gin.BATCH_SIZE=8", "--gin.TRAIN_STEPS=3", "--gin.EVAL_PERIOD=3",
                       "--gin.CHECKPOINT_PERIOD=3", "--gin.CheckpointSettings.async_save=False",
                       f'--gin.MNLI_DIR="{mnli_env}"', *common]) == 0
    err = capsys.readouterr().err
    evals = [l for l in err.splitlines() if "[inference_eval]" in l]
    assert len(evals) == 1 and "mnli/accuracy" in evals[0], err[-2000:]
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("mnli hypothesis: Wow! premise: Ada built a boat!!\n")
    assert infer.main([f"--gin_file={ckpt}/model.gin", "--gin_file=configs/runs/infer.gin",
                       f'--gin.CHECKPOINT_PATH="{run}"', f'--gin.INPUT_FILE="{inputs}"',
                       f'--gin.OUTPUT_DIR="{tmp_path / "out"}"', "--gin.BATCH_SIZE=8",
                       *common]) == 0
    rows = [json.loads(l) for l in (tmp_path / "out" / "predictions.jsonl").open()]
    assert [r["inputs"] for r in rows] == [inputs.read_text().strip()]
    assert isinstance(rows[0]["prediction"], str)
    # the validation split through the task's stream (its '!' written as the stand-in)
    # and the same inputs as an INPUT_FILE (Python's ids) decode alike
    predicted = {}
    for name, flags in (("split", ["--gin.MIXTURE_OR_TASK_NAME='mnli'",
                                   "--gin.SPLIT='validation_matched'",
                                   f'--gin.MNLI_DIR="{mnli_env}"']),
                        ("file", [f'--gin.INPUT_FILE="{tmp_path / "split_inputs.txt"}"'])):
        assert infer.main([f"--gin_file={ckpt}/model.gin", "--gin_file=configs/runs/infer.gin",
                           f'--gin.CHECKPOINT_PATH="{run}"', "--gin.BATCH_SIZE=8",
                           f'--gin.OUTPUT_DIR="{tmp_path / name}"', *common, *flags]) == 0
        predicted[name] = [json.loads(l) for l in (tmp_path / name / "predictions.jsonl").open()]
        if name == "split":
            assert all("!" in r["inputs"] for r in predicted[name])
            (tmp_path / "split_inputs.txt").write_text(
                "".join(r["inputs"] + "\n" for r in predicted[name]))
    assert [r["prediction"] for r in predicted["split"]] == \
        [r["prediction"] for r in predicted["file"]]

    # t5lite.eval: MultiNLI's perplexity, and zero-shot Lambada (its last words scored
    # with the tokenizer's ids)
    from t5lite import eval as eval_cli
    demo_corpus.write_lambada(str(tmp_path / "lambada"), n=8)
    evals = {"perplexity": ["--gin.MODE='perplexity'", "--gin.MIXTURE_OR_TASK_NAME='mnli'",
                            "--gin.SPLIT='validation_matched'", f'--gin.MNLI_DIR="{mnli_env}"'],
             "zero_shot": ["--gin.MODE='zero_shot'", "--gin.MIXTURE_OR_TASK_NAME='lambada'",
                           f'--gin.LAMBADA_DIR="{tmp_path / "lambada"}"',
                           "--gin.TASK_FEATURE_LENGTHS={'inputs': 256, 'targets': 16}"]}
    for mode, flags in evals.items():
        out = tmp_path / f"eval_{mode}"
        assert eval_cli.main([f"--gin_file={ckpt}/model.gin", "--gin_file=configs/runs/eval.gin",
                              f'--gin.CHECKPOINT_PATH="{run}"', f'--gin.OUTPUT_DIR="{out}"',
                              "--gin.BATCH_SIZE=8", *common, *flags]) == 0, mode
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["mode"] == mode and metrics["step"] == 3, metrics
    assert np.isfinite(json.loads((tmp_path / "eval_perplexity" / "metrics.json").read_text())
                       ["metrics"]["mnli"]["loss"])


def test_bad_input_through_the_commands_is_one_line(tmp_path, capsys, mnli_env, tokenizer):
    """`t5lite.convert --from=hf` of a config with another RoPE scaling, and `t5lite.info`
    with a VOCABULARY_PATH that is no tokenizer.json: one `error:` line, a non-zero exit."""
    from t5lite import convert, train
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({
        "model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    (hf_dir / "model.safetensors").write_bytes(b"")
    assert convert.main(["--from=hf", f"--input={hf_dir}", f"--output={tmp_path / 'c'}"]) != 0
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    assert train.main(["--gin_file=models/llama3/tiny.gin", "--gin_file=configs/finetune_mnli.gin",
                       f'--gin.MODEL_DIR="{tmp_path / "run"}"', "--gin.TRAIN_STEPS=1",
                       f'--gin.INITIAL_CHECKPOINT_PATH="{tmp_path / "none"}"',
                       f'--gin.VOCABULARY_PATH="{bad}"', "--gin.EXTRA_IDS=0"]) != 0
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(lines) == 2, lines
    assert "rope type 'yarn'" in lines[0] and "not a Hugging Face tokenizer.json" in lines[1]
    assert not (tmp_path / "c").exists() and not (tmp_path / "run" / "checkpoints").exists()
