"""Command-line flags -> Gin, with errors that fit on one line.

Flags understood (T5X habits)::

    --gin_file=PATH            repeatable; searched in the config search path
    --gin.NAME=VALUE           rewritten to the binding `NAME = VALUE` (strings need quotes:
                               --gin.MODEL_DIR=\\"/tmp/run\\")
    --gin_bindings=BINDING     repeatable; a raw gin binding line
    --gin_search_paths=A,B     comma separated, repeatable; extra include/--gin_file roots

The search path is: the current directory, then --gin_search_paths, then the shipped
`configs/` directory (and its parent), so `--gin_file=models/t5_1_1/base.gin`,
`--gin_file=configs/models/t5_1_1/base.gin` and `include 'models/t5_1_1/_base.gin'`
work from any directory.

Any problem with the configuration raises `ConfigError(one_line_message)`; entry points
wrap their main in `run_main`, which prints `error: ...` to stderr and exits with 2.
"""
from __future__ import annotations

import argparse
import copy
import logging
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import gin

import t5lite

EXIT_CONFIG_ERROR = 2
# Placeholders for the run-level REQUIRED macros, for tools that read a run config but do
# not train (info, bench); bound before the user's bindings, which still win.
RUN_PLACEHOLDERS = ("MODEL_DIR = '/tmp/t5lite_placeholder'", "TRAIN_STEPS = 0",
                    "MIXTURE_OR_TASK_NAME = 'synthetic'", "INITIAL_CHECKPOINT_PATH = None")


class ConfigError(Exception):
    """A user-facing configuration problem; the message is a single line."""


def _drop_gin_path_probes(record: logging.LogRecord) -> bool:
    # gin's package-resource file reader logs "Path not found" at ERROR for every search
    # path that does not hold an included file, even when a later one does.
    return not (record.msg == "Path not found: %s" and "gin" in record.pathname)


logging.getLogger().addFilter(_drop_gin_path_probes)


# --------------------------------------------------------------------------- flags

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


def rewrite_gin_args(argv: Sequence[str]) -> List[str]:
    """Rewrites each `--gin.NAME=VALUE` into `--gin_bindings=NAME = VALUE`, keeping order."""
    out = []
    for arg in argv:
        if arg.startswith("--gin."):
            name, eq, value = arg[len("--gin."):].partition("=")
            if not eq or not name:
                raise ConfigError(f"{arg!r} needs a value: write --gin.NAME=VALUE")
            out.append(f"--gin_bindings={name} = {value}")
        else:
            out.append(arg)
    return out


def parse_flags(parser: argparse.ArgumentParser,
                argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses argv (default sys.argv[1:]) with `parser`, which must have the gin flags."""
    argv = sys.argv[1:] if argv is None else argv
    return parser.parse_args(rewrite_gin_args(argv))


def parse_known_flags(argv: Optional[Sequence[str]] = None
                      ) -> Tuple[argparse.Namespace, List[str]]:
    """Parses only the gin flags; returns (namespace, the other arguments)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = add_gin_flags(argparse.ArgumentParser(add_help=False))
    return parser.parse_known_args(rewrite_gin_args(argv))


# --------------------------------------------------------------------------- search path

def shipped_configs_dir() -> Optional[Path]:
    """The `configs/` directory shipped with t5lite (installed package, then repo checkout)."""
    pkg = Path(t5lite.__file__).resolve().parent
    for candidate in (pkg / "configs", pkg.parent / "configs"):
        if (candidate / "models").is_dir():
            return candidate
    return None


def search_paths(extra: Iterable[str] = ()) -> List[str]:
    """Current directory, then `extra` (comma-separated entries allowed), then configs/."""
    paths = [os.getcwd()]
    for entry in extra:
        paths.extend(p for p in entry.split(",") if p)
    configs = shipped_configs_dir()
    if configs is not None:  # `models/x.gin` and `configs/models/x.gin` both resolve
        paths += [str(configs), str(configs.parent)]
    return paths


def _set_search_paths(paths: Sequence[str]) -> None:
    for path in paths:
        if path not in gin.config._LOCATION_PREFIXES:  # gin has no public "has path" query
            gin.add_config_file_search_path(path)


def _locate(path: str, paths: Sequence[str]) -> Optional[Path]:
    if os.path.isabs(path):
        return Path(path) if os.path.isfile(path) else None
    for root in ("", *paths):
        candidate = Path(root, path)
        if candidate.is_file():
            return candidate
    return None


# --------------------------------------------------------------------------- parsing

def parse_gin(gin_files: Sequence[str] = (), bindings: Sequence[str] = (),
              extra_search_paths: Iterable[str] = (), finalize: bool = True) -> None:
    """Clears gin, registers t5lite's configurables, parses files then bindings.

    Raises ConfigError naming the problem and the file (or flag) it came from.
    """
    import t5lite.configurables  # noqa: F401  (registration happens on import)

    paths = search_paths(extra_search_paths)
    gin.clear_config()
    _set_search_paths(paths)
    for gin_file in gin_files:
        if _locate(gin_file, paths) is None:
            raise ConfigError(f"gin file not found: {gin_file} (searched {', '.join(paths)})")
        with _translate_errors(origin=gin_file):
            gin.parse_config_file(str(_locate(gin_file, paths)))
    for binding in bindings:
        with _translate_errors(origin=f"binding {binding.strip()!r}"):
            gin.parse_config(binding)
    if finalize:
        try:
            gin.finalize()
        except (ValueError, RuntimeError) as e:
            raise ConfigError(_required_message(str(e), gin_files, paths)) from None


def configure(args: argparse.Namespace, finalize: bool = True) -> None:
    """`parse_gin` from a namespace built by a parser with `add_gin_flags`."""
    parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths, finalize=finalize)


