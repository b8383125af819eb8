"""t5lite.data.settings: the data settings are a value handed to the tasks, their
sources and vocabulary, not module state. A configured value wins over the environment,
None falls back to it (read when a dataset is built); the registered tasks (SeqIO's
process-wide registry) are the one place the settings of the last `configure` are kept,
and a task object built under other settings keeps its own."""
import os
import shutil

import pytest

from t5lite.data import settings
from t5lite.data.files import demo_corpus
from t5lite.errors import ConfigError

from data_helpers import data_env, reset_data_settings, vocabulary


# -- the value itself (no TensorFlow) ----------------------------------------------------
def test_a_configured_value_wins_and_none_falls_back_to_the_environment(monkeypatch):
    monkeypatch.setenv("T5LITE_PILE_DIR", "/from/env/pile")
    monkeypatch.setenv("T5LITE_MNLI_DIR", "~/mnli")
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    monkeypatch.delenv("T5LITE_EXTRA_IDS", raising=False)
    data = settings.DataSettings(pile_dir="/from/gin/pile", extra_ids=0)
    resolved = data.resolve()
    assert resolved.get("pile_dir") == "/from/gin/pile"
    assert resolved.source_of("pile_dir") == "from gin macro PILE_DIR"
    assert resolved.get("mnli_dir") == os.path.expanduser("~/mnli")
    assert resolved.source_of("mnli_dir") == "from environment variable T5LITE_MNLI_DIR"
    assert resolved.get("tfds_data_dir") == os.path.expanduser("~/tensorflow_datasets")
    assert resolved.source_of("tfds_data_dir") == "the default"
    assert resolved.extra_ids() == 0 and settings.DataSettings().resolve().extra_ids() == 100
    assert resolved.text_field() == "text"
    # The environment is read when the value is resolved, not when it is made.
    monkeypatch.setenv("T5LITE_MNLI_DIR", "/later/mnli")
    assert data.resolve().get("mnli_dir") == "/later/mnli"
    assert data.resolve().get("pile_dir") == "/from/gin/pile"


def test_settings_are_hashable_values(monkeypatch):
    monkeypatch.delenv("T5LITE_TEXT_FILES", raising=False)
    data = settings.DataSettings(text_files=["/a/*.jsonl", "/b/*.parquet"])
    assert data.text_files == ("/a/*.jsonl", "/b/*.parquet")
    assert hash(data) == hash(settings.DataSettings(text_files=("/a/*.jsonl", "/b/*.parquet")))
    assert data.resolve() == data.resolve() and hash(data.resolve())
    assert data.resolve().get_globs("text_files") == ["/a/*.jsonl", "/b/*.parquet"]
    monkeypatch.setenv("T5LITE_EXTRA_IDS", "x")
    with pytest.raises(ConfigError, match="EXTRA_IDS.*'x'.*from environment variable"):
        settings.DataSettings().resolve().extra_ids()
    assert settings.DataSettings(extra_ids=5).resolve().extra_ids() == 5  # gin wins


def test_the_settings_module_keeps_no_values():
    assert not hasattr(settings, "_configured")
    for name in ("set_values", "reset", "get", "snapshot", "source_of", "extra_ids"):
        assert not hasattr(settings, name), name


# -- the tasks hold them -----------------------------------------------------------------
pytest.importorskip("seqio")

import seqio  # noqa: E402

from t5lite.data import sources, tasks, vocabularies  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_settings():
    yield
    reset_data_settings()


def _squad(tmp_path, name, seed):
    directory = tmp_path / name
    demo_corpus.write_squad(str(directory), train_articles=1, dev_articles=1, seed=seed)
    return directory


def _shards(task, split="train"):
    return task.source.list_shards(split)


