"""`python -m t5lite.info`: model facts from a gin config, without allocating the model
(wiring only; the library is `t5lite.runtime.footprint`).

    python -m t5lite.info --gin_file=configs/models/t5_1_1/large.gin \\
        [--gin.X=Y] [--inputs_length=512 --targets_length=128 | --seq_length=2048] \\
        [--optimizer=adafactor|adamw] [--json]

Prints the exact parameter count, training model FLOPs (matmuls, fwd + bwd) and the
bytes of float32 parameters plus optimizer state. With --json the table goes to stderr
and a JSON dict to stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from t5lite.config import command, flags, parsing
from t5lite.errors import ConfigError
from t5lite.runtime import footprint


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m t5lite.info", allow_abbrev=False,
                                     description=__doc__.split("\n")[0])
    flags.add_gin_flags(parser)
    parser.add_argument("--inputs_length", type=int, default=512, help="enc-dec inputs length")
    parser.add_argument("--targets_length", type=int, default=128, help="enc-dec targets length")
    parser.add_argument("--seq_length", type=int, default=2048, help="decoder-only length")
    parser.add_argument("--optimizer", choices=footprint.OPTIMIZERS, default="adafactor")
    parser.add_argument("--json", action="store_true", help="JSON on stdout, table on stderr")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = flags.parse_flags(_parser(), argv)
    if not args.gin_file:
        raise ConfigError("no --gin_file given (e.g. --gin_file=models/t5_1_1/base.gin)")
    # a run config (configs/*_pile_pretrain.gin) leaves its run macros REQUIRED; info
    # only needs the model, so they get placeholders (the user's bindings still win)
    parsing.parse_gin(args.gin_file, list(parsing.RUN_PLACEHOLDERS) + list(args.gin_bindings),
                      args.gin_search_paths)
    source = ", ".join(args.gin_file)
    model = parsing.resolve_macro("MODEL", origin=source)
    report = footprint.model_report(model, inputs_length=args.inputs_length,
                                    targets_length=args.targets_length,
                                    seq_length=args.seq_length, optimizer=args.optimizer)
    table = footprint.format_report(report, source)
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps(report))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    command.run_main(main)
