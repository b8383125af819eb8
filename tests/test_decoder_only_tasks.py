"""A decoder-only model evaluated on an inputs -> targets task split (`t5lite.eval`):
each example's prompt is BOS + its inputs (as its prefix-LM training sequence starts),
decoded with the KV cache; the predictions equal greedy decoding done here step by step
with full forward passes and no cache, and the metrics are the task's own over them.

A tiny LLaMA cut to one layer, with a 512-entry vocabulary and random parameters (saved
with checkpoint_format.save_params), and a MultiNLI jsonl fixture; runs call `main(argv)`
in this process (the split's decode and perplexity once each, shared by the tests that
read them), and the two-process runs are subprocesses."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import jax  # noqa: E402

from t5lite.config import parsing  # noqa: E402
from t5lite.data.files import demo_corpus  # noqa: E402
from t5lite.data import tasks  # noqa: E402  (t5 registers gin configurables: before parsing)
from t5lite.interop import checkpoint_format  # noqa: E402
from t5lite.models.decoding import EOS_ID  # noqa: E402

import model_helpers as mh  # noqa: E402
import train_helpers as th  # noqa: E402
from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402

MODEL_FILE = "configs/models/llama2/tiny.gin"
VOCAB = 512
LAYERS = 1
LENGTHS = {"inputs": 64, "targets": 16}  # the labels take up to 10 tokens with EOS
BATCH = 8
DEV = 11  # validation_matched examples: a padded last batch


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    vocab_path = vocabulary(tmp_path_factory)
    root = tmp_path_factory.mktemp("deconly")
    demo_corpus.write_multinli(str(root / "multinli"), train=6, dev=DEV)
    parsing.parse_gin([MODEL_FILE], [f"DecoderConfig.vocab_size = {VOCAB}",
                                     f"DecoderConfig.num_layers = {LAYERS}",
                                     "ACTIVATION_DTYPE = 'float32'"])
    model = parsing.resolve_macro("MODEL")
    variables = jax.jit(model.init)(jax.random.PRNGKey(5))  # one program, not op by op
    checkpoint_format.save_params(root / "ckpt", variables, step=3)
    return dict(vocab=vocab_path, mnli=root / "multinli", ckpt=root / "ckpt", model=model,
                variables=variables, logits=mh.full_forward(model, variables))


@pytest.fixture(autouse=True)
def _env(setup, monkeypatch, tmp_path):
    data_env(monkeypatch, tmp_path, setup["vocab"], mnli_dir=setup["mnli"])
    yield
    reset_data_settings()


def _flags(setup, out, *extra):
    return [f"--gin_file={MODEL_FILE}", f"--gin.DecoderConfig.vocab_size={VOCAB}",
            f"--gin.DecoderConfig.num_layers={LAYERS}", "--gin.ACTIVATION_DTYPE='float32'",
            f'--gin.CHECKPOINT_PATH="{setup["ckpt"]}"',
            f'--gin.OUTPUT_DIR="{out}"', f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}",
            f"--gin.BATCH_SIZE={BATCH}", f'--gin.VOCABULARY_PATH="{setup["vocab"]}"',
            f'--gin.MNLI_DIR="{setup["mnli"]}"', "--gin.MIXTURE_OR_TASK_NAME='mnli'",
            "--gin.SPLIT='validation_matched'", *extra]


@pytest.fixture(scope="module")
def split_eval(setup, tmp_path_factory):
    """`evaluated(mode)`: OUTPUT_DIR of this process's evaluation of the validation_matched
    split in MODE `mode` ('decode' or 'perplexity', on 8 devices), run once for the file."""
    root, done = tmp_path_factory.mktemp("split_eval"), {}

    def evaluated(mode):
        if mode not in done:
            from t5lite import eval as eval_module
            out = root / mode
            assert eval_module.main(["--gin_file=configs/runs/eval.gin"] +
                                    _flags(setup, out, f"--gin.MODE='{mode}'")) == 0
            done[mode] = out
        return done[mode]
    return evaluated


def _dev_inputs(setup):
    """The task's validation_matched inputs as token ids (trimmed, EOS appended)."""
    from t5lite.data import edge
    edge.import_tasks()
    ds = tasks.get_provider("mnli").get_dataset(LENGTHS, split="validation_matched",
                                                shuffle=False)
    return [[int(t) for t in ex["inputs"]] for ex in ds.as_numpy_iterator()]


