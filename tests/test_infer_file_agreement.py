"""`python -m t5lite.infer` on a file of inputs processes each line exactly as the model's
training task processed its inputs (issue 39, part 3), for both families: a tiny T5 and a
tiny LLaMA, each briefly finetuned on a MultiNLI fixture with `configs/finetune_mnli.gin`,
predict on a text file (and a jsonl file) holding the validation inputs exactly what
`t5lite.eval` predicts on the task's split, with no task named: infer reads it from the
run's MODEL_DIR/config.gin. The token ids of each line equal the task pipeline's; the
scores of a jsonl file of the split's pairs add up to `t5lite.eval`'s perplexity of the
split; and a decoder-only model given the same lines as raw prompts (RAW_PROMPTS, no EOS:
what infer did before) predicts otherwise.

One module-scoped finetune per family (about 10 s each on 2 cores); runs call `main(argv)`
in this process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("seqio")
pytest.importorskip("t5")  # registers its gin configurables before any config is locked

import jax  # noqa: E402

from t5lite.config import parsing  # noqa: E402
from t5lite.data.files import demo_corpus  # noqa: E402
from t5lite.interop import checkpoint_format  # noqa: E402

import model_helpers as mh  # noqa: E402
from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402

FAMILIES = {"t5": ("configs/models/t5_1_1/tiny.gin", "T5Config"),
            "llama": ("configs/models/llama2/tiny.gin", "DecoderConfig")}
# inputs 64: some MNLI inputs are longer, so the task's trimming (the first 63 tokens,
# then EOS) is exercised too
LENGTHS = {"inputs": 64, "targets": 10}
DEV = 24
STEPS = 60
LABELS = ("entailment", "neutral", "contradiction")


def _bindings(kind):
    """The family's tiny model cut to 512 entries and one layer a stack (mh.SMALL): what is
    under test is how each line is processed, not the model's size."""
    return mh.small_bindings(FAMILIES[kind][1])


def _model_flags(kind):
    model_file, config = FAMILIES[kind]
    return [f"--gin_file={model_file}", *mh.small_flags(config),
            "--gin.ACTIVATION_DTYPE='float32'"]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def trained(request, tmp_path_factory):
    """A tiny model of each family finetuned on MNLI from a random init: its MODEL_DIR
    (with config.gin naming the task), and the data it was trained on."""
    kind = request.param
    vocab_path = vocabulary(tmp_path_factory)
    root = tmp_path_factory.mktemp(f"agree_{kind}")
    demo_corpus.write_multinli(str(root / "multinli"), train=400, dev=DEV)
    model_file, _ = FAMILIES[kind]
    parsing.parse_gin([model_file], _bindings(kind) + ["ACTIVATION_DTYPE = 'float32'"])
    model = parsing.resolve_macro("MODEL")
    checkpoint_format.save_params(root / "init", model.init(jax.random.PRNGKey(2)), step=0)
    with pytest.MonkeyPatch.context() as mp:
        data_env(mp, root, vocab_path, mnli_dir=root / "multinli")
        from t5lite import train
        code = train.main(_model_flags(kind) + [
            "--gin_file=configs/finetune_mnli.gin", f'--gin.MODEL_DIR="{root / "run"}"',
            f'--gin.INITIAL_CHECKPOINT_PATH="{root / "init"}"',
            f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}", "--gin.BATCH_SIZE=16",
            f"--gin.TRAIN_STEPS={STEPS}", "--gin.EVAL_PERIOD=None",
            f"--gin.CHECKPOINT_PERIOD={STEPS}", "--gin.CheckpointSettings.async_save=False",
            "--gin.adafactor.learning_rate=1e-2", "--gin.DROPOUT_RATE=0.0",
            f'--gin.VOCABULARY_PATH="{vocab_path}"'])
        reset_data_settings()
    assert code == 0
    return dict(kind=kind, run=root / "run", vocab=vocab_path, mnli=root / "multinli")


@pytest.fixture(autouse=True)
def _env(trained, monkeypatch, tmp_path):
    data_env(monkeypatch, tmp_path, trained["vocab"], mnli_dir=trained["mnli"])
    yield
    reset_data_settings()


def _flags(trained, out, *extra):
    return _model_flags(trained["kind"]) + [
        f'--gin.CHECKPOINT_PATH="{trained["run"]}"', f'--gin.OUTPUT_DIR="{out}"',
        f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}", "--gin.BATCH_SIZE=8",
        f'--gin.VOCABULARY_PATH="{trained["vocab"]}"', *extra]


def _eval(trained, out, *extra):
    from t5lite import eval as eval_module
    return eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(
        trained, out, "--gin.MIXTURE_OR_TASK_NAME='mnli'", "--gin.SPLIT='validation_matched'",
        *extra))


def _infer(trained, out, *extra):
    from t5lite import infer
    return infer.main(["--gin_file=configs/runs/infer.gin"] + _flags(trained, out, *extra))


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def evaluated(trained, tmp_path_factory):
    """`t5lite.eval`'s predictions on the task's validation_matched split."""
    out = tmp_path_factory.mktemp(f"eval_{trained['kind']}")
    with pytest.MonkeyPatch.context() as mp:
        data_env(mp, out, trained["vocab"], mnli_dir=trained["mnli"])
        assert _eval(trained, out) == 0
        reset_data_settings()
    return _rows(out / "eval" / "mnli_predictions.jsonl")


