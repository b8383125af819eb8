"""A tokenizer with LLaMA's conventions (SentencePiece's defaults: unk 0, BOS 1, EOS 2, no
padding piece) used as it is: EXTRA_IDS=0 keeps its pieces (no sentinels), the model's
`bos_id` starts every training sequence and prompt, its `eos_id` (the vocabulary's EOS)
ends every sequence and stops decoding; a model and a vocabulary that disagree on EOS,
and span corruption without sentinels, are refused in one line."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jax  # noqa: E402

from t5lite.data import pipeline, settings, tasks  # noqa: E402,F401
from t5lite.data.files import demo_corpus
from t5lite.data.sharding.layout import DataLayout  # noqa: E402
from t5lite.errors import ConfigError  # noqa: E402
from t5lite.models.common import features  # noqa: E402
from t5lite.models.configs import DecoderConfig  # noqa: E402
from t5lite.models.model import DecoderOnlyModel  # noqa: E402

import train_helpers as th  # noqa: E402
from data_helpers import data_env, llama_vocabulary, reset_data_settings, vocabulary  # noqa: E402

PIECES = 400
LLAMA_TINY = DecoderConfig(vocab_size=PIECES, emb_dim=32, num_heads=4, num_kv_heads=2,
                           head_dim=8, num_layers=2, mlp_dim=48, dtype="float32",
                           bos_id=1, eos_id=2)
LENGTHS = {"inputs": 48, "targets": 8}


@pytest.fixture
def env(tmp_path, monkeypatch, tmp_path_factory):
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=12, dev=4)
    vocab = llama_vocabulary(tmp_path_factory)
    data_env(monkeypatch, tmp_path, vocab, mnli_dir=tmp_path / "multinli")
    monkeypatch.setenv("T5LITE_EXTRA_IDS", "0")
    yield dict(vocab=vocab, mnli=tmp_path / "multinli")
    reset_data_settings()


def _mnli(pack: bool, bos_id: int = 1):
    it = pipeline.make_iterator("mnli", split="train", feature_lengths=LENGTHS,
                                layout=DataLayout(4), model_kind="decoder_only", bos_id=bos_id,
                                pack=pack, shuffle=False, repeat=False)
    return it, next(it)


def test_the_vocabulary_keeps_its_pieces_and_special_ids(env, monkeypatch):
    from t5lite.data import vocabularies
    vocab = vocabularies.get_vocabulary()
    assert (vocab.vocab_size, vocab.extra_ids, vocab.eos_id, vocab.bos_id, vocab.unk_id) == \
        (PIECES, 0, 2, 1, 0)
    monkeypatch.delenv("T5LITE_EXTRA_IDS")
    assert vocabularies.get_vocabulary().vocab_size == PIECES + 100  # T5's default
    it, _ = _mnli(pack=False)
    assert it.vocabulary.vocab_size == PIECES + 100  # the tasks read the setting too


@pytest.mark.parametrize("pack", [False, True])
def test_training_sequences_start_with_the_models_bos_and_end_with_the_vocabularys_eos(
        env, pack):
    it, batch = _mnli(pack)
    assert it.vocabulary.vocab_size == PIECES
    targets, inputs = batch["decoder_target_tokens"], batch["decoder_input_tokens"]
    weights = batch["decoder_loss_weights"]
    starts = batch["decoder_positions"] == 0 if pack else \
        np.broadcast_to(np.arange(targets.shape[1]) == 0, targets.shape)
    if pack:
        starts &= batch["decoder_segment_ids"] > 0
    assert starts.sum() >= 4 and np.all(inputs[starts] == 1)  # BOS 1, not padding 0
    assert np.all(inputs[~starts & (targets > 0)] != 1)  # nowhere else in this text
    answer_ends = (weights > 0) & (np.pad(weights[:, 1:], ((0, 0), (0, 1))) == 0)
    assert answer_ends.sum() >= starts.sum()
    assert np.all(targets[answer_ends] == 2)  # every answer ends in EOS 2
    # the prompt (inputs) also ends in EOS 2, where no loss is taken
    assert np.sum((targets == 2) & (weights == 0)) >= starts.sum()
    # BOS 0 (the default) would be the unk piece here: the model's bos_id is what is used
    _, plain = _mnli(pack, bos_id=0)
    assert np.all(plain["decoder_input_tokens"][:, 0] == 0)


def test_inference_batches_start_with_the_models_bos():
    model = DecoderOnlyModel(LLAMA_TINY)
    prompt = model.inference_batch([[5, 6], [7]], {"inputs": 3})
    np.testing.assert_array_equal(prompt["decoder_input_tokens"], [[1, 5, 6, 0], [1, 7, 0, 0]])
    scored = model.inference_batch([[5, 6], []], {"inputs": 3, "targets": 2}, [[9, 2], [8, 2]])
    np.testing.assert_array_equal(scored["decoder_input_tokens"],
                                  [[1, 5, 6, 9, 2], [1, 8, 2, 0, 0]])
    assert features.decoder_only_features([[5]], {"inputs": 1})["decoder_input_tokens"][0, 0] == 0


def test_decoding_stops_at_the_models_eos():
    params = DecoderOnlyModel(LLAMA_TINY).init(jax.random.PRNGKey(0))
    batch = {"decoder_input_tokens": np.array([[1, 5, 6, 7]], np.int32)}
    free = np.asarray(DecoderOnlyModel(LLAMA_TINY).predict_batch(params, batch, eos_id=None))
    first = int(free[0, 0])
    assert first != 0 and np.any(free[0, 1:] != 0), free
    # the same parameters with the first greedy token as the model's EOS: it stops there
    stopper = DecoderOnlyModel(dataclasses.replace(LLAMA_TINY, eos_id=first))
    stopped = np.asarray(stopper.predict_batch(params, batch))
    np.testing.assert_array_equal(stopped[0], [first] + [0] * (free.shape[1] - 1))
    if first != 2:  # and eos 2 (the config's) does not stop it at that token
        np.testing.assert_array_equal(
            np.asarray(DecoderOnlyModel(LLAMA_TINY).predict_batch(params, batch))[0, :1],
            [first])


def test_a_model_and_a_vocabulary_with_another_eos_are_refused_in_one_line(
        env, tmp_path_factory):
    from t5lite.data import vocabularies
    t5_vocab = vocabularies.get_vocabulary(vocabulary(tmp_path_factory), extra_ids=100)
    with pytest.raises(ConfigError) as e:
        DecoderOnlyModel(dataclasses.replace(LLAMA_TINY, vocab_size=512)).check_vocabulary(
            t5_vocab)
    message = str(e.value)
    assert "\n" not in message and "EOS 1" in message and "with 2" in message, message
    assert "--gin.DecoderConfig.eos_id=1 --gin.DecoderConfig.bos_id=0" in message
    DecoderOnlyModel(LLAMA_TINY).check_vocabulary(vocabularies.get_vocabulary())  # agrees


@pytest.mark.parametrize("value", ["x", "-1", "1.5"])
def test_extra_ids_must_be_a_whole_number(env, monkeypatch, value):
    monkeypatch.setenv("T5LITE_EXTRA_IDS", value)
    with pytest.raises(ConfigError) as e:
        tasks.configured().resolve().extra_ids()
    assert "\n" not in str(e.value) and "EXTRA_IDS" in str(e.value) and repr(value) in \
        str(e.value)


def test_span_corruption_without_sentinels_is_refused_in_one_line(env, tmp_path, capsys):
    from t5lite import train
    demo_corpus.write_pile(str(tmp_path / "pile"), train_files=1, docs_per_file=8)
    code = train.main(["--gin_file=configs/models/t5_1_1/tiny.gin",
                       "--gin_file=configs/runs/pretrain.gin",
                       f'--gin.MODEL_DIR="{tmp_path / "run"}"',
                       "--gin.MIXTURE_OR_TASK_NAME='pile_span_corruption'",
                       "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
                       "--gin.T5Config.vocab_size=512", "--gin.T5Config.eos_id=2", "--gin.EXTRA_IDS=0",
                       "--gin.BATCH_SIZE=8", "--gin.TRAIN_STEPS=1",
                       f'--gin.PILE_DIR="{tmp_path / "pile"}"'])
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "sentinel" in lines[0] and "EXTRA_IDS" in lines[0], lines[0]
    assert th.complete_steps(tmp_path / "run") == []