def test_eval_decodes_bos_plus_inputs_as_greedy_decoding_without_the_cache(setup, split_eval):
    from t5lite.data import vocabularies
    out = split_eval("decode")  # MODE 'decode': configs/runs/eval.gin's
    rows = [json.loads(l) for l in (out / "eval" / "mnli_predictions.jsonl").read_text()
            .splitlines()]
    assert len(rows) == DEV
    vocab = vocabularies.get_vocabulary(str(setup["vocab"]))
    inputs = _dev_inputs(setup)
    assert len(inputs) == DEV
    width = LENGTHS["inputs"] + 1  # every prompt padded to BOS + the longest inputs
    expected = [vocab.decode(out) for out in mh.greedy_without_cache(
        setup["logits"], [[0] + ids for ids in inputs], LENGTHS["targets"],
        width + LENGTHS["targets"], EOS_ID)]
    assert len(set(expected)) > 2, expected  # the prompts matter to this random model
    assert [r["prediction"] for r in rows] == expected
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    accuracy = 100 * np.mean([r["postprocessed"] == r["target"] for r in rows])
    assert metrics["mnli"]["accuracy"] == pytest.approx(accuracy)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _hand_loss(setup, sequences):
    """-(sum of log p) / count over the scored tokens: `sequences` are (prompt, scored)
    token lists, each read as BOS + prompt + scored by a full forward pass (each a row of
    one batch, right-padded to one width: a causal model's earlier positions do not see
    the padding, nor a row the other rows)."""
    width = max(1 + len(p) + len(s) for p, s in sequences)
    seqs = np.zeros((len(sequences), width), np.int32)
    for i, (prompt, scored) in enumerate(sequences):
        seqs[i, :len(prompt) + len(scored)] = [0] + prompt + scored[:-1]
    logp = _log_softmax(np.asarray(setup["logits"](seqs), np.float64))
    total, count = 0.0, 0
    for i, (prompt, scored) in enumerate(sequences):
        total -= sum(logp[i, len(prompt) + k, t] for k, t in enumerate(scored))
        count += len(scored)
    return total / count, count


def _task_pairs():
    from t5lite.data import edge
    edge.import_tasks()
    ds = tasks.get_provider("mnli").get_dataset(LENGTHS, split="validation_matched",
                                                shuffle=False)
    return [([int(t) for t in ex["inputs"]], [int(t) for t in ex["targets"]])
            for ex in ds.as_numpy_iterator()]


def test_perplexity_of_a_split_is_exp_of_the_hand_computed_mean_answer_loss(setup,
                                                                            split_eval):
    out = split_eval("perplexity")
    got = json.loads((out / "metrics.json").read_text())["metrics"]["mnli"]
    loss, count = _hand_loss(setup, _task_pairs())
    assert got["tokens"] == count and got["examples"] == DEV
    assert got["loss"] == pytest.approx(loss, rel=1e-5)
    assert got["perplexity"] == pytest.approx(np.exp(loss), rel=1e-5)


def test_perplexity_of_a_text_file_counts_every_token_and_eos(setup, tmp_path):
    from t5lite import eval as eval_module
    from t5lite.data import vocabularies
    lines = [demo_corpus._Writer(9).paragraph(1 + i % 2) for i in range(5)]  # noqa: SLF001
    path = tmp_path / "text.txt"
    path.write_text("\n".join(lines) + "\n\n")  # a blank line is no sequence
    out = tmp_path / "ppl"
    assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(
        setup, out, "--gin.MODE='perplexity'", f'--gin.INPUT_FILE="{path}"',
        "--gin.MIXTURE_OR_TASK_NAME=None", "--gin.TASK_FEATURE_LENGTHS={'targets': 24}")) == 0
    got = json.loads((out / "metrics.json").read_text())["metrics"]["text.txt"]
    vocab = vocabularies.get_vocabulary(str(setup["vocab"]))
    sequences = [([], [int(t) for t in vocab.encode(line)][:23] + [EOS_ID]) for line in lines]
    assert any(len(vocab.encode(line)) > 23 for line in lines)  # one is cut to 24 tokens
    loss, count = _hand_loss(setup, sequences)
    assert got["tokens"] == count and got["examples"] == len(lines)
    assert got["loss"] == pytest.approx(loss, rel=1e-5)


