"""The tasks' vocabulary: a SentencePiece model, or a Hugging Face tokenizer.json
(LLaMA-3's, Qwen's: `TokenizerJsonVocabulary`, over t5lite/data/files/tokenizer_file.py),
plus extra ids (T5's 100 sentinels).

Its path is the `vocabulary_path` setting (gin macro VOCABULARY_PATH, environment variable
T5LITE_VOCABULARY_PATH; see t5lite/data/settings.py). The public T5 vocabulary is
gs://t5-data/vocabs/cc_all.32000/sentencepiece.model (32000 pieces); where that bucket
cannot be reached, train one from local text:

    python -m t5lite.vocab --input=/data/pile/train/00.jsonl.zst --vocab_size=32000 \
        --output=/data/spm.model

With 100 extra ids the vocabulary has `pieces + 100` ids (32100 for 32000 pieces); the
extra ids count down from the top (`<extra_id_0>` = 32099), which is where T5's span
corruption takes its sentinels. Models pad the embedding to a multiple of 128 (32128).
The `extra_ids` setting (EXTRA_IDS, T5LITE_EXTRA_IDS) changes the count: 0 keeps a
tokenizer as it is, e.g. LLaMA's 32000 pieces for a LLaMA model's 32000-row embedding
(span corruption then has no sentinels and refuses).

Which settings: a task's vocabulary holds the `DataSettings` it was registered with and
resolves them on first use; `get_vocabulary(data=...)` takes them explicitly, and without
them uses those of the registered t5lite tasks (`settings_in_force`: SeqIO's registry is
where the settings of the last `t5lite.data.tasks.configure` live).

The kind is the file's: a path ending in `.json` is read as a tokenizer.json, anything
else as a SentencePiece model; a file that does not read as its kind is one line.

Special ids come from the vocabulary: its EOS ends every sequence (T5's models use 1,
LLaMA-2's 2, LLaMA-3's 128001); the model's `eos_id` must agree
(`model.check_vocabulary`). Padding is always id 0 (seqio's convention): a SentencePiece
model's piece 0 is never a token of text (LLaMA-2's: unk); a tokenizer.json's id 0 is
(`zero_is_token`): its stream writes it as a stand-in that the feature converter turns
back into 0 (`TokenizerJsonVocabulary`, t5lite/data/features.py).
"""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from t5lite.data.files import tokenizer_file
from t5lite.data.settings import DataSettings, ResolvedDataSettings, how_to_set
from t5lite.data.tf_env import import_tensorflow
from t5lite.errors import VocabularyError

tf = import_tensorflow()
import seqio  # noqa: E402  (after TensorFlow is set up)

PUBLIC_T5_VOCABULARY = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
TRAIN_HINT = ("train one from local text with `python -m t5lite.vocab --input=FILES "
              "--vocab_size=32000 --output=spm.model`")


# The registered task whose vocabulary holds the settings in force (t5lite.data.tasks
# registers it, and every t5lite task shares that vocabulary).
SETTINGS_TASK = "pile_span_corruption"


def settings_in_force() -> DataSettings:
    """The `DataSettings` the registered t5lite tasks hold (those of the last
    `t5lite.data.tasks.configure`), read from SeqIO's TaskRegistry; DataSettings() (the
    environment) when they are not registered."""
    if SETTINGS_TASK in seqio.TaskRegistry.names():
        vocab = seqio.TaskRegistry.get(SETTINGS_TASK).output_features["targets"].vocabulary
        if isinstance(vocab, DeferredVocabulary):
            return vocab.data
    return DataSettings()


def resolve_path(path: Optional[str] = None,
                 data: Optional[ResolvedDataSettings] = None) -> str:
    """`path`, else the `vocabulary_path` of `data` (default: the settings in force);
    VocabularyError if unset or missing."""
    if not path:
        data = data or settings_in_force().resolve()
    where = "given" if path else data.source_of("vocabulary_path")
    path = path or data.get("vocabulary_path")
    if not path:
        raise VocabularyError(
            f"no vocabulary: {how_to_set('vocabulary_path')} to a SentencePiece "
            f"model (the public T5 one is {PUBLIC_T5_VOCABULARY}) or a Hugging Face "
            f"tokenizer.json, or {TRAIN_HINT}")
    if not tf.io.gfile.exists(path):
        raise VocabularyError(f"vocabulary file {path!r} ({where}) does not exist; point "
                              f"VOCABULARY_PATH at a SentencePiece .model file or a "
                              f"tokenizer.json, or {TRAIN_HINT}")
    _check_model_file(path, where)
    return path


