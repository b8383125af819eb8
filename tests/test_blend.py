"""Weighted blends of corpora (t5lite/data/blend.py): the schedule's shares and counts,
TEXT_FILES with weights in each of its forms, the blended stream against its sources read
alone, and bad weights in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

import model_helpers as mh
from data_helpers import data_env, vocabulary

pytest.importorskip("seqio")

from t5lite.data import blend, pipeline, settings, tasks  # noqa: E402
from t5lite.data.sharding.layout import DataLayout  # noqa: E402
from t5lite.errors import ConfigError, DataNotFoundError  # noqa: E402

LM = {"targets": 16}
# the run below: tiny T5 with one layer a side and 512 vocabulary entries (the test
# vocabulary's 400 ids: 300 pieces and 100 sentinels) instead of T5's 32128
SMALL_MODEL = mh.small_flags()


@pytest.mark.parametrize("weights", [[0.7, 0.3], [1, 1, 1], [0.5, 0.25, 0.125, 0.125],
                                     [3.3, 0.02, 1.7, 5.0], [0.9999, 0.0001]])
def test_every_prefix_of_the_schedule_keeps_each_share_and_counts_match_the_rows(weights):
    schedule = blend.Schedule([f"s{i}" for i in range(len(weights))], weights)
    n = max(10_000, 2 * schedule.period + 3)  # two periods at least
    rows = np.resize(schedule.table, n)  # the stream's first n rows (it repeats)
    running = np.cumsum(np.eye(len(weights), dtype=np.int64)[rows], axis=0)  # [n, sources]
    expected = np.outer(np.arange(1, n + 1), schedule.shares)
    assert np.abs(running - expected).max() <= (len(weights) + 1) / 2
    for k in (0, 1, 7, schedule.period, schedule.period + 3, 4321, 10_000, n):
        np.testing.assert_array_equal(schedule.counts(k), running[k - 1] if k else 0)
    given = np.asarray(weights) / sum(weights)
    assert np.abs(running[10_000 - 1] / 10_000 - given).max() < 0.01  # shares within 1%


def test_a_source_of_weight_zero_is_left_out():
    schedule = blend.Schedule(["a", "b", "c"], [2, 0, 1])
    assert schedule.names == ("a", "c") and list(schedule.units) == [2, 1]


@pytest.mark.parametrize("weights,message", [
    ([0.7, -0.3], "a weight must be a finite number >= 0, got -0.3"),
    ([0, 0.0], "every weight is 0"),
    ([float("nan"), 1], "a weight must be a finite number >= 0, got nan"),
    ([1, "0.3"], "a weight must be a finite number >= 0, got '0.3'"),
    ([1, 1e-6], "the weight of b is under 1/20000 of the total")])
def test_bad_weights_are_one_line(weights, message):
    with pytest.raises(ConfigError, match="^TEXT_FILES: " + message.replace(".", r"\.")):
        blend.Schedule(["a", "b"], weights, "TEXT_FILES")


def test_source_names_come_from_the_globs():
    assert blend.source_names(["/data/web/*.jsonl.zst", "/data/code/*.parquet",
                               "/data/wiki.parquet", "/other/web/*/x.jsonl", "*.jsonl"]) == [
        "web", "code", "wiki", "web_2", "text"]


def _write(directory, word: str, n: int):
    directory.mkdir()
    for f in range(2):
        with open(directory / f"{f}.jsonl", "w") as out:
            for i in range(n):
                out.write(json.dumps({"text": f"{word} {f} {i} " + " ".join(
                    [word] * (i % 5))}) + "\n")
    return str(directory / "*.jsonl")


@pytest.fixture
def corpora(tmp_path):
    """Two corpora of different words: web (2 files of 40 documents) and code (2 of 30)."""
    return _write(tmp_path / "web", "river", 40), _write(tmp_path / "code", "stone", 30)


def _rows(iterator, batches: int):
    out = []
    for _ in range(batches):
        batch = next(iterator)
        out += [{k: v[i] for k, v in batch.items()}
                for i in range(len(batch["decoder_target_tokens"]))]
    iterator.close()
    return out


def _iterator(batch: int = 10, process: int = 0, processes: int = 1):
    return pipeline.make_iterator("text_lm", split="train", feature_lengths=LM,
                                  layout=DataLayout(batch, process, processes),
                                  model_kind="decoder_only", seed=3, shuffle_buffer_size=4)


def test_a_weighted_text_blend_is_its_sources_rows_in_the_schedules_order(
        corpora, tmp_path, monkeypatch, tmp_path_factory):
    """TEXT_FILES weighted 0.7 / 0.3 (as the environment writes it: JSON): 30 rows are
    the rows each corpus gives read alone (TEXT_FILES its glob), taken in the schedule's
    order, and source_rows counts them."""
    web, code = corpora
    vocab = vocabulary(tmp_path_factory)
    data_env(monkeypatch, tmp_path, vocab, text_files=json.dumps([[web, 0.7], [code, 0.3]]))
    blended = _iterator()
    rows = _rows(blended, 3)
    assert blended.source_rows() == {"web": 21, "code": 9}
    assert blended.source_rows(1) == {"web": 7, "code": 3}
    alone = {}
    for name, glob in (("web", web), ("code", code)):
        data_env(monkeypatch, tmp_path, vocab, text_files=glob)
        alone[name] = iter(_rows(_iterator(batch=1), 21 if name == "web" else 9))
    schedule = blend.Schedule(["web", "code"], [0.7, 0.3])
    for k, row in enumerate(rows):
        want = next(alone[schedule.names[schedule.table[k % schedule.period]]])
        for key in row:
            np.testing.assert_array_equal(row[key], want[key], err_msg=f"row {k} {key}")


def test_the_blend_reads_the_same_from_gin_pairs_and_from_a_weights_file(
        corpora, tmp_path, monkeypatch, tmp_path_factory):
    web, code = corpora
    vocab = vocabulary(tmp_path_factory)
    data_env(monkeypatch, tmp_path, vocab, text_files=json.dumps([[web, 0.7], [code, 0.3]]))
    want = _rows(_iterator(), 1)
    # Megatron's syntax, paths relative to the file, a comment, pairs across lines
    (tmp_path / "blend.txt").write_text("# web first\n0.7 web/*.jsonl\n0.3\ncode/*.jsonl\n")
    for value in ([(web, 0.7), (code, 0.3)], f"@{tmp_path / 'blend.txt'}"):
        data_env(monkeypatch, tmp_path, vocab)
        tasks.configure(settings.DataSettings(text_files=value))
        it = _iterator()
        got = _rows(it, 1)
        assert it.source_rows() == {"web": 7, "code": 3}
        for a, b in zip(got, want):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])


def test_each_data_shard_blends_its_own_rows_and_the_counts_are_global(
        corpora, tmp_path, monkeypatch, tmp_path_factory):
    """Process 1 of 2 reads data shard 1 (its half of each corpus), blended in the same
    order; source_rows counts both shards' rows."""
    web, code = corpora
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory),
             text_files=json.dumps([[web, 0.7], [code, 0.3]]))
    it = _iterator(batch=20, process=1, processes=2)
    rows = _rows(it, 2)
    assert len(rows) == 20 and it.source_rows() == {"web": 28, "code": 12}
    first_words = [r["decoder_target_tokens"][0] for r in rows]
    assert len(set(first_words)) > 1


