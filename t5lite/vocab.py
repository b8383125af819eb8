"""`python -m t5lite.vocab`: train a T5-style SentencePiece vocabulary from local text (no
network, no TensorFlow; wiring only, the library is `t5lite.data.files.vocab_training`).

    python -m t5lite.vocab --input=/data/pile/train/00.jsonl.zst,/data/notes/*.txt \
        --vocab_size=32000 --output=/data/spm.model [--max_sentences=20000000]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from t5lite.data import edge
from t5lite.errors import DataError, OutputWriteError
from t5lite.runtime import metrics
from t5lite.runtime.process import disk_space
from t5lite.config import flags


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m t5lite.vocab", description=flags.summary(__doc__, lines=True),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(edge.vocab_training.__doc__.splitlines()[2:]))
    parser.add_argument("--input", action="append", required=True,
                        help="files or globs (comma-separated; may repeat): "
                             + ", ".join(edge.vocab_training.TEXT_SUFFIXES))
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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    # On a terminal: a bar of the sentences read, then a line while SentencePiece trains
    # (it says nothing until done); nothing when stderr is not a terminal.
    bar = metrics.Progress(args.max_sentences, desc="reading sentences", process_index=0)

    def on_read(count: int, done: bool) -> None:
        bar.update(count)
        if done and bar.enabled:
            bar.close()
            print(f"training a {args.vocab_size}-piece {args.model_type} vocabulary on "
                  f"{count:,} sentences ...", file=sys.stderr, flush=True)
    try:
        files = edge.vocab_training.expand_inputs(args.input)
        model = edge.vocab_training.vocabulary_model(
            files, args.vocab_size, model_type=args.model_type,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size, max_sentences=args.max_sentences,
            text_field=args.text_field, num_threads=args.num_threads, seed=args.seed,
            on_read=on_read)
    except DataError as e:
        bar.close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    output = Path(args.output)
    kept = f"{output} is as it was" if output.exists() else f"{output} was not written"
    try:  # whole or not at all: a vocabulary already at that path stays as it was
        output.parent.mkdir(parents=True, exist_ok=True)
        disk_space.replace_file(output, model, what="the vocabulary",
                                needs=disk_space.human(len(model)))
    except OutputWriteError as e:
        print(f"error: {e}; {kept}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot write the vocabulary {output}: {e.strerror or e}; {kept}",
              file=sys.stderr)
        return 1
    print(f"wrote {output}: {args.vocab_size} pieces (pad 0, EOS 1, UNK 2, no BOS); "
          f"with the tasks' 100 extra ids the vocabulary has {args.vocab_size + 100} ids. "
          f"Use it with --gin.VOCABULARY_PATH=\\\"{output}\\\" or "
          f"T5LITE_VOCABULARY_PATH={output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
