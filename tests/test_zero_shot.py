"""Zero-shot Lambada and BoolQ through `python -m t5lite.eval` (MODE 'zero_shot'), for both
families, against computations done here with full forward passes (no KV cache, no
batching, the tokens built by hand as lm-evaluation-harness builds them):

- Lambada: the greedy continuation of the passage without its last word, compared with
  the tokens of " " + that word (T5: and EOS). Each tiny model is first trained here to
  say the last word of some passages, so that some examples are right and some wrong.
- BoolQ: log p(" yes") and log p(" no") after "{passage}\\nQuestion: {question}?\\nAnswer:";
  the likelier is the answer.

The files are written here in the real layouts (OpenAI's lambada_test.jsonl, plain text,
BoolQ's dev.jsonl)."""
from __future__ import annotations

import io
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import jax  # noqa: E402

from t5lite.config import parsing  # noqa: E402
from t5lite.data.files import demo_corpus  # noqa: E402
from t5lite.data import tasks  # noqa: F401,E402  (t5 registers gin configurables first)
from t5lite.data.files import zero_shot_files  # noqa: E402
from t5lite.errors import DataFormatError  # noqa: E402
from t5lite.interop import checkpoint_format  # noqa: E402

import model_helpers as mh  # noqa: E402
import train_helpers as th  # noqa: E402
from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402

BATCH = 8
LENGTHS = {"inputs": 256, "targets": 16}
FAMILIES = {"t5": ("configs/models/t5_1_1/tiny.gin", "T5Config"),
            "llama": ("configs/models/llama2/tiny.gin", "DecoderConfig")}
TRAINED = 4  # the first passages, whose last word the model is trained to say
LAMBADA = 10  # passages: a padded last batch
BOOLQ = 7  # 4 true, 3 false: an answer swapped changes the accuracy


def _model(family):
    model_file, config = FAMILIES[family]
    # the tiny model cut to 512 entries and one layer a stack (mh.SMALL): the zero-shot
    # pipeline against the hand computation is under test, not the model's size
    parsing.parse_gin([model_file], mh.small_bindings(config) + ["ACTIVATION_DTYPE = 'float32'"])
    return parsing.resolve_macro("MODEL")


def _encode(vocab, text):
    return [int(t) for t in vocab.encode(text)]


def _t5(model):
    return model.FEATURE_CONVERTER_KIND == "encoder_decoder"  # a test may tell them apart


def _lambada_split(text):
    context, word = text.rsplit(" ", 1)
    return context, word


