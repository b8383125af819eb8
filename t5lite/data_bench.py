"""`python -m t5lite.data_bench`: the input pipeline alone, t5lite's span corruption
against plain SeqIO with T5's preprocessors, on the same documents and vocabulary, in one
run (wiring only; the library is `t5lite.data.throughput`).

    python -m t5lite.data_bench --vocabulary=/data/spm.model [--documents=4000] \
        [--batches=20 --batch_size=64] [--json_out=data_bench.json]

Writes its own Pile-style corpus (the demo text generator) into --work_dir; prints
examples per second and per busy-core second for span corruption at inputs 512 with
targets 114 and 128, packed and not.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Optional, Sequence

from t5lite.config import command
from t5lite.errors import ConfigError

LENGTHS = ({"inputs": 512, "targets": 114}, {"inputs": 512, "targets": 128})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m t5lite.data_bench", allow_abbrev=False,
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--vocabulary", required=True, help="a SentencePiece .model file")
    parser.add_argument("--documents", type=int, default=4000, help="documents to write")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per row")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--work_dir", help="where the corpus goes (default: a temp dir)")
    parser.add_argument("--json_out", help="write the rows here as JSON")
    parser.add_argument("--resume_rows", type=int, default=0,
                        help="instead: measure a resume of our iterator (state size, "
                             "restore time) with this many rows per process, inputs 512 / "
                             "targets 128, on Pile-length documents")
    parser.add_argument("--mean_chars", type=int, default=4200,
                        help="mean document length for --resume_rows (the Pile: about "
                             "825 GiB over 211 M documents, ~4,200 characters)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    command.setup_logging()
    args = _parser().parse_args(argv)
    for name in ("documents", "batches", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if not os.path.isfile(args.vocabulary):
        raise ConfigError(f"--vocabulary {args.vocabulary} is not a file (a SentencePiece "
                          f".model; `python -m t5lite.vocab` trains one)")
    from t5lite.data import edge, throughput
    from t5lite.data.settings import DataSettings
    work = args.work_dir or tempfile.mkdtemp(prefix="t5lite_data_bench_")
    if args.resume_rows:
        return _resume(args, work)
    corpus = throughput.write_corpus(work, args.documents)
    edge.import_tasks(DataSettings(pile_dir=corpus["pile_dir"],
                                   vocabulary_path=args.vocabulary))
    throughput.register_plain_task(corpus["text_file"], args.vocabulary)
    rows = throughput.compare(list(LENGTHS), batch_size=args.batch_size,
                              n_batches=args.batches)
    print(throughput.format_table(rows))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"documents": args.documents, "cpu_count": os.cpu_count(),
                       "rows": rows}, f, indent=1)
    return 0


def _resume(args, work: str) -> int:
    from t5lite.data import edge, throughput
    from t5lite.data.settings import DataSettings
    corpus = throughput.write_corpus(work, args.documents, mean_chars=args.mean_chars,
                                     compress=True)
    edge.import_tasks(DataSettings(pile_dir=corpus["pile_dir"],
                                   vocabulary_path=args.vocabulary))
    result = throughput.resume_cost({"inputs": 512, "targets": 128}, args.resume_rows,
                                    corpus["pile_file"], late=args.batches)
    result.update(documents=args.documents, mean_chars=args.mean_chars,
                  cpu_count=os.cpu_count())
    print(json.dumps(result, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    command.run_main(main)
