"""A decoder-only model evaluated on an inputs -> targets task split (`t5lite.eval`):
each example's prompt is BOS + its inputs (as its prefix-LM training sequence starts),
decoded with the KV cache; the predictions equal greedy decoding done here step by step
with full forward passes and no cache, and the metrics are the task's own over them.

A tiny LLaMA with random parameters (saved with checkpoint_format.save_params) and a
MultiNLI jsonl fixture; runs call `main(argv)` in this process, error cases run as
subprocesses."""
from __future__ import annotations

import json

import numpy as np
import pytest

import jax  # noqa: E402

from t5lite.config import parsing  # noqa: E402
from t5lite.data import demo_corpus  # noqa: E402
from t5lite.data import tasks  # noqa: E402  (t5 registers gin configurables: before parsing)
from t5lite.interop import checkpoint_format  # noqa: E402
from t5lite.models.decoding import EOS_ID  # noqa: E402

from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402

MODEL_FILE = "configs/models/llama2/tiny.gin"
VOCAB = 512
LENGTHS = {"inputs": 64, "targets": 8}
BATCH = 8
DEV = 11  # validation_matched examples: a padded last batch


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    vocab_path = vocabulary(tmp_path_factory)
    root = tmp_path_factory.mktemp("deconly")
    demo_corpus.write_multinli(str(root / "multinli"), train=6, dev=DEV)
    parsing.parse_gin([MODEL_FILE], [f"DecoderConfig.vocab_size = {VOCAB}",
                                     "ACTIVATION_DTYPE = 'float32'"])
    model = parsing.resolve_macro("MODEL")
    variables = model.init(jax.random.PRNGKey(5))
    checkpoint_format.save_params(root / "ckpt", variables, step=3)
    return dict(vocab=vocab_path, mnli=root / "multinli", ckpt=root / "ckpt", model=model,
                variables=variables)


@pytest.fixture(autouse=True)
def _env(setup, monkeypatch, tmp_path):
    data_env(monkeypatch, tmp_path, setup["vocab"], mnli_dir=setup["mnli"])
    yield
    reset_data_settings()


def _flags(setup, out, *extra):
    return [f"--gin_file={MODEL_FILE}", f"--gin.DecoderConfig.vocab_size={VOCAB}",
            "--gin.ACTIVATION_DTYPE='float32'", f'--gin.CHECKPOINT_PATH="{setup["ckpt"]}"',
            f'--gin.OUTPUT_DIR="{out}"', f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}",
            f"--gin.BATCH_SIZE={BATCH}", f'--gin.VOCABULARY_PATH="{setup["vocab"]}"',
            f'--gin.MNLI_DIR="{setup["mnli"]}"', "--gin.MIXTURE_OR_TASK_NAME='mnli'",
            "--gin.SPLIT='validation_matched'", *extra]


def _greedy_without_cache(logits_fn, prompt, new_tokens):
    """Greedy continuation of `prompt` by full forward passes over the growing sequence
    (right-padded to one width: a causal model's earlier positions do not see padding)."""
    seq, out = list(prompt), []
    width = len(prompt) + new_tokens
    for _ in range(new_tokens):
        tokens = np.zeros((1, width), np.int32)
        tokens[0, :len(seq)] = seq
        token = int(np.argmax(np.asarray(logits_fn(tokens))[0, len(seq) - 1]))
        out.append(token)
        if token == EOS_ID:
            break
        seq.append(token)
    return out


def _dev_inputs(setup):
    """The task's validation_matched inputs as token ids (trimmed, EOS appended)."""
    from t5lite.data import edge
    edge.import_tasks()
    ds = tasks.get_provider("mnli").get_dataset(LENGTHS, split="validation_matched",
                                                shuffle=False)
    return [[int(t) for t in ex["inputs"]] for ex in ds.as_numpy_iterator()]


def test_eval_decodes_bos_plus_inputs_as_greedy_decoding_without_the_cache(setup, tmp_path):
    from t5lite import eval as eval_module
    from t5lite.data import vocabularies
    out = tmp_path / "eval"
    assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(setup, out)) == 0
    rows = [json.loads(l) for l in (out / "eval" / "mnli_predictions.jsonl").read_text()
            .splitlines()]
    assert len(rows) == DEV
    vocab = vocabularies.get_vocabulary(str(setup["vocab"]))
    inputs = _dev_inputs(setup)
    assert len(inputs) == DEV
    model, variables = setup["model"], setup["variables"]
    logits_fn = jax.jit(lambda t: model.logits(variables, {"decoder_input_tokens": t,
                                                           "decoder_target_tokens": t}))
    width = LENGTHS["inputs"] + 1  # every prompt padded to BOS + the longest inputs
    expected = [vocab.decode(_greedy_without_cache(
        lambda t: logits_fn(np.pad(t, ((0, 0), (0, width + LENGTHS["targets"] - t.shape[1])))),
        [0] + ids, LENGTHS["targets"])) for ids in inputs]
    assert len(set(expected)) > 2, expected  # the prompts matter to this random model
    assert [r["prediction"] for r in rows] == expected
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    accuracy = 100 * np.mean([r["postprocessed"] == r["target"] for r in rows])
    assert metrics["mnli"]["accuracy"] == pytest.approx(accuracy)