def test_windowed_perplexity_of_a_text_stream_sums_every_token_once(setup, tmp_path, capsys):
    """STRIDE (Megatron's --overlapping-eval): the file is one stream, read in windows of
    TASK_FEATURE_LENGTHS['targets'] tokens STRIDE apart. Each token's loss is computed
    here on its own, by a forward pass over exactly the context the rule gives it (from
    the start of the window that scores it: 0 within the first window, else that
    window's start) and summed in NumPy: the command's loss, perplexity and word-level
    perplexity equal it, for windows that overlap and windows that do not."""
    from t5lite import eval as eval_module
    from t5lite.data import vocabularies
    lines = [demo_corpus._Writer(4).paragraph(2) for _ in range(3)]  # noqa: SLF001
    path = tmp_path / "wiki.txt"
    path.write_text("\n".join(lines) + "\n")
    tokens = [int(t) for t in vocabularies.get_vocabulary(str(setup["vocab"])).encode(
        path.read_text())]
    window = 16
    assert len(tokens) > 3 * window
    results = {}
    for stride in (window, 4):
        def start_of(t):  # the window that scores token t begins here
            return 0 if t < window else ((t - window) // stride + 1) * stride
        loss, count = _hand_loss(setup, [(tokens[start_of(t):t], [tok])
                                         for t, tok in enumerate(tokens)])
        out = tmp_path / f"stride{stride}"
        assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(
            setup, out, "--gin.MODE='perplexity'", f'--gin.INPUT_FILE="{path}"',
            "--gin.MIXTURE_OR_TASK_NAME=None", f"--gin.STRIDE={stride}",
            f"--gin.TASK_FEATURE_LENGTHS={{'targets': {window}}}")) == 0
        got = json.loads((out / "metrics.json").read_text())["metrics"]["wiki.txt"]
        assert got["tokens"] == count == len(tokens)
        assert got["windows"] == 1 + -(-(len(tokens) - window) // stride)
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        assert got["perplexity"] == pytest.approx(np.exp(loss), rel=1e-5)
        words = len(path.read_text().split())
        assert got["words"] == words
        assert got["word_perplexity"] == pytest.approx(np.exp(loss * count / words), rel=1e-5)
        results[stride] = got["loss"]
    assert results[window] != results[4]  # more context per token: another number
    # a stride past the window would leave tokens unscored; a pairs file has no stream
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"inputs": "a", "targets": "b"}) + "\n")
    for extra, needles in (([f'--gin.INPUT_FILE="{path}"', f"--gin.STRIDE={window + 1}"],
                            ("STRIDE=17", "larger than the window", "STRIDE <= 16")),
                           ([f'--gin.INPUT_FILE="{pairs}"', "--gin.STRIDE=4"],
                            ("STRIDE", "pairs", "text file"))):
        capsys.readouterr()
        assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(
            setup, tmp_path / "bad", "--gin.MODE='perplexity'", "--gin.MIXTURE_OR_TASK_NAME=None",
            f"--gin.TASK_FEATURE_LENGTHS={{'targets': {window}}}", *extra)) != 0
        lines_out = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
        assert len(lines_out) == 1 and all(n in lines_out[0] for n in needles), lines_out


def test_two_processes_evaluate_as_one(setup, split_eval, tmp_path):
    """Decoding and perplexity on 2 processes (1 device each, gloo on 127.0.0.1) against
    this process's 8 devices: the same predictions, metrics and perplexity."""
    results = {}
    for mode in ("decode", "perplexity"):
        one = split_eval(mode)
        port, procs, two = th.free_port(), [], tmp_path / f"two_{mode}"
        try:
            for i in range(2):
                flags = [f.replace("configs/", f"{th.REPO}/configs/") for f in _flags(
                    setup, two, f"--gin.MODE='{mode}'")]
                cmd = [sys.executable, "-m", "t5lite.eval",
                       f"--gin_file={th.REPO}/configs/runs/eval.gin", *flags,
                       f"--coordinator_address=127.0.0.1:{port}", "--process_count=2",
                       f"--process_index={i}"]
                procs.append(th.start(cmd, tmp_path / f"{mode}{i}.log"))
            rcs = [th.finish(p, timeout=300) for p in procs]
        finally:
            for p in procs:
                th.kill(p)
        logs = [th.read_log(tmp_path / f"{mode}{i}.log") for i in range(2)]
        assert rcs == [0, 0], "\n".join(th.tail(t) for t in logs)
        results[mode] = [json.loads((d / "metrics.json").read_text())["metrics"]["mnli"]
                         for d in (one, two)]
        if mode == "decode":
            rows = [(d / "eval" / "mnli_predictions.jsonl").read_text() for d in (one, two)]
            assert rows[0] == rows[1]
    assert results["decode"][0] == results["decode"][1]
    one, two = results["perplexity"]
    assert one["tokens"] == two["tokens"] and one["examples"] == two["examples"]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)