@pytest.mark.parametrize("value,error,message", [
    ([("{tmp}/web/*.jsonl", 0.7), ("{tmp}/nothing/*.jsonl", 0.3)], DataNotFoundError,
     r"nothing/\*\.jsonl: no file matches it"),
    ([("{tmp}/web/*.jsonl", -1.0), ("{tmp}/code/*.jsonl", 0.3)], ConfigError,
     r"^TEXT_FILES: a weight must be a finite number >= 0, got -1\.0$"),
    ([("{tmp}/web/*.jsonl", 0), ("{tmp}/code/*.jsonl", 0)], ConfigError,
     r"^TEXT_FILES: every weight is 0"),
    ([("{tmp}/web/*.jsonl", 0.7), "{tmp}/code/*.jsonl"], ConfigError,
     r"^TEXT_FILES: a weighted list holds \(glob, weight\) pairs"),
    ("@{tmp}/missing.txt", DataNotFoundError, r"missing\.txt: cannot read the weights file"),
    ("@{tmp}/odd.txt", ConfigError, r"odd\.txt: a weights file holds weight and path pairs"),
    ("@{tmp}/swapped.txt", ConfigError, r"swapped\.txt: 'web/\*\.jsonl' is not a weight"),
    ("@{tmp}/missing_path.txt", DataNotFoundError, r"gone/\*\.jsonl: no file matches it"),
], ids=["glob_without_files", "negative", "all_zero", "unweighted_entry",
        "no_weights_file", "odd_words", "path_first", "missing_path_in_file"])
def test_bad_blends_are_one_line(corpora, tmp_path, monkeypatch, tmp_path_factory, value,
                                 error, message):
    (tmp_path / "odd.txt").write_text("0.7 web/*.jsonl 0.3\n")
    (tmp_path / "swapped.txt").write_text("web/*.jsonl 0.7\n")
    (tmp_path / "missing_path.txt").write_text("0.7 web/*.jsonl 0.3 gone/*.jsonl\n")
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory))
    if isinstance(value, str):
        value = value.format(tmp=tmp_path)
    else:
        value = [(v[0].format(tmp=tmp_path),) + v[1:] if isinstance(v, tuple)
                 else v.format(tmp=tmp_path) for v in value]
    with pytest.raises(error, match=message) as caught:
        tasks.configure(settings.DataSettings(text_files=value))
        next(_iterator())
    assert "\n" not in str(caught.value)


