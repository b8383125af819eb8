"""The SeqIO tasks of t5lite.data.tasks on small fixtures in the real formats: the Pile's
jsonl / jsonl.zst, MultiNLI jsonl, GLUE TSVs, SQuAD JSON and prepared TFDS datasets."""
import json

import numpy as np
import pytest

from t5lite.data.files import demo_corpus
from t5lite.data.sharding.layout import DataLayout  # noqa: E402
from t5lite.errors import (DataFormatError, DataNotFoundError, UnknownTaskError,
                                VocabularyError)

from data_helpers import VOCAB_SIZE, data_env, reset_data_settings, vocabulary

pytest.importorskip("seqio")
pytest.importorskip("t5")

import seqio  # noqa: E402

from t5lite.data import pipeline, settings, tasks  # noqa: E402

LENGTHS = {"inputs": 64, "targets": 16}


@pytest.fixture(autouse=True)
def _restore_settings():
    yield
    reset_data_settings()


@pytest.fixture
def vocab_path(tmp_path_factory):
    return vocabulary(tmp_path_factory)


def _examples(name, split="train", n=None, lengths=LENGTHS, shuffle=False):
    ds = seqio.get_mixture_or_task(name).get_dataset(lengths, split=split, shuffle=shuffle,
                                                     seed=0)
    if n:
        ds = ds.take(n)
    return list(ds.as_numpy_iterator())


def _text(ex, key):
    return ex[f"{key}_pretokenized"].decode()


def test_tasks_register_on_import_without_data_or_vocabulary(monkeypatch):
    for env in ("T5LITE_PILE_DIR", "T5LITE_VOCABULARY_PATH"):
        monkeypatch.delenv(env, raising=False)
    tasks.register_tasks()
    for name in tasks.TASK_NAMES:
        assert name in seqio.TaskRegistry.names()
    assert seqio.TaskRegistry.get("mnli").splits == (
        "train", "validation_matched", "validation_mismatched")
    vocab = seqio.TaskRegistry.get("pile_span_corruption").output_features["targets"].vocabulary
    assert "vocabulary_path" in str(vocab)  # printable before it is resolved
    with pytest.raises(VocabularyError, match="VOCABULARY_PATH.*t5lite.vocab"):
        _ = vocab.vocab_size


@pytest.mark.parametrize("compress", [True, False], ids=["jsonl.zst", "jsonl"])
def test_pile_span_corruption_from_the_piles_files(tmp_path, monkeypatch, vocab_path, compress):
    pile = tmp_path / "pile"
    demo_corpus.write_pile(str(pile), train_files=2, docs_per_file=6, eval_docs=3,
                           compress=compress)
    data_env(monkeypatch, tmp_path, vocab_path, pile_dir=pile)
    task = seqio.TaskRegistry.get("pile_span_corruption")
    vocab = task.output_features["targets"].vocabulary
    examples = _examples("pile_span_corruption", n=8)
    assert len(examples) == 8
    top = VOCAB_SIZE + 100 - 1
    for ex in examples:
        inputs, targets = ex["inputs"].tolist(), ex["targets"].tolist()
        assert len(inputs) <= 64 and len(targets) <= 16
        assert inputs[-1] == 1 and targets[-1] == 1  # EOS
        in_sentinels = [t for t in inputs if t >= VOCAB_SIZE]
        out_sentinels = [t for t in targets if t >= VOCAB_SIZE]
        # Sentinels count down from the top of the vocabulary, in order, in both.
        assert in_sentinels == list(range(top, top - len(in_sentinels), -1))
        assert out_sentinels[0] == top and in_sentinels[:len(out_sentinels)] == out_sentinels
        noise = len(targets) - 1 - len(out_sentinels)
        plain = len(inputs) - 1 - len(in_sentinels)
        assert 0.05 < noise / (noise + plain) < 0.3  # noise density 0.15
    assert "<extra_id_0>" in vocab.decode(examples[0]["inputs"].tolist())
    # Validation and test come from val.jsonl[.zst] and test.jsonl[.zst].
    assert _examples("pile_span_corruption", split="validation", n=2)
    assert _examples("pile_lm", split="test", n=1, lengths={"targets": 32})