def _train(model, variables, vocab, passages, steps=100):
    """Adam on the model's own loss: context -> " " + last word (T5: and EOS), until
    every target token is the argmax."""
    import optax
    ctx, tgt = [], []
    for text in passages:
        context, word = _lambada_split(text)
        ctx.append(_encode(vocab, context) + ([vocab.eos_id] if _t5(model) else []))
        tgt.append(_encode(vocab, " " + word) + ([vocab.eos_id] if _t5(model) else []))
    lengths = {"inputs": max(map(len, ctx)), "targets": max(map(len, tgt))}
    batch = model.inference_batch(ctx, lengths, tgt)
    opt = optax.adam(3e-3)

    @jax.jit
    def step(params, state):
        (_, sums), grads = jax.value_and_grad(
            lambda p: model.loss_fn({**variables, "params": p}, batch), has_aux=True)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, sums

    params = variables["params"]
    state = opt.init(params)
    for _ in range(steps):
        params, state, sums = step(params, state)
    assert float(sums["correct"]) == float(sums["weight_sum"]), sums
    return {**variables, "params": params}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero_shot")
    passages = demo_corpus.lambada_passages(LAMBADA, seed=3)
    (root / "lambada").mkdir()
    (root / "lambada" / "lambada_test.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in passages))
    (root / "lambada.txt").write_text("\n".join(passages) + "\n")
    records = demo_corpus.boolq_records(BOOLQ, seed=4)
    (root / "boolq").mkdir()
    (root / "boolq" / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return dict(root=root, passages=passages, boolq=records,
                vocab_path=vocabulary(tmp_path_factory))


@pytest.fixture(scope="module")
def families(data, tmp_path_factory):
    """{family: (model, trained variables, checkpoint dir)}."""
    from t5lite.data import vocabularies
    vocab = vocabularies.get_vocabulary(str(data["vocab_path"]), extra_ids=100)
    out = {}
    for family in FAMILIES:
        model = _model(family)
        variables = _train(model, model.init(jax.random.PRNGKey(1)), vocab,
                           data["passages"][:TRAINED])
        ckpt = tmp_path_factory.mktemp(f"{family}_ckpt")
        checkpoint_format.save_params(ckpt, variables, step=5)
        out[family] = (model, variables, ckpt)
    return out


@pytest.fixture(autouse=True)
def _env(data, monkeypatch, tmp_path):
    data_env(monkeypatch, tmp_path, data["vocab_path"])
    for name in ("T5LITE_LAMBADA_DIR", "T5LITE_BOOLQ_DIR"):
        monkeypatch.delenv(name, raising=False)
    yield
    reset_data_settings()


def _flags(data, family, ckpt, out, task, *extra):
    model_file, config = FAMILIES[family]
    return [f"--gin_file={model_file}", "--gin_file=configs/runs/eval.gin",
            *mh.small_flags(config),
            "--gin.ACTIVATION_DTYPE='float32'",
            f'--gin.CHECKPOINT_PATH="{ckpt}"', f'--gin.OUTPUT_DIR="{out}"',
            f"--gin.TASK_FEATURE_LENGTHS={LENGTHS}", f"--gin.BATCH_SIZE={BATCH}",
            f'--gin.VOCABULARY_PATH="{data["vocab_path"]}"', "--gin.MODE='zero_shot'",
            f"--gin.MIXTURE_OR_TASK_NAME='{task}'",
            f'--gin.LAMBADA_DIR="{data["root"] / "lambada"}"',
            f'--gin.BOOLQ_DIR="{data["root"] / "boolq"}"', *extra]


def _run(*argv):
    from t5lite import eval as eval_module
    return eval_module.main(list(argv))


def _outputs(out, task):
    metrics = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(l) for l in (out / "eval" / f"{task}_predictions.jsonl").open()]
    return metrics, rows


def _vocab(data):
    from t5lite.data import vocabularies
    return vocabularies.get_vocabulary(str(data["vocab_path"]), extra_ids=100)


# ----------------------------------------------------------------------------- by hand


def _logits_fn(model, variables):
    """Full forward passes: (encoder tokens or None, decoder input tokens) -> logits."""
    if _t5(model):
        fn = jax.jit(lambda e, d: model.logits(variables, {"encoder_input_tokens": e,
                                                           "decoder_input_tokens": d}))
        return lambda enc, dec: np.asarray(fn(enc, dec), np.float64)
    fn = jax.jit(lambda d: model.logits(variables, {"decoder_input_tokens": d,
                                                    "decoder_target_tokens": d}))
    return lambda enc, dec: np.asarray(fn(dec), np.float64)


def _padded(rows, width):
    out = np.zeros((1, width), np.int32)
    out[0, :len(rows)] = rows
    return out


def _hand_inputs(model, vocab, context):
    """(encoder row, decoder prefix): T5 reads context + EOS in its encoder and starts its
    decoder at 0; a decoder-only model reads BOS + context."""
    ids = _encode(vocab, context)
    if _t5(model):
        return ids + [vocab.eos_id], [0]
    return None, [model.bos_id] + ids


def _hand_continuation(model, vocab, text):
    return _encode(vocab, text) + ([vocab.eos_id] if _t5(model) else [])


def _hand_greedy(logits, model, vocab, context, new_tokens, width=320):
    enc, seq = _hand_inputs(model, vocab, context)
    enc = _padded(enc, width) if enc is not None else None
    out = []
    for _ in range(new_tokens):
        token = int(np.argmax(logits(enc, _padded(seq, width))[0, len(seq) - 1]))
        out.append(token)
        if token == vocab.eos_id:
            break
        seq.append(token)
    return out


def _hand_loglikelihood(logits, model, vocab, context, continuation, width=320):
    enc, seq = _hand_inputs(model, vocab, context)
    enc = _padded(enc, width) if enc is not None else None
    cont = _hand_continuation(model, vocab, continuation)
    logp = logits(enc, _padded((seq + cont)[:-1], width))[0]
    logp = logp - logp.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    first = len(seq) - 1  # the position whose next token is the continuation's first
    return sum(logp[first + k, t] for k, t in enumerate(cont))


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("family", FAMILIES)
def test_lambada_is_the_greedy_last_word_computed_by_hand(data, families, family, tmp_path):
    model, variables, ckpt = families[family]
    out = tmp_path / "out"
    assert _run(*_flags(data, family, ckpt, out, "lambada")) == 0
    metrics, rows = _outputs(out, "lambada")
    vocab, logits = _vocab(data), _logits_fn(model, variables)
    right = []
    for text, row in zip(data["passages"], rows):
        context, word = _lambada_split(text)
        target = _hand_continuation(model, vocab, " " + word)
        got = _hand_greedy(logits, model, vocab, context, len(target))
        right.append(got == target)
        assert row["inputs"] == context and row["target"] == word
        assert row["correct"] == (got == target), (row, got, target)
        assert row["prediction"] == vocab.decode(got[:len(target)])
    assert len(rows) == LAMBADA
    assert all(right[:TRAINED]) and not all(right), right  # both outcomes are tested
    p = np.mean(right)
    got = metrics["metrics"]["lambada"]
    assert got == pytest.approx({"accuracy": 100 * p, "examples": LAMBADA,  # percent
                                 "accuracy_stderr": 100 * math.sqrt(p * (1 - p) / LAMBADA)})
    assert metrics["mode"] == "zero_shot" and metrics["step"] == 5
    assert metrics["input_file"].endswith("lambada_test.jsonl")
    scalars = th.scalars(out, "eval")
    assert scalars["lambada/accuracy"] == [(5, pytest.approx(100 * p))]
    assert {"lambada/accuracy_stderr", "lambada/examples"} <= set(scalars)


@pytest.mark.parametrize("family", FAMILIES)
def test_boolq_answer_is_the_likelier_of_yes_and_no_by_hand(data, families, family, tmp_path,
                                                            monkeypatch):
    """... with a bar of the continuations scored on a terminal's stderr."""
    model, variables, ckpt = families[family]
    out = tmp_path / "out"
    terminal = type("Terminal", (io.StringIO,), {"isatty": lambda self: True})()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert _run(*_flags(data, family, ckpt, out, "boolq")) == 0
    choices = 2 * BOOLQ  # " yes" and " no" for each question
    assert re.search(rf"zero-shot \(choices\): 100%.*\b{choices}/{choices}\b",
                     terminal.getvalue()), terminal.getvalue()[-2000:]
    metrics, rows = _outputs(out, "boolq")
    vocab, logits = _vocab(data), _logits_fn(model, variables)
    right = []
    for record, row in zip(data["boolq"], rows):
        prompt = f"{record['passage']}\nQuestion: {record['question']}?\nAnswer:"
        yes = _hand_loglikelihood(logits, model, vocab, prompt, " yes")
        no = _hand_loglikelihood(logits, model, vocab, prompt, " no")
        assert abs(yes - no) > 1e-3, (yes, no)  # no near-tie that rounding could flip
        assert row["loglikelihoods"] == pytest.approx({"yes": yes, "no": no}, abs=2e-4)
        answer = "yes" if yes > no else "no"
        assert row["prediction"] == answer and row["inputs"] == prompt
        assert row["target"] == ("yes" if record["answer"] else "no")
        right.append(answer == row["target"])
    assert len(rows) == BOOLQ
    p = np.mean(right)
    assert metrics["metrics"]["boolq"] == pytest.approx(
        {"accuracy": 100 * p, "accuracy_stderr": 100 * math.sqrt(p * (1 - p) / BOOLQ),
         "examples": BOOLQ})


def test_plain_text_lambada_reads_as_the_jsonl_and_num_examples_limits(data, families,
                                                                      tmp_path):
    _, _, ckpt = families["llama"]
    results = []
    text = data["root"] / "lambada.txt"
    for name, extra in (("jsonl", ()), ("text", (f'--gin.INPUT_FILE="{text}"',))):
        out = tmp_path / name
        assert _run(*_flags(data, "llama", ckpt, out, "lambada", "--gin.NUM_EXAMPLES=6",
                            *extra)) == 0
        results.append(_outputs(out, "lambada"))
    (one, rows_one), (two, rows_two) = results
    assert one["metrics"] == two["metrics"] and rows_one == rows_two
    assert one["metrics"]["lambada"]["examples"] == 6 and len(rows_one) == 6
    assert two["input_file"].endswith("lambada.txt")


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(l + "\n" for l in lines))
    return path