def test_a_run_on_a_blend_logs_each_sources_rows_and_a_resume_counts_on(
        corpora, tmp_path, tmp_path_factory, capsys):
    """Tiny T5 (cut to one layer a side and a 512-entry vocabulary: the rows counted do
    not depend on the model), in this process (its 8 devices), on text_span_corruption
    over TEXT_FILES weighted 0.7 / 0.3 (the gin list a user writes), 8 rows a step,
    logged every 2 steps, stopped at 4 and resumed to 6: TensorBoard's data/rows/<source>
    are the schedule's counts, by hand: its period is web code web web web code web web
    code web (7 web, 3 code), so 16 rows (a period and 6 rows) are 11 + 5, 32 (3 and 2)
    are 22 + 10 and 48 (4 and 8) are 34 + 14."""
    import train_helpers as th
    from t5lite import train
    web, code = corpora
    vocab = vocabulary(tmp_path_factory)

    def run(steps):
        status = train.main([
            "--gin_file=models/t5_1_1/tiny.gin", "--gin_file=runs/pretrain.gin",
            '--gin.MIXTURE_OR_TASK_NAME="text_span_corruption"',
            f"--gin.TEXT_FILES={[(web, 0.7), (code, 0.3)]!r}",
            f'--gin.VOCABULARY_PATH="{vocab}"', f'--gin.MODEL_DIR="{tmp_path / "run"}"',
            f"--gin.TRAIN_STEPS={steps}", "--gin.BATCH_SIZE=8", "--gin.LOG_PERIOD=2",
            "--gin.CHECKPOINT_PERIOD=2", "--gin.EVAL_PERIOD=None", th.SYNC_CHECKPOINTS,
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 16}", *SMALL_MODEL])
        return status, capsys.readouterr().err
    status, err = run(4)
    assert status == 0, err[-3000:]
    status, err = run(6)
    assert status == 0 and "resume:4" in err, err[-3000:]
    scalars = th.scalars(tmp_path / "run")
    assert scalars["data/rows/web"] == [(2, 11.0), (4, 22.0), (6, 34.0)]
    assert scalars["data/rows/code"] == [(2, 5.0), (4, 10.0), (6, 14.0)]


def test_mixtures_from_gin_blend_registered_tasks_at_their_rates(tmp_path, monkeypatch,
                                                                  tmp_path_factory):
    """MIXTURES = {'nli_and_qa': [('mnli', 3), ('squad_v1_1', 1)]}: a SeqIO mixture
    registered under that name, its rows MNLI's and SQuAD's read alone, 3 to 1 in the
    schedule's order (mnli mnli squad mnli)."""
    from t5lite.data.files import demo_corpus
    demo_corpus.write_multinli(str(tmp_path / "mnli"), train=40, dev=3)
    demo_corpus.write_squad(str(tmp_path / "squad"), train_articles=6, dev_articles=2)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory),
             mnli_dir=tmp_path / "mnli", squad_dir=tmp_path / "squad")
    lengths = {"inputs": 32, "targets": 8}

    def rows(name, batch, batches):
        return _rows(pipeline.make_iterator(name, split="train", feature_lengths=lengths,
                                            layout=DataLayout(batch), seed=3,
                                            shuffle_buffer_size=4), batches)
    tasks.configure(settings.DataSettings(mixtures={"nli_and_qa": [("mnli", 3),
                                                                   ("squad_v1_1", 1)]}))
    mixed = pipeline.make_iterator("nli_and_qa", split="train", feature_lengths=lengths,
                                   layout=DataLayout(8), seed=3, shuffle_buffer_size=4)
    got = _rows(mixed, 2)
    assert mixed.source_rows() == {"mnli": 12, "squad_v1_1": 4}
    alone = {"mnli": iter(rows("mnli", 1, 12)), "squad_v1_1": iter(rows("squad_v1_1", 1, 4))}
    for k, row in enumerate(got):
        want = next(alone[("mnli", "mnli", "squad_v1_1", "mnli")[k % 4]])
        for key in row:
            np.testing.assert_array_equal(row[key], want[key], err_msg=f"row {k} {key}")


@pytest.mark.parametrize("mixtures,error,message", [
    ({"mnli": [("squad_v1_1", 1)]}, "DataError", r"^MIXTURES: 'mnli' is a task's name"),
    ({"mix": [("mnli", 1), ("sqad_v1_1", 1)]}, "UnknownTaskError",
     r"^unknown task or mixture 'sqad_v1_1' \(did you mean 'squad_v1_1'\?\)"),
    ({"mix": [("mnli", 1), ("squad_v1_1", -2)]}, "ConfigError",
     r"^MIXTURES\['mix'\]: a weight must be a finite number >= 0, got -2"),
    ({"mix": ["mnli"]}, "ConfigError", r"^MIXTURES\['mix'\] must be a list of \(task, rate\)"),
], ids=["a_task_name", "unknown_task", "negative_rate", "no_rates"])
def test_bad_mixtures_are_one_line(mixtures, error, message):
    from t5lite import errors
    try:
        with pytest.raises(getattr(errors, error), match=message) as caught:
            tasks.configure(settings.DataSettings(mixtures=mixtures))
        assert "\n" not in str(caught.value)
    finally:
        tasks.register_tasks()
