"""Fixtures in the real data formats, written by the tests themselves (nothing binary is
committed): the Pile's jsonl / jsonl.zst, MultiNLI jsonl, GLUE TSVs, SQuAD JSON, prepared
TFDS datasets, and a small SentencePiece vocabulary trained on the generated text."""
from __future__ import annotations

import contextlib
import os
from typing import Dict, List

import pytest

from t5lite.data.files import demo_corpus

_VOCAB: Dict[str, str] = {}
VOCAB_SIZE = 300


def vocabulary(tmp_path_factory) -> str:
    """A 300-piece SentencePiece model, trained once per test session."""
    if "path" not in _VOCAB:
        from t5lite.data.files import vocab_training
        directory = tmp_path_factory.mktemp("vocab")
        text = demo_corpus.write_text(str(directory / "corpus.txt"), lines=800, seed=7)
        _VOCAB["path"] = vocab_training.train_vocabulary([text], str(directory / "spm.model"),
                                                VOCAB_SIZE)
    return _VOCAB["path"]


def llama_vocabulary(tmp_path_factory) -> str:
    """A 400-piece SentencePiece model with LLaMA's conventions (SentencePiece's
    defaults: unk 0, BOS 1, EOS 2, no padding piece; BPE with byte fallback), trained
    once per test session."""
    if "llama" not in _VOCAB:
        import sentencepiece as spm
        directory = tmp_path_factory.mktemp("llama_vocab")
        text = demo_corpus.write_text(str(directory / "corpus.txt"), lines=800, seed=7)
        spm.SentencePieceTrainer.train(input=text, model_prefix=str(directory / "llama"),
                                       vocab_size=400, model_type="bpe", byte_fallback=True,
                                       minloglevel=2)
        _VOCAB["llama"] = str(directory / "llama.model")
    return _VOCAB["llama"]


def mixed_lines(count: int, seed: int = 0) -> List[str]:
    """`count` lines of mixed text: ASCII, accents, CJK, emoji, code and runs of '!'."""
    import random
    rng = random.Random(seed)
    words = ["the", "model", "Hello", "world", "Ada", "boat", "lake", "ok", "training",
             "café", "naïve", "Zürich", "São", "Paulo", "Ærø", "façade", "crème", "brûlée",
             "東京", "你好世界", "日本語のテキスト", "한국어", "Привет", "مرحبا", "Ελλάδα",
             "🙂", "🚀", "👩‍💻", "🇫🇷", "∑x²", "def f(x):", "return x**2;", "{'a': [1, 2]}",
             "<div class=\"a\">", "for (int i=0;i<n;++i)", "!", "!!", "Wow!", "?!", "--",
             "    ", "\t", "https://example.com/a?b=c"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
            for _ in range(count)]


def byte_bpe_tokenizer(tmp_path_factory, config: bool = True) -> str:
    """A byte-level BPE tokenizer.json as LLaMA-3's and Qwen's are made (the `tokenizers`
    library, GPT-2's byte alphabet: id 0 is '!', a token of text), about 600 ids with
    `<|begin_of_text|>` / `<|end_of_text|>` added last, and with `config` a
    tokenizer_config.json beside it naming them bos_token / eos_token. Once a session."""
    key = f"byte_bpe_{config}"
    if key not in _VOCAB:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        directory = tmp_path_factory.mktemp(key)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(mixed_lines(400, seed=11), trainer)
        tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
        assert tok.id_to_token(0) == "!"
        tok.save(str(directory / "tokenizer.json"))
        if config:
            (directory / "tokenizer_config.json").write_text(
                '{"bos_token": "<|begin_of_text|>", '
                '"eos_token": {"content": "<|end_of_text|>", "special": true}}')
        _VOCAB[key] = str(directory / "tokenizer.json")
    return _VOCAB[key]


def data_env(monkeypatch, tmp_path, vocab_path: str, **dirs: str) -> None:
    """Point the settings at `dirs` (pile_dir=..., mnli_dir=...) through the environment,
    with an empty TFDS data directory unless tfds_data_dir is given; clears any
    configured values and registers the tasks again."""
    names = {"pile_dir": "T5LITE_PILE_DIR", "c4_dir": "T5LITE_C4_DIR",
             "text_files": "T5LITE_TEXT_FILES", "text_field": "T5LITE_TEXT_FIELD",
             "text_validation_files": "T5LITE_TEXT_VALIDATION_FILES",
             "mnli_dir": "T5LITE_MNLI_DIR",
             "squad_dir": "T5LITE_SQUAD_DIR", "tfds_data_dir": "TFDS_DATA_DIR"}
    for name, env in names.items():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv("T5LITE_EXTRA_IDS", raising=False)
    empty_tfds = tmp_path / "empty_tfds"
    empty_tfds.mkdir(exist_ok=True)
    monkeypatch.setenv("TFDS_DATA_DIR", str(empty_tfds))
    monkeypatch.setenv("T5LITE_VOCABULARY_PATH", vocab_path)
    for name, value in dirs.items():
        monkeypatch.setenv(names[name], str(value))
    reset_data_settings()


def reset_data_settings() -> None:
    """Forget configured data settings (the environment applies again): register the
    tasks again with DataSettings(), a test's teardown, so that none leaks into the
    next."""
    from t5lite.data import tasks
    tasks.register_tasks()


