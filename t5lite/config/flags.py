"""Command-line flags of the commands, T5X's habits::

    --gin_file=PATH            repeatable; searched in the config search path
    --gin.NAME=VALUE           rewritten to the binding `NAME = VALUE` (strings need quotes:
                               --gin.MODEL_DIR=\\"/tmp/run\\")
    --gin_bindings=BINDING     repeatable; a raw gin binding line
    --gin_search_paths=A,B     comma separated, repeatable; extra include/--gin_file roots

and, for the commands that run a model (train, eval, infer), the multi-process flags
(--multiprocess, --coordinator_address, --process_count, --process_index,
--peer_timeout_seconds, --join_timeout_seconds).

T5X's macro names that mean exactly a t5lite macro of another name are accepted in
`--gin.NAME=VALUE` under T5X's name too (`T5X_MACROS`; docs/migrating_from_t5x.md).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from t5lite.errors import ConfigError


def add_gin_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds --gin_file, --gin_bindings and --gin_search_paths (--gin.X=Y is rewritten)."""
    group = parser.add_argument_group("gin")
    group.add_argument("--gin_file", action="append", default=[], metavar="PATH",
                       help="gin config file (repeatable)")
    group.add_argument("--gin_bindings", action="append", default=[], metavar="BINDING",
                       help="gin binding, e.g. 'BATCH_SIZE = 8' (repeatable); "
                            "--gin.BATCH_SIZE=8 is the same")
    group.add_argument("--gin_search_paths", action="append", default=[], metavar="DIRS",
                       help="comma-separated directories searched for gin files")
    return parser


T5X_MACROS = {
    "EVAL_OUTPUT_DIR": "OUTPUT_DIR",              # t5x.eval
    "INFER_OUTPUT_DIR": "OUTPUT_DIR",             # t5x.infer
    "EVALUATOR_NUM_EXAMPLES": "EVAL_NUM_EXAMPLES",  # t5x.train's inference evaluation
}
"""T5X macro name -> the t5lite macro of the same meaning under another name."""


def rewrite_gin_args(argv: Sequence[str]) -> List[str]:
    """Rewrites each `--gin.NAME=VALUE` into `--gin_bindings=NAME = VALUE`, keeping order
    (a T5X name in `T5X_MACROS` becomes t5lite's)."""
    out = []
    for arg in argv:
        if arg.startswith("--gin."):
            name, eq, value = arg[len("--gin."):].partition("=")
            if not eq or not name:
                raise ConfigError(f"{arg!r} needs a value: write --gin.NAME=VALUE")
            out.append(f"--gin_bindings={T5X_MACROS.get(name, name)} = {value}")
        else:
            out.append(arg)
    return out


def parse_flags(parser: argparse.ArgumentParser,
                argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses argv (default sys.argv[1:]) with `parser`, which must have the gin flags."""
    argv = sys.argv[1:] if argv is None else argv
    return parser.parse_args(rewrite_gin_args(argv))


def summary(doc: str, lines: bool = False) -> str:
    """A command's description for --help: its docstring's first paragraph (the first
    line alone stops mid-sentence), on one line for argparse to wrap, or in its own
    `lines` for a parser that prints its description as written."""
    paragraph = doc.strip().split("\n\n")[0]
    if lines:
        return "\n".join(line.strip() for line in paragraph.splitlines())
    return " ".join(paragraph.split())


def entry_parser(description: str) -> argparse.ArgumentParser:
    """The flags of every entry point that runs a model (train, eval, infer): gin flags
    plus the multi-process ones."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    add_gin_flags(parser)
    parser.add_argument("--multiprocess", action="store_true",
                        help="call jax.distributed.initialize() (auto under SLURM)")
    parser.add_argument("--coordinator_address", default=None)
    parser.add_argument("--process_count", type=int, default=None)
    parser.add_argument("--process_index", type=int, default=None)
    parser.add_argument("--peer_timeout_seconds", type=int, default=30,
                        help="a process that sends jax.distributed no heartbeat for this "
                             "long is lost: every other process then ends (status 4) "
                             "with one line naming it")
    parser.add_argument("--join_timeout_seconds", type=int, default=300,
                        help="a process that has not joined the others at the coordinator "
                             "after this long ends (status 5) with one line")
    return parser