@pytest.mark.parametrize("case", ["single_word", "empty_text", "answer_not_bool",
                                  "missing_dir", "no_file", "unset", "context_too_long",
                                  "not_zero_shot_task"])
def test_bad_input_is_one_line_before_loading(data, families, tmp_path, capsys, case):
    _, _, ckpt = families["t5"]
    good = json.dumps({"text": data["passages"][0]})
    task, extra = "lambada", []
    if case == "single_word":
        path = _write(tmp_path / "l" / "lambada_test.jsonl",
                      [good, "", json.dumps({"text": "Ada"})])
        extra, needles = [f'--gin.LAMBADA_DIR="{path.parent}"'], (f"{path}:3", "single word")
    elif case == "empty_text":
        path = _write(tmp_path / "l" / "lambada_test.jsonl", [json.dumps({"text": " "})])
        extra, needles = [f'--gin.INPUT_FILE="{path}"'], (f"{path}:1", "is empty")
    elif case == "answer_not_bool":
        record = dict(data["boolq"][0], answer="true")
        path = _write(tmp_path / "b" / "dev.jsonl", [json.dumps(data["boolq"][1]),
                                                     json.dumps(record)])
        task, extra = "boolq", [f'--gin.BOOLQ_DIR="{path.parent}"']
        needles = (f"{path}:2", '"answer" must be a JSON boolean', '"true"')
    elif case == "missing_dir":
        extra, needles = [f'--gin.LAMBADA_DIR="{tmp_path / "nowhere"}"'], (
            "does not exist", "LAMBADA_DIR")
    elif case == "no_file":
        (tmp_path / "empty").mkdir()
        task, extra = "boolq", [f'--gin.BOOLQ_DIR="{tmp_path / "empty"}"']
        needles = ("no BoolQ file", "dev.jsonl or val.jsonl")
    elif case == "unset":
        extra, needles = ["--gin.LAMBADA_DIR=None"], ("no Lambada directory", "LAMBADA_DIR",
                                                      "T5LITE_LAMBADA_DIR")
    elif case == "context_too_long":
        extra, needles = ["--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 16}"], (
            "TASK_FEATURE_LENGTHS['inputs']=8 would cut", f"of the {LAMBADA} Lambada")
    else:
        task, needles = "mnli", ("MODE 'zero_shot' evaluates", "'lambada' or 'boolq'")
    out = tmp_path / "out"
    code = _run(*_flags(data, "t5", ckpt, out, task, *extra))
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert "Traceback" not in err and all(n in lines[0] for n in needles), lines[0]
    assert not (out / "metrics.json").exists()


