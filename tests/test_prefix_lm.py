"""A decoder-only model on an inputs -> targets task (T5X's prefix LM): one sequence,
prompt then answer, the loss on the answer only; packed and unpacked alike.

The converter's output is checked against hand-written rows, the loss against a sum
computed here from the model's logits over the answer positions the examples define
(not the weights the converter wrote), and a packed row against the same examples
unpacked."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from t5lite.data.tf_env import import_tensorflow

tf = import_tensorflow()

import jax  # noqa: E402

from t5lite.data import pipeline  # noqa: E402
from t5lite.data.files import demo_corpus
from t5lite.data.sharding.layout import DataLayout  # noqa: E402
from t5lite.models.configs import DecoderConfig  # noqa: E402
from t5lite.models.model import DecoderOnlyModel  # noqa: E402

from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402

EXAMPLES = [{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
            {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]}]
LENGTHS = {"inputs": 7, "targets": 8}  # one sequence of 15 tokens
LLAMA_TINY = DecoderConfig(vocab_size=16, emb_dim=32, num_heads=4, num_kv_heads=2,
                           head_dim=8, num_layers=2, mlp_dim=48, dtype="float32")


def _convert(pack):
    ds = tf.data.Dataset.from_generator(
        lambda: iter(EXAMPLES), output_signature={
            "inputs": tf.TensorSpec([None], tf.int32),
            "targets": tf.TensorSpec([None], tf.int32)})
    converter = pipeline.feature_converter("decoder_only", pack, with_inputs=True)
    rows = list(converter(ds, LENGTHS).as_numpy_iterator())
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def _row(*tokens, width=15):
    return np.array(list(tokens) + [0] * (width - len(tokens)), np.int32)


def test_the_converter_joins_prompt_and_answer_with_the_loss_on_the_answer():
    plain = _convert(pack=False)
    np.testing.assert_array_equal(plain["decoder_target_tokens"],
                                  [_row(7, 8, 5, 1, 3, 9, 1), _row(8, 4, 9, 3, 1, 4, 1)])
    # shifted right by one, BOS 0 first (unpacked, the whole row shifts: its last token
    # is read where no loss is taken)
    np.testing.assert_array_equal(plain["decoder_input_tokens"],
                                  [_row(0, 7, 8, 5, 1, 3, 9, 1), _row(0, 8, 4, 9, 3, 1, 4, 1)])
    np.testing.assert_array_equal(plain["decoder_loss_weights"],
                                  [_row(0, 0, 0, 0, 1, 1, 1), _row(0, 0, 0, 0, 0, 1, 1)])
    # the prompt (BOS and the inputs), read by a bidirectional-prefix model
    np.testing.assert_array_equal(plain["decoder_causal_attention"],
                                  [_row(1, 1, 1, 1, 1), _row(1, 1, 1, 1, 1, 1)])
    packed = _convert(pack=True)
    np.testing.assert_array_equal(packed["decoder_target_tokens"],
                                  [_row(7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1)])
    np.testing.assert_array_equal(packed["decoder_input_tokens"],
                                  [_row(0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4)])
    np.testing.assert_array_equal(packed["decoder_loss_weights"],
                                  [_row(0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1)])
    np.testing.assert_array_equal(packed["decoder_segment_ids"],
                                  [_row(1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2)])
    np.testing.assert_array_equal(packed["decoder_positions"],
                                  [_row(0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6)])
    np.testing.assert_array_equal(packed["decoder_causal_attention"],
                                  [_row(1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1)])


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_the_loss_is_the_answer_tokens_only_and_packing_does_not_change_it():
    model = DecoderOnlyModel(LLAMA_TINY, z_loss=0.0)
    # jitted (init, logits, loss sums): op by op, each primitive compiled a program of its own
    params = jax.jit(model.init)(jax.random.PRNGKey(0))
    plain, packed = _convert(pack=False), _convert(pack=True)
    loss_sums = jax.jit(model.loss_sums)

    logp = _log_softmax(np.asarray(jax.jit(model.logits)(params, plain), np.float64))
    expected = 0.0
    for row, ex in enumerate(EXAMPLES):  # answer positions: after the prompt
        start = len(ex["inputs"])
        for j, token in enumerate(ex["targets"]):
            expected -= logp[row, start + j, token]
    loss_sum, sums = loss_sums(params, plain)
    np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-5)
    assert float(sums["weight_sum"]) == 5.0

    packed_sum, packed_sums = loss_sums(params, packed)
    np.testing.assert_allclose(float(packed_sum), float(loss_sum), rtol=1e-5)
    assert float(packed_sums["weight_sum"]) == 5.0


@pytest.fixture
def mnli(tmp_path, monkeypatch, tmp_path_factory):
    demo_corpus.write_glue_mnli(str(tmp_path / "MNLI"), train=6, dev=3)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), mnli_dir=tmp_path)
    yield
    reset_data_settings()


@pytest.mark.parametrize("pack", [False, True])
def test_a_decoder_only_iterator_reads_mnli_as_prompt_then_label(mnli, pack):
    from t5lite.data import tasks
    lengths = {"inputs": 64, "targets": 8}
    it = pipeline.make_iterator("mnli", split="train", feature_lengths=lengths,
                                layout=DataLayout(6), model_kind="decoder_only", pack=pack,
                                shuffle=False, seed=0)
    assert it.sequence_lengths == {"targets": 72}
    batch = next(it)
    expected = {"decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights",
                "decoder_causal_attention"}
    assert set(batch) == expected | ({"decoder_segment_ids", "decoder_positions"}
                                     if pack else set())
    assert batch["decoder_target_tokens"].shape[1] == 72
    examples = list(tasks.get_provider("mnli").get_dataset(
        lengths, split="train", shuffle=False).as_numpy_iterator())
    # every answer, and nothing else, carries loss weight: the label's tokens and its EOS
    weighted = [int(t) for t in batch["decoder_target_tokens"][batch["decoder_loss_weights"] > 0]]
    labels = [int(t) for ex in examples for t in ex["targets"]]
    assert weighted == labels[:len(weighted)] and len(weighted) >= len(examples[0]["targets"])
    if not pack:
        for row, ex in zip(batch["decoder_target_tokens"], examples):
            joined = list(ex["inputs"]) + list(ex["targets"])
            np.testing.assert_array_equal(row[:len(joined)], joined)
            assert not row[len(joined):].any()


LLAMA_PREFIX = dataclasses.replace(LLAMA_TINY, bidirectional_prefix=True)


def test_a_bidirectional_prefix_sees_its_whole_prompt_and_nothing_else_changes():
    """bidirectional_prefix: a prompt position reads later prompt tokens (off: it does
    not); answer positions stay causal; packed segments stay apart."""
    for cfg, both_ways in ((LLAMA_TINY, False), (LLAMA_PREFIX, True)):
        model = DecoderOnlyModel(cfg, z_loss=0.0)
        params = jax.jit(model.init)(jax.random.PRNGKey(0))  # jitted: op by op, a program an op
        logits = jax.jit(model.logits)
        for pack in (False, True):
            batch = _convert(pack)
            base = np.asarray(logits(params, batch))
            later_prompt = {**batch, "decoder_input_tokens":
                            batch["decoder_input_tokens"].copy()}
            later_prompt["decoder_input_tokens"][0, 3] = 11  # row 0's prompt: positions 0-4
            moved = np.abs(np.asarray(logits(params, later_prompt)) - base).max(-1)[0]
            assert (moved[:3] > 1e-6).any() == both_ways, (cfg.bidirectional_prefix, pack)
            assert moved[3:].max() > 1e-6
            later_answer = {**batch, "decoder_input_tokens":
                            batch["decoder_input_tokens"].copy()}
            later_answer["decoder_input_tokens"][0, 6] = 11  # row 0's answer
            moved = np.abs(np.asarray(logits(params, later_answer)) - base).max(-1)[0]
            assert moved[:6].max() == 0.0 and moved[6] > 1e-6
            if pack:  # the second segment (positions 7-13) sees nothing of the first
                assert moved[7:].max() == 0.0


def _greedy_without_cache(logits, prompt, new_tokens, width=16):
    """Full forward passes over the growing sequence, the prompt (BOS + inputs) marked,
    right-padded to `width` (unmarked padding is read by no earlier position)."""
    seq, out = [0] + list(prompt), []
    for _ in range(new_tokens):
        tokens, marked = np.zeros((1, width), np.int32), np.zeros((1, width), np.int32)
        tokens[0, :len(seq)] = seq
        marked[0, :len(prompt) + 1] = 1
        token = int(np.argmax(np.asarray(logits(tokens, marked))[0, len(seq) - 1]))
        out.append(token)
        if token == 1:
            break
        seq.append(token)
    return out + [0] * (new_tokens - len(out))


def test_decoding_a_bidirectional_prefix_with_the_cache_equals_full_passes():
    from t5lite.models.common import features
    model = DecoderOnlyModel(LLAMA_PREFIX)
    # jitted (init, decoding): op by op, each primitive compiled a program of its own
    params = jax.jit(model.init)(jax.random.PRNGKey(1))
    prompts = [ex["inputs"] for ex in EXAMPLES] + [[5, 1]]
    batch = features.decoder_only_features(prompts, {"inputs": 6, "targets": 5})
    predict = jax.jit(functools.partial(model.predict_batch, max_decode_length=5))
    tokens = np.asarray(predict(params, batch))
    logits = jax.jit(lambda t, m: model.logits(params, {"decoder_input_tokens": t,
                                                        "decoder_target_tokens": t,
                                                        "decoder_causal_attention": m}))
    for row, prompt in zip(tokens, prompts):
        assert row.tolist() == _greedy_without_cache(logits, prompt, 5)
