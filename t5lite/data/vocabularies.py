"""The tasks' vocabulary: a SentencePiece model plus extra ids (T5's 100 sentinels).

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

Special ids come from the SentencePiece model: its EOS ends every sequence (T5's models
use 1, LLaMA's 2); the model's `eos_id` must agree (`model.check_vocabulary`). Padding is
always id 0 (seqio's convention), whatever piece 0 is (LLaMA's: unk).
"""
from __future__ import annotations

import functools
from typing import Optional

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
        if isinstance(vocab, DeferredSentencePieceVocabulary):
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
            f"model (the public T5 one is {PUBLIC_T5_VOCABULARY}), or {TRAIN_HINT}")
    if not tf.io.gfile.exists(path):
        raise VocabularyError(f"vocabulary file {path!r} ({where}) does not exist; point "
                              f"VOCABULARY_PATH at a SentencePiece .model file, or "
                              f"{TRAIN_HINT}")
    _check_model_file(path, where)
    return path


@functools.lru_cache(maxsize=8)
def _check_model_file(path: str, where: str) -> None:
    """VocabularyError unless `path` loads as a SentencePiece model."""
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


class DeferredSentencePieceVocabulary(seqio.SentencePieceVocabulary):
    """A `seqio.SentencePieceVocabulary` whose file is looked up on first use.

    Tasks are registered when `t5lite.data.tasks` is imported, before any gin file has
    named a vocabulary; this one holds the `DataSettings` it is given (`data`) and reads
    their `vocabulary_path` and `extra_ids` (resolved then, environment fallbacks
    included) only when a dataset is tokenized (or its size is asked), and names the
    missing setting if there is none.
    """

    def __init__(self, path: Optional[str] = None, extra_ids: Optional[int] = None,
                 data: Optional[DataSettings] = None):
        super().__init__(path, extra_ids=extra_ids)
        self._extra_ids = extra_ids  # None: the setting, on first use
        self.data = data if data is not None else DataSettings()

    def _resolve(self) -> str:
        if self._extra_ids is None or self._sentencepiece_model_file is None:
            current = self.data.resolve()
            if self._extra_ids is None:
                self._extra_ids = current.extra_ids()
            if self._sentencepiece_model_file is None:
                self._sentencepiece_model_file = resolve_path(None, current)
        return self._sentencepiece_model_file

    @property
    def extra_ids(self) -> int:
        self._resolve()
        return self._extra_ids

    @property
    def sentencepiece_model_file(self) -> str:
        return self._resolve()

    def _model_context(self):
        self._resolve()
        return super()._model_context()

    def __str__(self) -> str:
        if self._sentencepiece_model_file is None:
            extra = "<the extra_ids setting>" if self._extra_ids is None else self._extra_ids
            return (f"DeferredSentencePieceVocabulary(file=<the vocabulary_path setting>, "
                    f"extra_ids={extra})")
        return super().__str__()


@functools.lru_cache(maxsize=None)
def _cached(path: str, extra_ids: int) -> seqio.SentencePieceVocabulary:
    return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def get_vocabulary(path: Optional[str] = None, extra_ids: Optional[int] = None,
                   data: Optional[DataSettings] = None) -> seqio.SentencePieceVocabulary:
    """The SentencePiece vocabulary at `path` (default: the `vocabulary_path` setting)
    with `extra_ids` sentinels (default: the `extra_ids` setting); the settings are
    `data`, default the settings in force (`settings_in_force`). The same object for the
    same arguments."""
    current = None
    if path is None or extra_ids is None:
        current = (data if data is not None else settings_in_force()).resolve()
    return _cached(resolve_path(path, current),
                   current.extra_ids() if extra_ids is None else int(extra_ids))
