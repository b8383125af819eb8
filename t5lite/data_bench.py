"""`python -m t5lite.data_bench`: the input pipeline alone, t5lite's span corruption
against plain SeqIO with T5's preprocessors, on the same documents and vocabulary, in one
run (wiring only; the library is `t5lite.tools.data_throughput`).

    python -m t5lite.data_bench --vocabulary=/data/spm.model [--documents=4000] \
        [--batches=20 --batch_size=64] [--json_out=data_bench.json]

Writes its own Pile-style corpus (the demo text generator) into --work_dir; prints
examples per second and per busy-core second for span corruption at inputs 512 with
targets 114 and 128, packed and not. Instead: --formats, each text-file format against
the Pile reader (t5lite.tools.format_throughput); --resume_rows, the cost of a resume.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Optional, Sequence

from t5lite.config import command, flags
from t5lite.errors import ConfigError

LENGTHS = ({"inputs": 512, "targets": 114}, {"inputs": 512, "targets": 128})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m t5lite.data_bench", allow_abbrev=False,
                                     description=flags.summary(__doc__))
    parser.add_argument("--vocabulary", required=True, help="a SentencePiece .model file")
    parser.add_argument("--documents", type=int, default=4000, help="documents to write")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per row")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--work_dir", help="where the corpus goes (default: a temp dir)")
    parser.add_argument("--json_out", help="write the rows here as JSON")
    parser.add_argument("--resume_rows", type=int, default=0,
                        help="instead: a resume of our iterator (state size, restore time) "
                             "with this many rows per process, 512 / 128, long documents")
    parser.add_argument("--mean_chars", type=int, default=4200,
                        help="mean document length for --resume_rows, --formats (the Pile: about "
                             "825 GiB over 211 M documents, ~4,200 characters)")
    parser.add_argument("--formats", action="store_true", help="instead: text_span_"
                        "corruption on each file format against the Pile reader, 512 / 114")
    parser.add_argument("--rounds", type=int, default=3, help="--formats: rounds a row")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    command.setup_logging()
    args = _parser().parse_args(argv)
    for name in ("documents", "batches", "batch_size", "rounds"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if not os.path.isfile(args.vocabulary):
        raise ConfigError(f"--vocabulary {args.vocabulary} is not a file (a SentencePiece "
                          f".model; `python -m t5lite.vocab` trains one)")
    work = args.work_dir or tempfile.mkdtemp(prefix="t5lite_data_bench_")
    mode = _resume if args.resume_rows else _formats if args.formats else _compare
    table, result = mode(args, work)
    print(table)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"documents": args.documents, "cpu_count": os.cpu_count(), **result},
                      f, indent=1)
    return 0


def _compare(args, work: str):
    from t5lite.tools import data_throughput as throughput
    corpus = throughput.write_corpus(work, args.documents)
    throughput.use_corpus(corpus, args.vocabulary)
    throughput.register_plain_task(corpus["text_file"], args.vocabulary)
    rows = throughput.compare(list(LENGTHS), batch_size=args.batch_size,
                              n_batches=args.batches)
    return throughput.format_table(rows), {"rows": rows}


def _formats(args, work: str):
    from t5lite.tools import format_throughput as formats
    files = formats.write_formats(work, args.documents, mean_chars=args.mean_chars)
    return formats.report(files, args.vocabulary, LENGTHS[0], batch_size=args.batch_size,
                          n_batches=args.batches, rounds=args.rounds)


def _resume(args, work: str):
    from t5lite.tools import data_throughput as throughput
    corpus = throughput.write_corpus(work, args.documents, mean_chars=args.mean_chars,
                                     compress=True)
    throughput.use_corpus(corpus, args.vocabulary)
    result = throughput.resume_cost({"inputs": 512, "targets": 128}, args.resume_rows,
                                    corpus["pile_file"], late=args.batches)
    result["mean_chars"] = args.mean_chars
    return json.dumps(result, indent=1), result


if __name__ == "__main__":
    command.run_main(main)