def test_pile_lm_documents_end_in_eos_and_fill_chunks(tmp_path, monkeypatch, vocab_path):
    pile = tmp_path / "pile"
    demo_corpus.write_pile(str(pile), train_files=1, docs_per_file=8, compress=False)
    data_env(monkeypatch, tmp_path, vocab_path, pile_dir=pile)
    examples = _examples("pile_lm", lengths={"targets": 32})
    lengths = [len(ex["targets"]) for ex in examples]
    assert max(lengths) == 32 and sum(n == 32 for n in lengths) >= len(lengths) - 1
    tokens = np.concatenate([ex["targets"] for ex in examples])
    assert int((tokens == 1).sum()) == 8  # one EOS per document, none in between
    assert "targets" in seqio.TaskRegistry.get("pile_lm").output_features
    assert "inputs" not in seqio.TaskRegistry.get("pile_lm").output_features


def test_pile_from_tfds_the_pile_when_no_directory_is_set(tmp_path, monkeypatch, vocab_path):
    from data_helpers import pile_tfds
    tfds_dir = tmp_path / "tfds"
    pile_tfds(str(tfds_dir), {"train": 5, "validation": 2})
    data_env(monkeypatch, tmp_path, vocab_path, tfds_data_dir=tfds_dir)
    examples = _examples("pile_span_corruption", n=4)
    assert examples and all(ex["targets"][0] == VOCAB_SIZE + 99 for ex in examples)
    assert _examples("pile_lm", split="validation", lengths={"targets": 16})


def test_mnli_from_multinli_jsonl_glue_tsv_and_tfds_agree(tmp_path, monkeypatch, vocab_path):
    from data_helpers import mnli_tfds
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=9, dev=9)
    demo_corpus.write_glue_mnli(str(tmp_path / "glue" / "MNLI"), train=9, dev=9)
    mnli_tfds(str(tmp_path / "tfds"), n=9)
    got = {}
    for kind, dirs in (("jsonl", {"mnli_dir": tmp_path / "multinli"}),
                       ("tsv", {"mnli_dir": tmp_path / "glue"}),
                       ("tfds", {"tfds_data_dir": tmp_path / "tfds"})):
        data_env(monkeypatch, tmp_path, vocab_path, **dirs)
        got[kind] = {split: [(_text(ex, "inputs"), _text(ex, "targets"), int(ex["idx"]))
                             for ex in _examples("mnli", split=split,
                                                 lengths={"inputs": 128, "targets": 8})]
                     for split in ("train", "validation_matched", "validation_mismatched")}
    assert got["jsonl"] == got["tsv"] == got["tfds"]
    first = got["jsonl"]["train"][0]
    premise, hypothesis, label, _ = demo_corpus.mnli_pairs(9, seed=0)[0]
    assert first == (f"mnli hypothesis: {hypothesis} premise: {premise}", label, 0)
    assert {t for _, t, _ in got["jsonl"]["train"]} == {"entailment", "neutral",
                                                        "contradiction"}


def test_mnli_skips_no_consensus_records(tmp_path, monkeypatch, vocab_path):
    demo_corpus.write_multinli(str(tmp_path), train=3, dev=9, unlabeled_every=3)
    data_env(monkeypatch, tmp_path, vocab_path, mnli_dir=tmp_path)
    assert len(_examples("mnli", split="validation_matched")) == 6  # 3 had gold_label "-"


def test_mnli_accuracy_through_the_tasks_metric_fns(tmp_path, monkeypatch, vocab_path):
    demo_corpus.write_multinli(str(tmp_path), train=3, dev=4)
    data_env(monkeypatch, tmp_path, vocab_path, mnli_dir=tmp_path)
    task = seqio.TaskRegistry.get("mnli")
    examples = _examples("mnli", split="validation_mismatched")
    labels = [_text(ex, "targets") for ex in examples]
    targets = [task.postprocess_fn(ex["targets_pretokenized"].decode(), example=ex,
                                   is_target=True) for ex in examples]
    wrong = {"entailment": "neutral", "neutral": "contradiction",
             "contradiction": "entailment"}
    predictions = [labels[0], labels[1], wrong[labels[2]], "maybe"]  # 2 of 4 right
    predictions = [task.postprocess_fn(p, example=None, is_target=False) for p in predictions]
    assert targets == [["entailment", "neutral", "contradiction"].index(x) for x in labels]
    metrics = {}
    for fn in task.metric_fns:
        metrics.update(fn(targets, predictions))
    assert metrics == {"accuracy": pytest.approx(50.0)}


