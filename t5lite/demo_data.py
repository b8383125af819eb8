"""`python -m t5lite.demo_data`: write the demo's made-up corpus, in the real file formats,
for trying the tasks without downloads (wiring only; the library is
`t5lite.data.files.demo_corpus`).

    python -m t5lite.demo_data --output_dir=/tmp/t5lite_demo [--vocab_size=400]

writes under the output directory (a new or empty one)

    pile/train/00.jsonl.zst, 01.jsonl.zst, pile/val.jsonl.zst, pile/test.jsonl.zst   the Pile
    multinli_1.0/multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl              MultiNLI
    glue/MNLI/{train,dev_matched,dev_mismatched}.tsv                                GLUE MNLI
    squad/{train,dev}-v1.1.json                                                     SQuAD v1.1
    lambada/lambada_test.jsonl                                                      Lambada
    boolq/dev.jsonl                                                                 BoolQ
    spm.model     a SentencePiece vocabulary trained on the Pile part

and prints the environment variables that point the tasks at them.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from t5lite.data import edge
from t5lite.errors import DataError
from t5lite.config import flags


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m t5lite.demo_data",
                                     description=flags.summary(__doc__, lines=True),
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[3:]))
    parser.add_argument("--output_dir", required=True, help="a new or empty directory")
    parser.add_argument("--vocab_size", type=int, default=400)
    parser.add_argument("--docs_per_file", type=int, default=200,
                        help="Pile documents in each of the two training files")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        where = edge.demo_corpus.ensure(args.output_dir, vocab_size=args.vocab_size,
                                   seed=args.seed, docs_per_file=args.docs_per_file)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"the demo corpus is in {args.output_dir}; point the tasks at it with:")
    for name, value in where.items():
        print(f"  export {edge.SETTINGS[name][1]}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
