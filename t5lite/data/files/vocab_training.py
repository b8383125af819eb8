"""Train a T5-style SentencePiece vocabulary from local text (no network, no TensorFlow).
The command `python -m t5lite.vocab` is this module's front end:

    python -m t5lite.vocab --input=/data/pile/train/00.jsonl.zst,/data/notes/*.txt \
        --vocab_size=32000 --output=/data/spm.model [--max_sentences=20000000]

Inputs: .jsonl / .jsonl.zst (the "text" field of each record, e.g. the Pile's files) and
.txt / .txt.zst (one sentence or paragraph a line); comma-separated, globs allowed. Texts
are split into lines (long lines into chunks of at most 4096 characters at spaces).

The model has T5's settings: a unigram model with pad = 0, EOS = 1, UNK = 2 and no BOS.
Use it as the tasks' vocabulary (gin macro VOCABULARY_PATH, or the environment variable
T5LITE_VOCABULARY_PATH); the tasks add 100 extra ids on top
(`seqio.SentencePieceVocabulary(path, extra_ids=100)`): 32000 pieces -> 32100 ids, which
the models pad to 32128.

For big corpora, --max_sentences stops reading after that many lines, and
--input_sentence_size makes SentencePiece train on a random sample of that many.
"""
from __future__ import annotations

import glob
import io
import itertools
import os
from typing import Callable, Iterable, Iterator, List, Optional, Sequence

from t5lite.data.files.readers import TEXT_SUFFIXES, iter_texts
from t5lite.errors import DataError, DataFormatError, DataNotFoundError

PAD_ID, EOS_ID, UNK_ID, BOS_ID = 0, 1, 2, -1
MAX_CHARS_PER_SENTENCE = 4096


def expand_inputs(inputs: Sequence[str]) -> List[str]:
    """Comma-separated paths and globs -> the sorted files they name (directories: their
    files with a known suffix)."""
    files: List[str] = []
    for item in inputs:
        for spec in filter(None, (s.strip() for s in item.split(","))):
            if os.path.isdir(spec):
                found = sorted(p for p in glob.glob(os.path.join(spec, "**", "*"),
                                                    recursive=True)
                               if os.path.isfile(p) and p.endswith(TEXT_SUFFIXES))
            else:
                found = sorted(p for p in glob.glob(spec) if os.path.isfile(p))
            if not found:
                raise DataNotFoundError(f"--input {spec!r} names no file; expected paths or "
                                        f"globs of {', '.join(TEXT_SUFFIXES)} files")
            for path in found:
                if not path.endswith(TEXT_SUFFIXES):
                    raise DataFormatError(f"{path}: unknown file type; expected one of "
                                          f"{', '.join(TEXT_SUFFIXES)}")
            files.extend(found)
    if not files:
        raise DataNotFoundError("no --input files given")
    return files


def _chunks(line: str, limit: int = MAX_CHARS_PER_SENTENCE) -> Iterator[str]:
    while len(line) > limit:
        cut = line.rfind(" ", 0, limit)
        cut = cut if cut > 0 else limit
        yield line[:cut]
        line = line[cut:].lstrip()
    if line:
        yield line


def iter_sentences(files: Iterable[str], max_sentences: Optional[int] = None,
                   text_field: str = "text") -> Iterator[str]:
    """Non-empty lines of the texts of `files`, at most `max_sentences` of them."""
    count = 0
    for path in files:
        for text in iter_texts(path, text_field):
            for line in text.splitlines():
                line = line.strip()
                if not line:
                    continue
                for piece in _chunks(line):
                    yield piece
                    count += 1
                    if max_sentences and count >= max_sentences:
                        return


def _reported(sentences: Iterator[str], on_read: Callable[[int, bool], None],
              every: int = 1000) -> Iterator[str]:
    count = 0
    for sentence in sentences:
        yield sentence
        count += 1
        if count % every == 0:
            on_read(count, False)
    on_read(count, True)


def train_vocabulary(files: Sequence[str], output: str, vocab_size: int = 32000,
                     **options) -> str:
    """Train a SentencePiece model with T5's special ids on `files` (`vocabulary_model`'s
    options); write it to `output` (the .model file only). Returns `output`."""
    model = vocabulary_model(files, vocab_size, **options)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "wb") as f:
        f.write(model)
    return output


def vocabulary_model(files: Sequence[str], vocab_size: int = 32000, *,
                     model_type: str = "unigram", character_coverage: float = 0.9995,
                     input_sentence_size: int = 0, max_sentences: Optional[int] = None,
                     text_field: str = "text", num_threads: Optional[int] = None,
                     seed: int = 0, hard_vocab_limit: bool = True,
                     on_read: Optional[Callable[[int, bool], None]] = None) -> bytes:
    """A SentencePiece model with T5's special ids trained on `files`: the bytes of its
    .model file. `on_read(sentences_read, done)`, when given, hears every 1,000 sentences
    read and once more (done=True) when the reading ends and training begins."""
    import sentencepiece as spm

    sentences = iter_sentences(files, max_sentences, text_field)
    first = next(sentences, None)
    if first is None:
        raise DataError(f"no text to train a vocabulary on in {', '.join(files)} (not one "
                        f"non-empty line or record); give files with text (.txt, .jsonl, "
                        f".jsonl.zst with a {text_field!r} field)")
    sentences = itertools.chain([first], sentences)
    if on_read is not None:
        sentences = _reported(sentences, on_read)
    buffer = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences, model_writer=buffer, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=BOS_ID,
            pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
            input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
            max_sentence_length=4 * MAX_CHARS_PER_SENTENCE,
            hard_vocab_limit=hard_vocab_limit,
            num_threads=num_threads or min(16, os.cpu_count() or 1),
            minloglevel=2)
    except RuntimeError as e:
        raise DataError(f"SentencePiece training failed: {str(e).strip().splitlines()[-1]} "
                        f"(inputs: {', '.join(files)})") from None
    return buffer.getvalue()