@pytest.mark.parametrize("source", ["json", "tfds"])
def test_squad_format_and_em_f1_over_all_answers(tmp_path, monkeypatch, vocab_path, source):
    if source == "json":
        demo_corpus.write_squad(str(tmp_path / "squad"), train_articles=2, dev_articles=1)
        data_env(monkeypatch, tmp_path, vocab_path, squad_dir=tmp_path / "squad")
    else:
        from data_helpers import squad_tfds
        squad_tfds(str(tmp_path / "tfds"))
        data_env(monkeypatch, tmp_path, vocab_path, tfds_data_dir=tmp_path / "tfds")
    task = seqio.TaskRegistry.get("squad_v1_1")
    train = _examples("squad_v1_1", lengths={"inputs": 128, "targets": 16})
    assert len(train) == 6
    inputs = _text(train[0], "inputs")
    assert inputs.startswith("question: What does ") and " context: " in inputs
    assert " ? context:" in inputs  # T5 pads punctuation with spaces
    examples = _examples("squad_v1_1", split="validation",
                         lengths={"inputs": 128, "targets": 16})
    assert len(examples) == 3
    targets = [task.postprocess_fn(_text(ex, "targets"), example=ex, is_target=True)
               for ex in examples]
    # Three answers each: "<adj> <obj>", "<obj>", "a <adj> <obj>".
    assert all(len(t) == 3 and t[1] == t[0].split()[1] for t in targets)
    predictions = [targets[0][1],               # matches the second answer: EM 1, F1 1
                   targets[1][0].split()[0],    # "<adj>" vs "<adj> <obj>": EM 0, F1 2/3
                   "nothing like it"]           # EM 0, F1 0
    metrics = {}
    for fn in task.metric_fns:
        metrics.update(fn(targets, predictions))
    assert metrics["em"] == pytest.approx(100 / 3)
    assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)


@pytest.mark.slow
def test_c4_span_corruption_from_local_tfds(tmp_path, monkeypatch, vocab_path):
    from data_helpers import c4_tfds
    c4_tfds(str(tmp_path / "tfds"))
    data_env(monkeypatch, tmp_path, vocab_path, tfds_data_dir=tmp_path / "tfds")
    assert _examples("c4_span_corruption", n=3)
    assert _examples("c4_lm", split="validation", n=1, lengths={"targets": 16})


def test_configure_sets_locations_and_registers_again(tmp_path, monkeypatch, vocab_path):
    demo_corpus.write_squad(str(tmp_path / "squad"), train_articles=1, dev_articles=1)
    data_env(monkeypatch, tmp_path, vocab_path)  # nothing set but the vocabulary
    monkeypatch.delenv("T5LITE_VOCABULARY_PATH")
    before = seqio.TaskRegistry.get("squad_v1_1")
    tasks.configure(settings.DataSettings(vocabulary_path=vocab_path,
                                        squad_dir=str(tmp_path / "squad")))
    after = seqio.TaskRegistry.get("squad_v1_1")
    assert after is not before
    assert len(_examples("squad_v1_1", split="validation",
                         lengths={"inputs": 128, "targets": 16})) == 3
    # A configured value wins over the environment.
    monkeypatch.setenv("T5LITE_SQUAD_DIR", str(tmp_path / "elsewhere"))
    assert tasks.configured().resolve().get("squad_dir") == str(tmp_path / "squad")


# -- errors: one clear line saying what was expected where -------------------------------
def _error(name, split="train", lengths=LENGTHS):
    with pytest.raises(Exception) as info:
        _examples(name, split=split, n=1, lengths=lengths)
    return info