def test_a_bad_answer_through_the_command_is_one_line(data, families, tmp_path):
    _, _, ckpt = families["llama"]
    path = _write(tmp_path / "boolq" / "dev.jsonl",
                  [json.dumps(dict(data["boolq"][0], answer=1))])
    flags = [f.replace("configs/", f"{th.REPO}/configs/")
             for f in _flags(data, "llama", ckpt, tmp_path / "out", "boolq")]
    proc = th.run([sys.executable, "-m", "t5lite.eval", *flags,
                   f'--gin.BOOLQ_DIR="{path.parent}"'])
    th.assert_one_error(proc, f"{path}:1", '"answer" must be a JSON boolean', "got 1")
    assert proc.returncode == 2


def test_two_processes_evaluate_as_one(data, families, tmp_path):
    _, _, ckpt = families["llama"]
    one = tmp_path / "one"
    assert _run(*_flags(data, "llama", ckpt, one, "lambada")) == 0
    port, procs, two = th.free_port(), [], tmp_path / "two"
    try:
        for i in range(2):
            flags = [f.replace("configs/", f"{th.REPO}/configs/")
                     for f in _flags(data, "llama", ckpt, two, "lambada")]
            procs.append(th.start([sys.executable, "-m", "t5lite.eval", *flags,
                                   f"--coordinator_address=127.0.0.1:{port}",
                                   "--process_count=2", f"--process_index={i}"],
                                  tmp_path / f"{i}.log"))
        rcs = [th.finish(p, timeout=300) for p in procs]
    finally:
        for p in procs:
            th.kill(p)
    assert rcs == [0, 0], "\n".join(th.tail(th.read_log(tmp_path / f"{i}.log")) for i in range(2))
    (m1, r1), (m2, r2) = _outputs(one, "lambada"), _outputs(two, "lambada")
    assert m1["metrics"] == m2["metrics"] and r1 == r2
    assert 0 < m1["metrics"]["lambada"]["accuracy"] < 100