def test_each_configure_gives_tasks_that_read_its_settings(tmp_path, monkeypatch,
                                                           tmp_path_factory):
    vocab_a = vocabulary(tmp_path_factory)
    vocab_b = str(tmp_path / "b.model")
    shutil.copy(vocab_a, vocab_b)
    data_env(monkeypatch, tmp_path, vocab_a)
    monkeypatch.delenv("T5LITE_VOCABULARY_PATH")
    squad_a, squad_b = _squad(tmp_path, "a", 1), _squad(tmp_path, "b", 2)
    a = settings.DataSettings(vocabulary_path=vocab_a, squad_dir=str(squad_a))
    b = settings.DataSettings(vocabulary_path=vocab_b, squad_dir=str(squad_b))

    assert vocabularies.SETTINGS_TASK in tasks.TASK_NAMES  # where configured() looks
    tasks.configure(a)
    task_a = seqio.TaskRegistry.get("squad_v1_1")
    assert tasks.configured() == a
    tasks.configure(b)
    task_b = seqio.get_mixture_or_task("squad_v1_1")
    assert task_b is not task_a and tasks.configured() == b
    assert _shards(task_b) == [str(squad_b / "train-v1.1.json")]
    assert vocabularies.get_vocabulary().sentencepiece_model_file == vocab_b
    assert task_b.output_features["targets"].vocabulary.vocabulary_file == vocab_b
    # The task built under A still reads A: nothing it reads was overwritten by B.
    assert _shards(task_a) == [str(squad_a / "train-v1.1.json")]
    assert task_a.output_features["targets"].vocabulary.vocabulary_file == vocab_a
    assert vocabularies.get_vocabulary(data=a).sentencepiece_model_file == vocab_a
    ds = task_b.get_dataset({"inputs": 128, "targets": 16}, split="validation",
                            shuffle=False)
    contexts = {ex["inputs_pretokenized"].decode() for ex in ds.as_numpy_iterator()}
    assert contexts and all("context:" in c for c in contexts)


def test_the_environment_reaches_only_what_configure_left_none(tmp_path, monkeypatch,
                                                               tmp_path_factory):
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory))
    squad_a, squad_b = _squad(tmp_path, "a", 1), _squad(tmp_path, "b", 2)
    mnli = tmp_path / "mnli"
    demo_corpus.write_multinli(str(mnli), train=6, dev=2)
    tasks.configure(settings.DataSettings(squad_dir=str(squad_a)))
    squad_task, mnli_task = (seqio.TaskRegistry.get(n) for n in ("squad_v1_1", "mnli"))
    monkeypatch.setenv("T5LITE_SQUAD_DIR", str(squad_b))
    monkeypatch.setenv("T5LITE_MNLI_DIR", str(mnli))
    # squad_dir was configured: the environment does not move it, until configure again
    assert _shards(squad_task) == [str(squad_a / "train-v1.1.json")]
    # mnli_dir was left None: its environment variable is read when the data is asked for
    assert _shards(mnli_task) == [str(mnli / "multinli_1.0_train.jsonl")]
    tasks.configure(settings.DataSettings())
    assert _shards(seqio.TaskRegistry.get("squad_v1_1")) == [str(squad_b / "train-v1.1.json")]
    assert _shards(squad_task) == [str(squad_a / "train-v1.1.json")]


def test_a_deferred_source_resolves_once_per_resolved_settings(monkeypatch):
    monkeypatch.setenv("T5LITE_PILE_DIR", "/one")
    seen = []

    def resolver(data):
        seen.append(data)
        return object()

    source = sources.DeferredSource(("train",), resolver, "a test source",
                                    settings.DataSettings(squad_dir="/squad"))
    first = source.resolve()
    assert source.resolve() is first and len(seen) == 1
    assert seen[0] == settings.DataSettings(squad_dir="/squad").resolve()  # the cache key
    assert seen[0].get("pile_dir") == "/one" and seen[0].get("squad_dir") == "/squad"
    monkeypatch.setenv("T5LITE_PILE_DIR", "/two")
    assert source.resolve() is not first and seen[-1].get("pile_dir") == "/two"