def test_missing_data_names_the_setting_and_the_files(tmp_path, monkeypatch, vocab_path):
    data_env(monkeypatch, tmp_path, vocab_path)
    info = _error("pile_span_corruption")
    assert info.type is DataNotFoundError
    msg = str(info.value)
    assert "PILE_DIR" in msg and "T5LITE_PILE_DIR" in msg and "train/00.jsonl.zst" in msg
    assert "the_pile" in msg and "TFDS_DATA_DIR" in msg and "\n" not in msg
    msg = str(_error("mnli").value)
    assert "MNLI_DIR" in msg and "multinli_1.0_train.jsonl" in msg and "glue/mnli" in msg
    msg = str(_error("squad_v1_1").value)
    assert "SQUAD_DIR" in msg and "train-v1.1.json" in msg and "squad/v1.1" in msg
    msg = str(_error("c4_span_corruption").value)
    assert "c4/en" in msg and "TFDS_DATA_DIR" in msg

    monkeypatch.setenv("T5LITE_PILE_DIR", str(tmp_path / "no_such_dir"))
    info = _error("pile_span_corruption")
    assert info.type is DataNotFoundError and "does not exist" in str(info.value)
    assert "T5LITE_PILE_DIR" in str(info.value)
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / "data.parquet").write_text("x")
    monkeypatch.setenv("T5LITE_PILE_DIR", str(tmp_path / "wrong"))
    info = _error("pile_lm", lengths={"targets": 16})
    assert info.type is DataNotFoundError and "no Pile files" in str(info.value)
    assert "train/00.jsonl.zst" in str(info.value)

    only_train = tmp_path / "only_train"
    demo_corpus.write_squad(str(only_train), train_articles=1, dev_articles=1)
    (only_train / "dev-v1.1.json").unlink()
    monkeypatch.setenv("T5LITE_SQUAD_DIR", str(only_train))
    info = _error("squad_v1_1", split="validation")
    assert info.type is DataNotFoundError and "dev-v1.1.json" in str(info.value)


def test_wrong_formats_say_what_was_expected(tmp_path, monkeypatch, vocab_path):
    pile = tmp_path / "pile" / "train"
    pile.mkdir(parents=True)
    (pile / "00.jsonl").write_text(json.dumps({"content": "x", "meta": {}}) + "\n")
    squad = tmp_path / "squad"
    squad.mkdir()
    (squad / "train-v1.1.json").write_text(json.dumps({"version": "1.1", "articles": []}))
    mnli = tmp_path / "mnli"
    mnli.mkdir()
    (mnli / "train.tsv").write_text("a\tb\tc\n1\t2\t3\n")
    data_env(monkeypatch, tmp_path, vocab_path, pile_dir=tmp_path / "pile", squad_dir=squad,
             mnli_dir=mnli)
    info = _error("pile_span_corruption")
    assert info.type is DataFormatError
    assert "00.jsonl:1" in str(info.value) and "'text'" in str(info.value)
    info = _error("squad_v1_1", lengths={"inputs": 64, "targets": 8})
    assert info.type is DataFormatError and '"data"' in str(info.value)
    info = _error("mnli")
    assert info.type is DataFormatError and "gold_label" in str(info.value)


def test_bad_line_in_the_middle_of_a_file_is_reported_by_the_iterator(tmp_path, monkeypatch,
                                                                      vocab_path):
    pile = tmp_path / "pile" / "train"
    pile.mkdir(parents=True)
    lines = [json.dumps({"text": d["text"]}) for d in demo_corpus.pile_documents(3)]
    (pile / "00.jsonl").write_text("\n".join(lines + ["not json at all"]) + "\n")
    data_env(monkeypatch, tmp_path, vocab_path, pile_dir=tmp_path / "pile")
    it = pipeline.make_iterator("pile_lm", split="train", feature_lengths={"targets": 16},
                                layout=DataLayout(2), model_kind="decoder_only", shuffle=False)
    with pytest.raises(DataFormatError, match=r"00.jsonl:4: not JSON"):
        for _ in range(100):
            next(it)


def test_unknown_task_and_split(tmp_path, monkeypatch, vocab_path):
    data_env(monkeypatch, tmp_path, vocab_path)
    with pytest.raises(UnknownTaskError, match=r"'pile_span_corupption'.*did you mean "
                                               r"'pile_span_corruption'.*mnli, squad_v1_1"):
        tasks.get_provider("pile_span_corupption")
    with pytest.raises(Exception, match="no split 'validation'.*validation_matched"):
        pipeline.make_iterator("mnli", split="validation", feature_lengths=LENGTHS,
                               layout=DataLayout(2))