def macro_is_bound(name: str) -> bool:
    """Whether the gin macro `name` has a value."""
    try:
        gin.query_parameter(f"{name}/gin.macro.value")
        return True
    except ValueError:
        return False


def resolve_macro(name: str, origin: str = "the gin config"):
    """Evaluates the gin macro `name` (e.g. MODEL), constructing what it references."""
    if not macro_is_bound(name):
        raise ConfigError(f"{name} is not set in {origin}: bind it in a gin file "
                          f"(e.g. {name} = @EncoderDecoderModel()) or with --gin.{name}=...")
    ref = gin.config.ConfigurableReference(f"{name}/gin.macro", True)
    with _translate_errors(origin=f"building {name} from {origin}", calling=True):
        return copy.deepcopy(ref)  # deep-copying an evaluating reference calls it (gin idiom)


# --------------------------------------------------------------------------- errors

_IN_FILE = re.compile(r'^\s*In file "(?P<file>[^"]+)", line (?P<line>\d+)\n\s*(?P<text>.*)$',
                      re.MULTILINE)
_IN_CALL = re.compile(r"In call to configurable '(?P<name>[^']+)'")


class _translate_errors:
    """Context manager turning gin's multi-line parse/call errors into ConfigError."""

    def __init__(self, origin: str, calling: bool = False):
        self.origin, self.calling = origin, calling

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or not isinstance(exc, (ValueError, TypeError, RuntimeError, OSError,
                                               SyntaxError)):
            return False
        raise ConfigError(_one_line(exc, self.origin, self.calling)) from None


def _one_line(exc: BaseException, origin: str, calling: bool) -> str:
    """`<problem> at <file>:<line>: <text>`, or `<problem> (<origin>)`, on one line."""
    if isinstance(exc, SyntaxError) and len(exc.args) > 1 and hasattr(exc.args[1], "line_num"):
        loc = exc.args[1]
        problem = "gin syntax error: " + _squash(exc.args[0])
        if "Failed to parse token" in problem:  # drop Python's ast noise before it
            problem = "gin syntax error: " + problem[problem.index("Failed to parse token"):]
            problem += " (strings need quotes, e.g. --gin.NAME=\"'value'\")"
        if loc.filename:
            return f"{problem} at {loc.filename}:{loc.line_num}: {loc.line_content.strip()}"
        return f"{problem} in {origin}"
    text = str(exc)
    problem = _squash(text.split("\n  In ")[0]) or type(exc).__name__
    if isinstance(exc, OSError) and problem.startswith("Unable to open file: "):
        problem = "gin file not found: " + problem[len("Unable to open file: "):]
        problem = problem.split(". Searched config paths")[0]
    problem = problem.rstrip(".")
    hits = list(_IN_FILE.finditer(text))
    if hits:  # the innermost location comes first (gin appends outer includes after it)
        first = hits[0]
        where = f"{first['file']}:{first['line']}: {first['text'].strip()}"
        if first["file"] != origin and not origin.startswith("binding"):
            where += f" (included from {origin})"
        return f"{problem} at {where}"
    call = _IN_CALL.search(text)
    if calling and call:
        return f"{problem} (in {call['name']}, {origin})"
    return f"{problem} ({origin})"


def _squash(text: str) -> str:
    return " ".join(str(text).split())


def _required_message(text: str, gin_files, paths) -> str:
    """Names the %gin.REQUIRED binding left unset, and the file that declared it."""
    m = re.match(r"(?P<key>\S+) set to `%gin.REQUIRED`", text)
    if not m:
        return _squash(text)
    key = m["key"]
    name = key[: -len("/macro.value")] if key.endswith("/macro.value") else key
    source = _find_required(name, gin_files, paths)
    where = f" (declared in {source})" if source else ""
    return (f"{name} is %gin.REQUIRED but was never set{where}: "
            f"set it with --gin.{name}=VALUE or in a gin file")


def _find_required(name: str, gin_files, paths) -> Optional[str]:
    """Walks the files and their includes for the line `NAME = %gin.REQUIRED`."""
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*=\s*%gin\.REQUIRED", re.MULTILINE)
    include = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.MULTILINE)
    todo, seen = list(gin_files), set()
    while todo:
        path = _locate(todo.pop(0), paths)
        if path is None or path in seen:
            continue
        seen.add(path)
        text = path.read_text()
        hit = pattern.search(text)
        if hit:
            return f"{path}:{text[:hit.start()].count(chr(10)) + 1}"
        todo.extend(include.findall(text))
    return None


# --------------------------------------------------------------------------- entry points

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
    return parser


def setup_logging() -> None:
    """t5lite's INFO lines on stderr; orbax, absl and the rest stay at WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)
    logging.getLogger("t5lite").setLevel(logging.INFO)


def run_main(main: Callable[[], Optional[int]]) -> None:
    """Runs `main()`; a ConfigError becomes `error: ...` on stderr and exit status 2."""
    try:
        status = main()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    sys.exit(status or 0)