def test_infer_on_a_file_predicts_what_eval_predicts_on_the_task(trained, evaluated, tmp_path,
                                                               capsys):
    assert len(evaluated) == DEV
    # the model learned the task: its predictions are label words, and not all one
    predictions = [r["prediction"] for r in evaluated]
    assert sum(p in LABELS for p in predictions) >= DEV * 3 // 4, predictions
    assert len(set(predictions)) > 1, predictions
    inputs = [r["inputs"] for r in evaluated]
    txt = tmp_path / "inputs.txt"
    txt.write_text("".join(t + "\n" for t in inputs))
    jl = tmp_path / "inputs.jsonl"
    jl.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in inputs))
    for path in (txt, jl):
        out = tmp_path / path.suffix[1:]
        capsys.readouterr()
        assert _infer(trained, out, f'--gin.INPUT_FILE="{path}"') == 0
        rows = _rows(out / "predictions.jsonl")
        assert [r["inputs"] for r in rows] == inputs
        assert [r["prediction"] for r in rows] == predictions  # all DEV of them
        assert "processed as the inputs of 'mnli' (the task recorded in" in \
            capsys.readouterr().err
        job = json.loads((out / "predictions.job.json").read_text())
        assert job["processed_as"] == {"task": "mnli",
                                       "add_eos": {"inputs": True, "targets": True}}


def test_a_files_token_ids_are_the_task_pipelines(trained, tmp_path):
    """The ids infer makes of each record of a jsonl file of the split's pairs equal the
    `inputs` and `targets` the task's own preprocessing makes of that example (trimmed,
    EOS appended), inputs longer than the inputs length included."""
    from t5lite.data import edge, vocabularies
    from t5lite.inference import file_inputs
    tasks = edge.import_tasks()
    ds = tasks.get_provider("mnli").get_dataset(LENGTHS, split="validation_matched",
                                                shuffle=False)
    examples = list(ds.as_numpy_iterator())
    assert len(examples) == DEV
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"inputs": ex["inputs_pretokenized"].decode(),
                                         "targets": ex["targets_pretokenized"].decode()})
                             + "\n" for ex in examples))
    model_file, _ = FAMILIES[trained["kind"]]
    parsing.parse_gin([model_file], _bindings(trained["kind"]))
    model = parsing.resolve_macro("MODEL")
    rule = file_inputs.file_inputs(model, task_name=None, checkpoint_path=str(trained["run"]),
                                   raw_prompts=False)
    assert rule.task == "mnli"
    got = list(file_inputs.tokenized_file(str(pairs), "score", rule, LENGTHS, model))
    assert [ex["inputs_ids"] for ex in got] == [[int(t) for t in ex["inputs"]]
                                                for ex in examples]
    assert [ex["targets_ids"] for ex in got] == [[int(t) for t in ex["targets"]]
                                                 for ex in examples]
    vocab = vocabularies.get_vocabulary()
    assert any(len(vocab.encode(ex["inputs"])) >= LENGTHS["inputs"] for ex in got), \
        "no input reaches the inputs length: the trimming is untested"


def test_scores_of_a_files_pairs_add_up_to_the_splits_perplexity(trained, evaluated, tmp_path):
    """MODE 'score' on a jsonl file of the split's (inputs, targets) pairs: the summed
    scores over the counted tokens are `t5lite.eval`'s loss on the split (the targets
    end in EOS, as the task's do)."""
    out = tmp_path / "ppl"
    assert _eval(trained, out, "--gin.MODE='perplexity'") == 0
    ppl = json.loads((out / "metrics.json").read_text())["metrics"]["mnli"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"inputs": r["inputs"], "targets": LABELS[r["target"]]})
                             + "\n" for r in evaluated))
    assert _infer(trained, tmp_path / "score", f'--gin.INPUT_FILE="{pairs}"',
                  "--gin.MODE='score'") == 0
    scores = [r["score"] for r in _rows(tmp_path / "score" / "predictions.jsonl")]
    assert len(scores) == DEV and ppl["examples"] == DEV
    assert -sum(scores) / ppl["tokens"] == pytest.approx(ppl["loss"], rel=1e-5)


def test_raw_prompts_are_continued_without_the_tasks_eos(trained, evaluated, tmp_path, capsys):
    """RAW_PROMPTS=True (what infer did with every file before): the lines are continued
    as they are, the model never saw its inputs end so, and predicts otherwise; it warns.
    An encoder-decoder model refuses the setting in one line."""
    txt = tmp_path / "inputs.txt"
    txt.write_text("".join(r["inputs"] + "\n" for r in evaluated))
    out = tmp_path / "raw"
    capsys.readouterr()
    code = _infer(trained, out, f'--gin.INPUT_FILE="{txt}"', "--gin.RAW_PROMPTS=True")
    err = capsys.readouterr().err
    if trained["kind"] == "t5":
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert "RAW_PROMPTS=True is for decoder-only models" in lines[0]
        assert not (out / "predictions.jsonl").exists()
        return
    assert code == 0
    assert "RAW_PROMPTS: each line of INPUT_FILE is a prompt continued as it is" in err
    rows = _rows(out / "predictions.jsonl")
    differ = sum(r["prediction"] != e["prediction"] for r, e in zip(rows, evaluated))
    assert differ >= DEV // 2, [r["prediction"] for r in rows]