def test_importing_tasks_registers_them_with_no_data_and_hides_gpus_from_tensorflow(
        tmp_path):
    import os
    import subprocess
    import sys
    code = ("import seqio, tensorflow as tf, t5lite.data.tasks as t;"
            "print(all(n in seqio.TaskRegistry.names() for n in t.TASK_NAMES),"
            " tf.config.get_visible_devices('GPU'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("T5LITE_")}
    env["TFDS_DATA_DIR"] = str(tmp_path / "nothing_here")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert out.split() == ["True", "[]"]


def _write_c4_and_pile(tmp_path, docs_per_file=5):
    """The same documents as allenai/c4 lays them out (gzip JSON lines, two train shards)
    and in the Pile's layout (plain JSON lines)."""
    import gzip
    import random
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "north"]

    def doc(i):
        return {"text": f"document {i}: " + " ".join(rng.choice(words) for _ in range(60)),
                "timestamp": "2019-04-25T12:57:54Z", "url": f"https://example.com/{i}"}
    shards = [[doc(f * docs_per_file + i) for i in range(docs_per_file)] for f in range(2)]
    val = [doc(100 + i) for i in range(3)]
    c4, pile = tmp_path / "c4", tmp_path / "pile"
    (c4 / "en").mkdir(parents=True)
    (pile / "train").mkdir(parents=True)
    for f, records in enumerate(shards):
        lines = "".join(json.dumps(r) + "\n" for r in records).encode()
        (c4 / "en" / f"c4-train.{f:05d}-of-00002.json.gz").write_bytes(gzip.compress(lines))
        (pile / "train" / f"{f:02d}.jsonl").write_bytes(lines)
    lines = "".join(json.dumps(r) + "\n" for r in val).encode()
    (c4 / "en" / "c4-validation.00000-of-00001.json.gz").write_bytes(gzip.compress(lines))
    (pile / "val.jsonl").write_bytes(lines)
    return c4, pile


def _same_examples(a, b):
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def test_c4_from_allenai_c4_json_gz_equals_the_pile_reader_on_the_same_documents(
        tmp_path, monkeypatch, vocab_path):
    """C4_DIR in allenai/c4's layout feeds c4_span_corruption / c4_lm without TFDS, through
    the Pile's reader: the examples equal pile_* ones on the same documents."""
    c4, pile = _write_c4_and_pile(tmp_path)
    data_env(monkeypatch, tmp_path, vocab_path, c4_dir=c4, pile_dir=pile)
    for task, split, lengths in (("span_corruption", "train", LENGTHS),
                                 ("lm", "train", {"targets": 32}),
                                 ("lm", "validation", {"targets": 32})):
        _same_examples(_examples(f"c4_{task}", split=split, lengths=lengths),
                       _examples(f"pile_{task}", split=split, lengths=lengths))
    tokens = np.concatenate([ex["targets"] for ex in _examples("c4_lm", lengths={"targets": 32})])
    assert int((tokens == 1).sum()) == 10  # both shards' documents, each ending in EOS


def test_c4_data_that_is_missing_or_damaged_is_one_line(tmp_path, monkeypatch, vocab_path):
    data_env(monkeypatch, tmp_path, vocab_path)
    with pytest.raises(DataNotFoundError, match=r"no C4 data: .*C4_DIR.* allenai/c4 .*or "
                                                r"provide a prepared TFDS c4/en"):
        _examples("c4_lm", lengths={"targets": 32})
    c4, _ = _write_c4_and_pile(tmp_path)
    shard = c4 / "en" / "c4-train.00001-of-00002.json.gz"
    shard.write_bytes(shard.read_bytes()[:40])
    data_env(monkeypatch, tmp_path, vocab_path, c4_dir=c4)
    with pytest.raises(DataFormatError, match=r"c4-train.00001-of-00002.json.gz: truncated "
                                              r"gzip file"):
        _examples("c4_lm", lengths={"targets": 32})


def _write_formats(tmp_path, docs):
    """The same documents in every format TEXT_FILES takes, and in the Pile's layout."""
    import gzip
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    data = "".join(json.dumps(d) + "\n" for d in docs).encode()
    out = tmp_path / "formats"
    out.mkdir()
    (out / "docs.jsonl").write_bytes(data)
    (out / "docs.jsonl.gz").write_bytes(gzip.compress(data))
    c = zstandard.ZstdCompressor()
    (out / "docs.jsonl.zst").write_bytes(b"".join(c.compress(data[i:i + 500])
                                                  for i in range(0, len(data), 500)))
    pq.write_table(pa.Table.from_pylist(docs), out / "docs.parquet", row_group_size=3)
    (tmp_path / "pile" / "train").mkdir(parents=True)
    (tmp_path / "pile" / "train" / "00.jsonl").write_bytes(data)
    return out


