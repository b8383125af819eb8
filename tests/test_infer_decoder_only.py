"""`python -m t5lite.infer` with decoder-only models (tiny LLaMA with GQA and RoPE, tiny GPT
with learned positions; each cut to one layer, with a 512-entry vocabulary): predictions
equal a step-by-step argmax continuation computed with full forward passes (no KV cache;
each prompt a row right-padded to one width, which a causal model's earlier positions do
not see), of raw prompts (a checkpoint without a recorded task) or of a
named task's inputs (EOS appended); scores equal log-softmax sums over the target
positions, and prompts beyond the positions end in one `error:` line.
(tests/test_infer_file_agreement.py: a finetuned model's file inputs against the task's.)"""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("seqio")
pytest.importorskip("t5")  # registers its gin configurables before any config is locked

import jax  # noqa: E402

from t5lite.config import parsing  # noqa: E402
from t5lite.interop import checkpoint_format  # noqa: E402
from t5lite.models import decoding  # noqa: E402
from t5lite.data.files import demo_corpus  # noqa: E402

import model_helpers as mh  # noqa: E402
from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402

VOCAB = 512
LAYERS = 1  # (the tiny models' 2 cut to 1: the same code paths, half the programs)
LENGTHS = {"inputs": 24, "targets": 8}
BATCH = 8
MODEL_FILES = {"llama": "configs/models/llama2/tiny.gin", "gpt": "configs/models/gpt/tiny.gin"}


def _model(kind):
    parsing.parse_gin([MODEL_FILES[kind]], [f"DecoderConfig.vocab_size = {VOCAB}",
                                              f"DecoderConfig.num_layers = {LAYERS}",
                                              "ACTIVATION_DTYPE = 'float32'"])
    return parsing.resolve_macro("MODEL")


@pytest.fixture(scope="module", params=["llama", "gpt"])
def setup(request, tmp_path_factory):
    kind = request.param
    root = tmp_path_factory.mktemp(f"dec_{kind}")
    model = _model(kind)
    variables = jax.jit(model.init)(jax.random.PRNGKey(11))  # one program, not op by op
    checkpoint_format.save_params(root / "ckpt", variables, step=3)
    return dict(kind=kind, model=model, variables=variables, ckpt=root / "ckpt",
                vocab=vocabulary(tmp_path_factory), logits=mh.full_forward(model, variables))


@pytest.fixture(autouse=True)
def _env(setup, monkeypatch, tmp_path):
    data_env(monkeypatch, tmp_path, setup["vocab"])
    yield
    reset_data_settings()


def _flags(setup, out, *extra):
    return ["--gin_file=configs/runs/infer.gin", f"--gin_file={MODEL_FILES[setup['kind']]}",
            f"--gin.DecoderConfig.vocab_size={VOCAB}", f"--gin.DecoderConfig.num_layers={LAYERS}",
            "--gin.ACTIVATION_DTYPE='float32'",
            f'--gin.CHECKPOINT_PATH="{setup["ckpt"]}"', f'--gin.OUTPUT_DIR="{out}"',
            f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}", f"--gin.BATCH_SIZE={BATCH}",
            f'--gin.VOCABULARY_PATH="{setup["vocab"]}"', *extra]


def _infer(setup, out, *extra):
    from t5lite import infer
    return infer.main(_flags(setup, out, *extra))


def _vocab(setup):
    from t5lite.data import vocabularies
    return vocabularies.get_vocabulary(str(setup["vocab"]))


def _prompts(n):
    """Texts of different lengths, some longer than the prompt window (kept: the end)."""
    w = demo_corpus._Writer(4)  # noqa: SLF001
    return [w.paragraph(1 + i % 3) for i in range(n)]


def _reference_continuations(setup, prompts):
    """Greedy continuation of each prompt (token ids) by full forward passes: BOS + its last
    `inputs` tokens, continued until EOS or `targets` tokens (mh.greedy_without_cache)."""
    return mh.greedy_without_cache(
        setup["logits"], [[0] + list(ids)[-LENGTHS["inputs"]:] for ids in prompts],
        LENGTHS["targets"], 1 + LENGTHS["inputs"] + LENGTHS["targets"], decoding.EOS_ID)