def store_tfds(data_dir: str, name: str, config, version: str, features,
               splits: Dict[str, List[dict]]) -> None:
    """A prepared TFDS dataset `name[/config]:version` under `data_dir`, holding the
    given examples (as TFDS itself would write it, no builder code needed to read it)."""
    import tensorflow as tf
    from tensorflow_datasets import dataset_builders

    def to_ds(examples):
        def gen():
            yield from examples
        sig = features.get_tensor_spec()
        return tf.data.Dataset.from_generator(gen, output_signature=sig)

    dataset_builders.store_as_tfds_dataset(
        name=name, config=config, version=version, features=features,
        split_datasets={k: to_ds(v) for k, v in splits.items()}, data_dir=data_dir,
        disable_shuffling=True)


def pile_tfds(data_dir: str, docs: Dict[str, int]) -> None:
    import tensorflow_datasets as tfds
    store_tfds(data_dir, "the_pile", None, "1.0.0",
               tfds.features.FeaturesDict({"text": tfds.features.Text()}),
               {split: [{"text": d["text"]} for d in demo_corpus.pile_documents(n, seed=i)]
                for i, (split, n) in enumerate(docs.items())})


def mnli_tfds(data_dir: str, n: int = 9) -> None:
    import tensorflow_datasets as tfds
    from t5lite.data.files.readers import MNLI_LABELS
    features = tfds.features.FeaturesDict({
        "premise": tfds.features.Text(), "hypothesis": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=list(MNLI_LABELS)), "idx": tf_int32()})
    splits = {}
    for k, split in enumerate(("train", "validation_matched", "validation_mismatched")):
        splits[split] = [{"premise": p, "hypothesis": h, "label": MNLI_LABELS.index(g),
                          "idx": i}
                         for i, (p, h, g, _) in enumerate(demo_corpus.mnli_pairs(n, seed=k))]
    store_tfds(data_dir, "glue", "mnli", "1.0.0", features, splits)


def squad_tfds(data_dir: str) -> None:
    import tensorflow_datasets as tfds
    features = tfds.features.FeaturesDict({
        "id": tfds.features.Text(), "title": tfds.features.Text(),
        "context": tfds.features.Text(), "question": tfds.features.Text(),
        "answers": tfds.features.Sequence({"text": tfds.features.Text(),
                                           "answer_start": tf_int32()})})
    splits = {}
    for split, n, extra in (("train", 2, False), ("validation", 1, True)):
        rows = []
        for article in demo_corpus.squad_articles(n, seed=len(splits), extra_answers=extra):
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    rows.append({"id": qa["id"], "title": article["title"],
                                 "context": paragraph["context"], "question": qa["question"],
                                 "answers": {"text": [a["text"] for a in qa["answers"]],
                                             "answer_start": [a["answer_start"]
                                                              for a in qa["answers"]]}})
        splits[split] = rows
    store_tfds(data_dir, "squad", "v1.1", "3.0.0", features, splits)


def c4_tfds(data_dir: str, n: int = 6) -> None:
    import tensorflow_datasets as tfds
    features = tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                           "url": tfds.features.Text(),
                                           "timestamp": tfds.features.Text()})
    splits = {split: [{"text": d["text"], "url": f"https://example.com/{i}",
                       "timestamp": "2019-04-25T12:57:54Z"}
                      for i, d in enumerate(demo_corpus.pile_documents(n, seed=k + 50))]
              for k, split in enumerate(("train", "validation"))}
    store_tfds(data_dir, "c4", "en", "3.0.1", features, splits)


def tf_int32():
    import tensorflow as tf
    return tf.int32


def files_in(directory) -> List[str]:
    return sorted(os.path.relpath(os.path.join(r, f), directory)
                  for r, _, fs in os.walk(directory) for f in fs)


@pytest.fixture
def pile(tmp_path, monkeypatch, tmp_path_factory):
    """A small Pile-style corpus (3 files of 60 documents) that the settings point at,
    read 4 documents a call (finer parse counts than the default); its directory. With
    `restored_data_settings`: a test module imports both."""
    from t5lite.data import sources
    directory = tmp_path / "pile"
    demo_corpus.write_pile(str(directory), train_files=3, docs_per_file=60, eval_docs=4)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), pile_dir=directory)
    monkeypatch.setattr(sources, "TEXTS_PER_CALL", 4)
    return directory


@pytest.fixture(autouse=True)
def restored_data_settings():
    """The data settings as they were, after each test of a module that imports this."""
    yield
    reset_data_settings()


@contextlib.contextmanager
def mnli_squad_mixture(tmp_path, monkeypatch, tmp_path_factory, name: str):
    """MultiNLI and SQuAD written small and pointed at, and a SeqIO mixture of the two
    registered as `name` while the block runs."""
    import seqio
    demo_corpus.write_multinli(str(tmp_path / "mnli"), train=40, dev=3)
    demo_corpus.write_squad(str(tmp_path / "squad"), train_articles=6, dev_articles=2)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory),
             mnli_dir=tmp_path / "mnli", squad_dir=tmp_path / "squad")
    if name in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.add(name, [("mnli", 1.0), ("squad_v1_1", 1.0)])
    try:
        yield name
    finally:
        seqio.MixtureRegistry.remove(name)