def _docs(n, field="text"):
    import random
    rng = random.Random(5)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "light", "north"]
    return [{field: f"doc {i}: " + " ".join(rng.choice(words) for _ in range(50)),
             "id": f"<urn:uuid:{i}>", "score": 0.5 + i / 100} for i in range(n)]


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.jsonl.gz", "docs.jsonl.zst",
                                  "docs.parquet"])
def test_text_files_of_every_format_equal_the_pile_reader(tmp_path, monkeypatch, vocab_path,
                                                          name):
    out = _write_formats(tmp_path, _docs(10))
    data_env(monkeypatch, tmp_path, vocab_path, text_files=out / name,
             pile_dir=tmp_path / "pile")
    _same_examples(_examples("text_lm", lengths={"targets": 32}),
                   _examples("pile_lm", lengths={"targets": 32}))
    _same_examples(_examples("text_span_corruption"), _examples("pile_span_corruption"))


def test_text_files_take_globs_a_field_and_a_validation_glob(tmp_path, monkeypatch,
                                                             vocab_path):
    import os
    out = _write_formats(tmp_path, _docs(6, field="content"))
    data_env(monkeypatch, tmp_path, vocab_path,
             text_files=os.pathsep.join([str(out / "*.parquet"), str(out / "docs.jsonl*")]),
             text_validation_files=out / "docs.jsonl.gz", text_field="content")
    source = seqio.TaskRegistry.get("text_lm").source.resolve()
    assert source.list_shards("train") == [str(out / n) for n in (
        "docs.parquet", "docs.jsonl", "docs.jsonl.gz", "docs.jsonl.zst")]
    tokens = np.concatenate([ex["targets"] for ex in _examples("text_lm",
                                                                lengths={"targets": 32})])
    assert int((tokens == 1).sum()) == 4 * 6  # every document of the four files, once
    assert _examples("text_lm", split="validation", lengths={"targets": 32})


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.jsonl.gz", "docs.jsonl.zst",
                                  "docs.parquet"])
def test_two_processes_read_disjoint_records_that_make_up_the_file(tmp_path, monkeypatch,
                                                                   vocab_path, name):
    out = _write_formats(tmp_path, _docs(11))
    data_env(monkeypatch, tmp_path, vocab_path, text_files=out / name)
    source = seqio.TaskRegistry.get("text_lm").source.resolve()
    seen = [[ex["text"].decode() for ex in source.get_dataset(
        "train", shuffle=False, shard_info=seqio.ShardInfo(i, 2)).as_numpy_iterator()]
        for i in range(2)]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(d["text"] for d in _docs(11))


@pytest.mark.parametrize("setup,error,message", [
    ({}, DataNotFoundError, r"no text files: set the gin macro TEXT_FILES .* T5LITE_TEXT_FILES"
                            r" to a glob .*\.parquet files"),
    ({"text_files": "{tmp}/nothing/*.jsonl"}, DataNotFoundError,
     r"nothing/\*\.jsonl: no file matches it \(from environment variable T5LITE_TEXT_FILES\)"),
    ({"text_files": "{tmp}/formats/*"}, None, None),  # every file there is a text format
    ({"text_files": "{tmp}/notes.txt"}, DataFormatError,
     r"notes.txt: not a text file t5lite reads .*expected .jsonl, .jsonl.gz"),
    ({"text_files": "{tmp}/formats/docs.parquet", "text_field": "body"}, DataFormatError,
     r"docs.parquet: no column 'body' \(its columns: text, id, score\); set TEXT_FIELD"),
    ({"text_files": "{tmp}/formats/docs.jsonl.gz", "text_field": "body"}, DataFormatError,
     r"docs.jsonl.gz:1: expected a JSON object with a 'body' string"),
])
def test_bad_text_files_are_one_line(tmp_path, monkeypatch, vocab_path, setup, error,
                                     message):
    _write_formats(tmp_path, _docs(4))
    (tmp_path / "notes.txt").write_text("a note\n")
    data_env(monkeypatch, tmp_path, vocab_path,
             **{k: v.format(tmp=tmp_path) for k, v in setup.items()})
    if error is None:
        assert _examples("text_lm", lengths={"targets": 32})
        return
    with pytest.raises(error, match=message):
        _examples("text_lm", lengths={"targets": 32})