@functools.lru_cache(maxsize=8)
def _check_model_file(path: str, where: str) -> None:
    """VocabularyError unless `path` loads as its kind's vocabulary, with an EOS above 0."""
    if tokenizer_file.is_tokenizer_json(path):
        tokenizer_file.TokenizerFile(path).check(where)
        return
    import sentencepiece as spm
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            sp = spm.SentencePieceProcessor(model_proto=f.read())
    except Exception as e:  # noqa: BLE001 - DecodeError, RuntimeError, OSError: all "not a model"
        raise VocabularyError(f"vocabulary file {path!r} ({where}) is not a SentencePiece "
                              f"model (it does not load as one: {type(e).__name__}); point "
                              f"VOCABULARY_PATH at a .model file, or {TRAIN_HINT}") from None
    # every sequence ends in the model's EOS, and id 0 is padding
    if sp.eos_id() <= 0:
        raise VocabularyError(
            f"vocabulary file {path!r} ({where}) has "
            + ("no EOS piece" if sp.eos_id() < 0 else "EOS at id 0, the padding id")
            + f"; t5lite's tasks end every sequence with EOS: use a SentencePiece model "
            f"with an EOS above 0 (T5's: 1, LLaMA's: 2), or {TRAIN_HINT}")


class DeferredVocabulary(seqio.Vocabulary):
    """A vocabulary whose file, and so its kind, is looked up on first use.

    Tasks are registered when `t5lite.data.tasks` is imported, before any gin file has
    named a vocabulary; this one holds the `DataSettings` it is given (`data`) and reads
    their `vocabulary_path` and `extra_ids` (resolved then, environment fallbacks
    included) only when a dataset is tokenized (or its size is asked), and names the
    missing setting if there is none. Then it is the vocabulary `get_vocabulary` gives
    for them (a SentencePiece one, or a tokenizer.json's), and every call goes to it.
    """

    def __init__(self, path: Optional[str] = None, extra_ids: Optional[int] = None,
                 data: Optional[DataSettings] = None):
        super().__init__(extra_ids=0)
        self._path, self._extra = path, extra_ids
        self.data = data if data is not None else DataSettings()
        self._inner: Optional[seqio.Vocabulary] = None

    @property
    def resolved(self) -> seqio.Vocabulary:
        """The vocabulary the settings name (read on first use)."""
        if self._inner is None:
            self._inner = get_vocabulary(self._path, self._extra, self.data)
        return self._inner

    # every property and method of seqio.Vocabulary, the resolved one's
    bos_id = property(lambda self: self.resolved.bos_id)
    eos_id = property(lambda self: self.resolved.eos_id)
    unk_id = property(lambda self: self.resolved.unk_id)
    pad_id = property(lambda self: self.resolved.pad_id)
    extra_ids = property(lambda self: self.resolved.extra_ids)
    vocab_size = property(lambda self: self.resolved.vocab_size)
    _base_vocab_size = property(lambda self: self.resolved._base_vocab_size)
    zero_is_token = property(lambda self: getattr(self.resolved, "zero_is_token", False))
    zero_stand_in = property(lambda self: getattr(self.resolved, "zero_stand_in", None))

    def encode(self, s):
        return self.resolved.encode(s)

    def decode(self, ids):
        return self.resolved.decode(ids)

    def encode_tf(self, s):
        return self.resolved.encode_tf(s)

    def decode_tf(self, ids):
        return self.resolved.decode_tf(ids)

    def _encode(self, s):
        return self.resolved._encode(s)

    def _decode(self, ids):
        return self.resolved._decode(ids)

    def _encode_tf(self, s):
        return self.resolved._encode_tf(s)

    def _decode_tf(self, ids):
        return self.resolved._decode_tf(ids)

    @property
    def vocabulary_file(self) -> str:
        """The file it reads (a SentencePiece model or a tokenizer.json)."""
        inner = self.resolved
        return getattr(inner, "vocabulary_file", None) or inner.sentencepiece_model_file

    def __eq__(self, other) -> bool:
        if other is self:
            return True
        if isinstance(other, DeferredVocabulary):
            other = other.resolved
        return isinstance(other, seqio.Vocabulary) and self.resolved == other

    __hash__ = None  # as seqio's SentencePieceVocabulary: equal by content, unhashable

    def __str__(self) -> str:
        if self._inner is None:
            extra = "<the extra_ids setting>" if self._extra is None else self._extra
            return (f"DeferredVocabulary(file=<the vocabulary_path setting>, "
                    f"extra_ids={extra})")
        return str(self._inner)