# ----------------------------------------------------------------------------- files


def test_readers_split_the_last_word_and_build_the_harness_prompt(tmp_path):
    lam = _write(tmp_path / "l.jsonl", [json.dumps({"text": "She  took the old key\t"}),
                                        "", json.dumps({"text": "a b"})])
    examples = zero_shot_files.read_lambada(str(lam))
    assert [(e.context, e.target) for e in examples] == [("She  took the old", " key"),
                                                        ("a", " b")]
    boolq = _write(tmp_path / "val.jsonl", [
        json.dumps({"question": "is it", "passage": "P.", "answer": False}),
        json.dumps({"question": "q", "passage": "x", "idx": 0, "label": True})])  # SuperGLUE
    examples = zero_shot_files.read_boolq(str(boolq))
    assert examples[0].context == "P.\nQuestion: is it?\nAnswer:"
    assert examples[0].continuations == (" no", " yes")
    assert [e.target for e in examples] == [" no", " yes"]
    for lines, needle in (([json.dumps({"text": "word"})], "single word"),
                          (["{not json"], "not JSON"), ([json.dumps({"txt": "a b"})], '"text"')):
        with pytest.raises(DataFormatError, match=needle):
            zero_shot_files.read_lambada(str(_write(tmp_path / "bad.jsonl", lines)))
    with pytest.raises(DataFormatError, match="bad.txt:2: the passage is a single word"):
        zero_shot_files.read_lambada(str(_write(tmp_path / "bad.txt", ["a b c", "single"])))


def test_superglue_boolq_as_hugging_face_exports_it_reads_as_booleans(tmp_path):
    """SuperGLUE's BoolQ from Hugging Face datasets holds `label` 0 / 1 (what
    lm-evaluation-harness reads): the same examples as the booleans; any other label, or
    an integer "answer" (BoolQ's own field is a boolean), stays one line."""
    records = [{"question": f"q{i}", "passage": f"p{i}.", "idx": i} for i in range(4)]
    truth = [True, False, False, True]
    as_bool = _write(tmp_path / "bool.jsonl", [json.dumps(dict(r, label=t))
                                               for r, t in zip(records, truth)])
    as_int = _write(tmp_path / "int.jsonl", [json.dumps(dict(r, label=int(t)))
                                             for r, t in zip(records, truth)])
    assert zero_shot_files.read_boolq(str(as_int)) == zero_shot_files.read_boolq(str(as_bool))
    assert [e.target for e in zero_shot_files.read_boolq(str(as_int))] == [
        " yes", " no", " no", " yes"]
    for field, value, needle in (("label", 2, "or the integer 0 or 1, got 2"),
                                 ("label", "1", 'got "1"'), ("label", 1.0, "got 1.0"),
                                 ("answer", 1, "(true or false), got 1")):
        bad = _write(tmp_path / "bad.jsonl", [json.dumps(dict(records[0], **{field: value}))])
        with pytest.raises(DataFormatError) as e:
            zero_shot_files.read_boolq(str(bad))
        assert "\n" not in str(e.value) and f'bad.jsonl:1: "{field}" must be' in str(e.value)
        assert needle in str(e.value), str(e.value)


def test_demo_corpus_writes_the_zero_shot_sets_and_adds_them_to_an_older_corpus(tmp_path):
    root = tmp_path / "demo"
    root.mkdir()
    (root / demo_corpus.COMPLETE_MARKER).write_text("older\n")  # a corpus without them
    where = demo_corpus.ensure(str(root))
    lam = zero_shot_files.read_lambada(os.path.join(where["lambada_dir"], "lambada_test.jsonl"))
    boolq = zero_shot_files.read_boolq(os.path.join(where["boolq_dir"], "dev.jsonl"))
    assert len(lam) == 100 and len(boolq) == 100
    assert all(e.target.strip() in e.context for e in lam)  # the context gives it away
    assert sum(e.label for e in boolq) == 50
    assert not [p for p in os.listdir(root) if p.startswith(".tmp-")]
    assert Path(where["lambada_dir"]).stat().st_mtime == \
        Path(demo_corpus.ensure(str(root))["lambada_dir"]).stat().st_mtime  # written once