def _pipeline_batches(name, model_kind, pack, lengths, batches=2):
    it = pipeline.make_iterator(name, split="train", layout=DataLayout(4), seed=1,
                                feature_lengths=lengths, model_kind=model_kind, pack=pack,
                                shuffle_buffer_size=8)
    return [next(it) for _ in range(batches)]


def _where(function):
    function = getattr(function, "func", function)
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}"


def test_t5lites_tasks_are_traced_without_autograph_and_give_the_same_batches(
        tmp_path, monkeypatch, vocab_path):
    """t5lite's tasks and feature converters build their datasets with AutoGraph off
    (tf_env.as_written), packing included (data/packing.py), and so does seqio's
    Evaluator with t5lite's converter: no function goes through AutoGraph. Each task's
    batches, packed and unpacked, for both model kinds, equal those of the same pipeline
    as SeqIO builds it (AutoGraph on, SeqIO's own packing). A user's own SeqIO task keeps
    AutoGraph: its preprocessor's Python `if` on a tensor still works."""
    from tensorflow.python.autograph.impl import api as autograph  # what tf.data calls
    import tensorflow as tf
    from t5lite.data import features
    demo_corpus.write_pile(str(tmp_path / "pile"), train_files=1, docs_per_file=12,
                           eval_docs=2)
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=12, dev=2)
    demo_corpus.write_squad(str(tmp_path / "squad"), train_articles=3, dev_articles=1)
    data_env(monkeypatch, tmp_path, vocab_path, pile_dir=tmp_path / "pile",
             mnli_dir=tmp_path / "multinli", squad_dir=tmp_path / "squad")
    cases = [("pile_span_corruption", "encoder_decoder", True, LENGTHS),
             ("pile_lm", "decoder_only", False, {"targets": 32}),
             ("mnli", "decoder_only", True, {"inputs": 96, "targets": 8}),
             ("squad_v1_1", "encoder_decoder", False, {"inputs": 128, "targets": 16})]
    calls = []
    real = autograph.converted_call
    monkeypatch.setattr(autograph, "converted_call",
                        lambda f, *a, **k: calls.append(f) or real(f, *a, **k))
    as_written = {}
    for name, model_kind, pack, lengths in cases:
        as_written[name] = _pipeline_batches(name, model_kind, pack, lengths)
        assert not calls, (name, sorted(set(map(_where, calls))))
    # seqio's Evaluator (in-training and t5lite.eval evaluations) converts with them too
    from t5lite.inference import task_eval
    evaluator = task_eval.TaskEvaluator("mnli", "validation_matched",
                                        {"inputs": 96, "targets": 16})
    assert evaluator.num_examples == {"mnli": 2}
    assert not calls, sorted(set(map(_where, calls)))
    for module in (tasks, features):  # AutoGraph on, as SeqIO builds any task
        monkeypatch.setattr(module, "as_written", lambda build: build)
    # and SeqIO's own packing (seqio.utils.trim_and_pack_dataset)
    monkeypatch.delattr(features._AsWritten, "_pack_or_pad")
    for case in cases:
        converted = _pipeline_batches(*case)
        assert calls, case  # these did go through AutoGraph
        assert [b.keys() for b in converted] == [b.keys() for b in as_written[case[0]]]
        for got, want in zip(as_written[case[0]], converted):
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=(case, key))
    monkeypatch.undo()

    @seqio.map_over_dataset
    def clipped(ex):
        if tf.size(ex["targets"]) > 3:  # Python control flow: AutoGraph's to convert
            ex["targets"] = ex["targets"][:3]
        return ex

    seqio.TaskRegistry.add(
        "users_autograph_task", source=seqio.FunctionDataSource(
            lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices(
                tf.ragged.constant([[5, 6, 7, 8, 9], [5, 6]])).map(lambda t: {"targets": t}),
            splits=["train"]),
        preprocessors=[clipped],
        output_features={"targets": seqio.Feature(seqio.PassThroughVocabulary(64),
                                                  add_eos=False)})
    try:
        it = pipeline.make_iterator("users_autograph_task", split="train",
                                    layout=DataLayout(2), feature_lengths={"targets": 4},
                                    model_kind="decoder_only", shuffle=False)
        np.testing.assert_array_equal(next(it)["decoder_target_tokens"],
                                      [[5, 6, 7, 0], [5, 6, 0, 0]])
    finally:
        seqio.TaskRegistry.remove("users_autograph_task")