def test_decoder_only_predict_continues_prompts(setup, tmp_path, capsys):
    """A checkpoint no training run recorded a task for (save_params: no config.gin),
    as a converted pretrained LM: each line is a raw prompt, continued as it is, and the
    log says so (and how to name the task a finetuned model needs)."""
    texts = _prompts(11)  # not a multiple of BATCH: a padded last batch
    path = tmp_path / "prompts.txt"
    path.write_text("".join(t + "\n" for t in texts))
    out = tmp_path / "out"
    capsys.readouterr()
    assert _infer(setup, out, f'--gin.INPUT_FILE="{path}"') == 0
    err = capsys.readouterr().err
    assert "no known task says how the model was trained" in err and "MIXTURE_OR_TASK_NAME" in err
    rows = [json.loads(l) for l in (out / "predictions.jsonl").open()]
    assert [r["inputs"] for r in rows] == texts
    vocab = _vocab(setup)
    assert any(len(vocab.encode(t)) > LENGTHS["inputs"] for t in texts)
    expected = [vocab.decode(new) for new in _reference_continuations(
        setup, [vocab.encode(t) for t in texts])]
    assert [r["prediction"] for r in rows] == expected
    assert any(r["prediction"] for r in rows)


def test_a_named_tasks_inputs_end_in_eos(setup, tmp_path):
    """MIXTURE_OR_TASK_NAME='mnli' with INPUT_FILE: each line is processed as the task's
    inputs (the first inputs - 1 tokens, then EOS), as in its prefix-LM training
    sequence; RAW_PROMPTS=True continues the same lines as they are."""
    from t5lite.models.common import features
    texts = _prompts(9)
    path = tmp_path / "prompts.txt"
    path.write_text("".join(t + "\n" for t in texts))
    vocab = _vocab(setup)
    assert any(len(vocab.encode(t)) > LENGTHS["inputs"] for t in texts)
    out = tmp_path / "task"
    assert _infer(setup, out, f'--gin.INPUT_FILE="{path}"',
                  "--gin.MIXTURE_OR_TASK_NAME='mnli'") == 0
    rows = [json.loads(l) for l in (out / "predictions.jsonl").open()]
    expected = [vocab.decode(new) for new in _reference_continuations(
        setup, [features.tokenize(vocab, t, LENGTHS["inputs"]) for t in texts])]
    assert [r["prediction"] for r in rows] == expected
    raw = tmp_path / "raw"
    assert _infer(setup, raw, f'--gin.INPUT_FILE="{path}"', "--gin.MIXTURE_OR_TASK_NAME='mnli'",
                  "--gin.RAW_PROMPTS=True") == 0
    raw_rows = [json.loads(l) for l in (raw / "predictions.jsonl").open()]
    assert [r["prediction"] for r in raw_rows] == [
        vocab.decode(new) for new in _reference_continuations(
            setup, [vocab.encode(t) for t in texts])]
    assert [r["prediction"] for r in raw_rows] != expected


def test_decoder_only_score_is_the_continuation_log_likelihood(setup, tmp_path):
    texts = _prompts(9)
    targets = [" ".join(t.split()[:3]) for t in reversed(texts)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"inputs": i, "targets": t}) + "\n"
                            for i, t in zip(texts, targets)))
    out = tmp_path / "out"
    assert _infer(setup, out, f'--gin.INPUT_FILE="{path}"', "--gin.MODE='score'") == 0
    rows = [json.loads(l) for l in (out / "predictions.jsonl").open()]
    vocab = _vocab(setup)
    pairs = [(list(vocab.encode(text))[-LENGTHS["inputs"]:],
              list(vocab.encode(target))[:LENGTHS["targets"]]) for text, target in
             zip(texts, targets)]
    # each pair a row of one forward pass, right-padded (unseen by the earlier positions)
    seqs = np.zeros((len(pairs), 1 + LENGTHS["inputs"] + LENGTHS["targets"]), np.int32)
    for i, (prompt, tgt) in enumerate(pairs):
        seqs[i, :len(prompt) + len(tgt)] = [0] + prompt + tgt[:-1]
    all_logits = np.asarray(setup["logits"](seqs))
    assert len(rows) == len(pairs)
    for row, target, (prompt, tgt), logits in zip(rows, targets, pairs, all_logits):
        logp = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1,
                                      keepdims=True)) - logits.max(-1, keepdims=True)
        ref = sum(logp[len(prompt) + k, t] for k, t in enumerate(tgt))
        assert row["score"] == pytest.approx(ref, rel=1e-4, abs=1e-3)
        assert row["targets"] == target


def test_prompt_and_new_tokens_past_learned_positions_are_one_line(setup, tmp_path, capsys):
    if setup["kind"] != "gpt":
        pytest.skip("RoPE has no position limit")
    from t5lite import infer
    out = tmp_path / "out"
    path = tmp_path / "prompts.txt"
    path.write_text("hello\n")
    code = infer.main(_flags(setup, out, f'--gin.INPUT_FILE="{path}"',
                             "--gin.TASK_FEATURE_LENGTHS={'inputs': 500, 'targets': 100}"))
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert code != 0 and len(lines) == 1, err
    assert all(n in lines[0] for n in ("600", "max_length 512")), lines[0]
    assert not (out / "predictions.jsonl").exists()