def _finetune(setup, model_dir, *extra, model_file=MODEL_FILE, checkpoint=None):
    """configs/finetune_mnli.gin with a decoder-only model file, from a checkpoint."""
    from t5lite import train
    return train.main([f"--gin_file={model_file}", "--gin_file=configs/finetune_mnli.gin",
                       f"--gin.DecoderConfig.vocab_size={VOCAB}",
                       f"--gin.DecoderConfig.num_layers={LAYERS}",
                       "--gin.ACTIVATION_DTYPE='float32'", f'--gin.MODEL_DIR="{model_dir}"',
                       f'--gin.INITIAL_CHECKPOINT_PATH="{checkpoint or setup["ckpt"]}"',
                       f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}", "--gin.BATCH_SIZE=8",
                       "--gin.TRAIN_STEPS=4", "--gin.EVAL_PERIOD=2",
                       f"--gin.EVAL_BATCH_SIZE={BATCH}", "--gin.CHECKPOINT_PERIOD=4",
                       "--gin.CheckpointSettings.async_save=False",
                       f'--gin.VOCABULARY_PATH="{setup["vocab"]}"',
                       f'--gin.MNLI_DIR="{setup["mnli"]}"', *extra])


def test_the_mnli_finetuning_recipe_trains_and_evaluates_a_decoder_only_model(setup, tmp_path,
                                                                              capsys):
    run = tmp_path / "run"
    assert _finetune(setup, run) == 0
    err = capsys.readouterr().err
    assert f"start: initial:{setup['ckpt']} at step 0" in err, err[-3000:]
    evals = [l for l in err.splitlines() if "[inference_eval]" in l]
    assert [l.split("step ")[1].split(" ")[0] for l in evals] == ["2", "4"], err[-3000:]
    assert all("mnli/accuracy" in l for l in evals)
    assert th.complete_steps(run) == [4]
    # the validation loss beside it, at the same steps, equal to MODE 'perplexity' on
    # the checkpoint of step 4 (the prompt read, the answer scored)
    val = th.scalars(run, "training_eval/mnli")
    assert [s for s, _ in val["loss_per_token"]] == [2, 4], err[-3000:]
    from t5lite import eval as eval_module
    out = tmp_path / "perplexity"
    assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(
        setup, out, "--gin.MODE='perplexity'", "--gin.SPLIT='validation_matched'",
        f'--gin.CHECKPOINT_PATH="{run / "checkpoints" / "4"}"')) == 0
    measured = json.loads((out / "metrics.json").read_text())["metrics"]["mnli"]
    assert val["tokens"][-1][1] == measured["tokens"]
    assert val["loss_per_token"][-1][1] == pytest.approx(measured["loss"], rel=1e-6)
    assert val["accuracy"][-1][1] == pytest.approx(measured["accuracy"], rel=1e-6)


@pytest.mark.parametrize("case", ["too_long", "unknown_task", "lm_task", "other_family"])
def test_decoder_only_bad_input_is_one_line(setup, tmp_path, capsys, case):
    from t5lite import eval as eval_module
    out = tmp_path / "out"
    if case == "too_long":  # GPT's learned positions: 500 + 100 > max_length 512
        code = _finetune(setup, out, "--gin.TASK_FEATURE_LENGTHS={'inputs': 500, 'targets': 100}",
                         model_file="configs/models/gpt/tiny.gin")
        needles = ("600 tokens", "max_length 512")
    elif case == "unknown_task":
        code = eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(
            setup, out, "--gin.MIXTURE_OR_TASK_NAME='mnly'"))
        needles = ("mnly", "mnli")
    elif case == "lm_task":
        demo_corpus.write_pile(str(tmp_path / "pile"), train_files=1, docs_per_file=4,
                               eval_docs=2)
        code = eval_module.main(["--gin_file=configs/runs/eval.gin"] + _flags(
            setup, out, "--gin.MIXTURE_OR_TASK_NAME='pile_lm'", "--gin.SPLIT='validation'",
            f'--gin.PILE_DIR="{tmp_path / "pile"}"'))
        needles = ("no inputs to decode from", "MODE='perplexity'")
    else:
        from t5lite.config import parsing
        parsing.parse_gin(["configs/models/t5_1_1/tiny.gin"], [f"T5Config.vocab_size = {VOCAB}",
                                                               "T5Config.num_encoder_layers = 1",
                                                               "T5Config.num_decoder_layers = 1"])
        t5 = parsing.resolve_macro("MODEL")
        checkpoint_format.save_params(tmp_path / "t5", jax.jit(t5.init)(jax.random.PRNGKey(0)),
                                      step=1)
        code = _finetune(setup, out, checkpoint=tmp_path / "t5")
        needles = ("another architecture", "encoder", "same family")
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert code != 0 and len(lines) == 1, err[-3000:]
    assert "Traceback" not in err
    assert all(n in lines[0] for n in needles), lines[0]
    assert not (out / "metrics.json").exists()
    assert not (out / "checkpoints").exists() or th.complete_steps(out) == []