class TokenizerJsonVocabulary(seqio.Vocabulary):
    """A tokenizer.json (`tokenizer_file.TokenizerFile`) as a SeqIO vocabulary, its
    `extra_ids` counted on top of its ids as SentencePiece's are.

    Its id 0 is a token of text (`zero_is_token`), where SeqIO and T5's preprocessors take
    0 for padding (T5's `split_tokens`, under `full_lm`, drops every 0). So in TensorFlow,
    where a task's preprocessors run, `encode_tf` writes id 0 as `zero_stand_in` (one past
    the last id); the feature converter turns it back into 0 (t5lite/data/features.py),
    and `decode` reads it as 0. `encode` (Python: the inference batches, which carry their
    own lengths) gives the ids as they are. The Rust tokenizer runs in a
    `tf.numpy_function` declared stateless (a pure function of its input), so the
    pipeline still saves its position (tf.data refuses to save stateful functions)."""

    zero_is_token = True

    def __init__(self, path: str, extra_ids: int = 0):
        super().__init__(extra_ids=extra_ids)
        self.vocabulary_file = str(path)
        self._file: Optional[tokenizer_file.TokenizerFile] = None

    @property
    def file(self) -> tokenizer_file.TokenizerFile:
        if self._file is None:
            self._file = tokenizer_file.TokenizerFile(self.vocabulary_file)
        return self._file

    bos_id = property(lambda self: self.file.bos_id)
    eos_id = property(lambda self: self.file.eos_id)
    unk_id = property(lambda self: None)  # byte-level: every text has its tokens
    _base_vocab_size = property(lambda self: self.file.size)
    zero_stand_in = property(lambda self: self.vocab_size)

    def _encode(self, s: str):
        return self.file.encode(s)

    def _decode(self, ids):
        stand_in = self.zero_stand_in
        return self.file.decode([0 if int(i) == stand_in else i for i in ids])

    def _encode_tf(self, s):
        stand_in = self.zero_stand_in

        def encode(text):  # bytes, or a 0-d array of them (eagerly)
            text = text.item() if isinstance(text, np.ndarray) else text
            ids = np.asarray(self.file.encode(text.decode("utf-8")), np.int32)
            return np.where(ids == 0, np.int32(stand_in), ids)

        if s.shape.rank != 0:
            raise ValueError(f"encode_tf takes one string (a scalar), got shape {s.shape}")
        ids = tf.numpy_function(encode, [s], tf.int32, stateful=False)
        ids.set_shape([None])
        return ids

    def _decode_tf(self, ids):
        def decode(rows):
            texts = [self.decode(r.tolist()).encode("utf-8")
                     for r in rows.reshape((-1, rows.shape[-1]))]
            return np.asarray(texts, object).reshape(rows.shape[:-1])

        out = tf.numpy_function(decode, [ids], tf.string, stateful=False)
        out.set_shape(ids.shape[:-1])
        return out

    def decode_tf(self, ids):
        """[..., length] ids -> [...] texts, each up to its first EOS (seqio's own puts the
        padding id, a token here, after EOS)."""
        return self._decode_tf(tf.convert_to_tensor(ids, tf.int32))

    def __eq__(self, other) -> bool:
        return (isinstance(other, TokenizerJsonVocabulary) and other.extra_ids == self.extra_ids
                and other.vocabulary_file == self.vocabulary_file)

    def __hash__(self) -> int:
        return hash((self.vocabulary_file, self.extra_ids))

    def __getstate__(self):  # the Rust tokenizer is read again where it is unpickled
        return {**self.__dict__, "_file": None}

    def __str__(self) -> str:
        return f"TokenizerJsonVocabulary(file={self.vocabulary_file}, extra_ids={self.extra_ids})"


@functools.lru_cache(maxsize=None)
def _cached(path: str, extra_ids: int) -> seqio.Vocabulary:
    if tokenizer_file.is_tokenizer_json(path):
        return TokenizerJsonVocabulary(path, extra_ids=extra_ids)
    return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def get_vocabulary(path: Optional[str] = None, extra_ids: Optional[int] = None,
                   data: Optional[DataSettings] = None) -> seqio.Vocabulary:
    """The vocabulary at `path` (default: the `vocabulary_path` setting; a SentencePiece
    model, or a tokenizer.json by its extension) with `extra_ids` sentinels (default:
    the `extra_ids` setting); the settings are `data`, default the settings in force
    (`settings_in_force`). The same object for the same arguments."""
    current = None
    if path is None or extra_ids is None:
        current = (data if data is not None else settings_in_force()).resolve()
    return _cached(resolve_path(path, current),
                   current.extra_ids() if extra_ids is None else int(extra_ids))
