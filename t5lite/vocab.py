"""Train a T5-style SentencePiece vocabulary from local text (no network, no TensorFlow).

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

import argparse
import glob
import io
import os
import sys
from typing import Iterable, Iterator, List, Optional, Sequence

from t5lite.data.errors import DataError, DataFormatError, DataNotFoundError
from t5lite.data.readers import TEXT_SUFFIXES, iter_texts

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


def train_vocabulary(files: Sequence[str], output: str, vocab_size: int = 32000, *,
                     model_type: str = "unigram", character_coverage: float = 0.9995,
                     input_sentence_size: int = 0, max_sentences: Optional[int] = None,
                     text_field: str = "text", num_threads: Optional[int] = None,
                     seed: int = 0, hard_vocab_limit: bool = True) -> str:
    """Train a SentencePiece model with T5's special ids on `files`; write it to `output`
    (the .model file only). Returns `output`."""
    import sentencepiece as spm

    sentences = iter_sentences(files, max_sentences, text_field)
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
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "wb") as f:
        f.write(buffer.getvalue())
    return output


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m t5lite.vocab", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--input", action="append", required=True,
                        help="files or globs (comma-separated; may repeat): "
                             + ", ".join(TEXT_SUFFIXES))
    parser.add_argument("--output", required=True, help="the .model file to write")
    parser.add_argument("--vocab_size", type=int, default=32000,
                        help="SentencePiece pieces (the 100 extra ids come on top)")
    parser.add_argument("--model_type", default="unigram",
                        choices=("unigram", "bpe", "char", "word"))
    parser.add_argument("--character_coverage", type=float, default=0.9995)
    parser.add_argument("--max_sentences", type=int, default=None,
                        help="stop reading after this many lines")
    parser.add_argument("--input_sentence_size", type=int, default=0,
                        help="train on a random sample of this many lines (0: all read)")
    parser.add_argument("--text_field", default="text", help="the jsonl field to read")
    parser.add_argument("--num_threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        files = expand_inputs(args.input)
        train_vocabulary(files, args.output, args.vocab_size, model_type=args.model_type,
                         character_coverage=args.character_coverage,
                         input_sentence_size=args.input_sentence_size,
                         max_sentences=args.max_sentences, text_field=args.text_field,
                         num_threads=args.num_threads, seed=args.seed)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {args.vocab_size} pieces (pad 0, EOS 1, UNK 2, no BOS); "
          f"with the tasks' 100 extra ids the vocabulary has {args.vocab_size + 100} ids. "
          f"Use it with --gin.VOCABULARY_PATH=\\\"{args.output}\\\" or "
          f"T5LITE_VOCABULARY_PATH={args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
