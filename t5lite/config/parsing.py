"""Gin files and bindings -> a parsed gin config, with errors that fit on one line.

    parse_gin(["models/t5_1_1/base.gin", "runs/pretrain.gin"], ["BATCH_SIZE = 8"])
    model = resolve_macro("MODEL")

The search path is: the current directory, then --gin_search_paths, then the shipped
`configs/` directory (and its parent), so `--gin_file=models/t5_1_1/base.gin`,
`--gin_file=configs/models/t5_1_1/base.gin` and `include 'models/t5_1_1/_base.gin'`
work from any directory.

Any problem with the configuration raises `ConfigError(one_line_message)`; the commands
print it as one `error: ...` line (t5lite/config/command.py). The flags that carry files
and bindings are parsed in t5lite/config/flags.py.
"""
from __future__ import annotations

import copy
import difflib
import io
import logging
import os
import re
import tokenize
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

import gin

from t5lite.config import registry  # noqa: F401  (registers t5lite's configurables)
from t5lite.errors import ConfigError

# Placeholders for the run-level REQUIRED macros, for tools that read a run config but do
# not train (info, bench): `parse_gin(..., placeholders=RUN_PLACEHOLDERS)` binds each one
# only where the files leave its macro unset or REQUIRED (a recipe's own TRAIN_STEPS or
# task stay), and before the user's bindings, which still win.
RUN_PLACEHOLDERS = ("MODEL_DIR = '/tmp/t5lite_placeholder'", "TRAIN_STEPS = 0",
                    "MIXTURE_OR_TASK_NAME = 'synthetic'", "INITIAL_CHECKPOINT_PATH = None")

# Macros that every command reads itself (config/command.py), so no gin file need define
# them and `--gin.NAME=` accepts them with any config: unbound, each has its own fallback.
COMMAND_MACROS = ("COMPILATION_CACHE_DIR",)


def _drop_gin_path_probes(record: logging.LogRecord) -> bool:
    # gin's package-resource file reader logs "Path not found" at ERROR for every search
    # path that does not hold an included file, even when a later one does.
    return not (record.msg == "Path not found: %s" and "gin" in record.pathname)


logging.getLogger().addFilter(_drop_gin_path_probes)


# --------------------------------------------------------------------------- search path

def shipped_configs_dir() -> Optional[Path]:
    """The `configs/` directory shipped with t5lite (installed package, then repo checkout)."""
    pkg = Path(__file__).resolve().parents[1]  # the t5lite package
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
              extra_search_paths: Iterable[str] = (), finalize: bool = True,
              placeholders: Sequence[str] = ()) -> None:
    """Clears gin, parses files, then the `placeholders` ("NAME = value" macro bindings,
    each only where the files leave NAME unset or REQUIRED), then `bindings` (t5lite's
    configurables are registered when this module is imported).

    Raises ConfigError naming the problem and the file (or flag) it came from.
    """

    paths = search_paths(extra_search_paths)
    gin.clear_config()
    _set_search_paths(paths)
    for gin_file in gin_files:
        if _locate(gin_file, paths) is None:
            raise ConfigError(f"gin file not found: {gin_file} (searched {', '.join(paths)})")
        with _translate_errors(origin=gin_file):
            gin.parse_config_file(str(_locate(gin_file, paths)))
    for placeholder in placeholders:
        if not _macro_has_value(placeholder.split("=", 1)[0].strip()):
            gin.parse_config(placeholder)
    for binding in bindings:
        with _translate_errors(origin=f"binding {binding.strip()!r}"):
            gin.parse_config(binding)
    if finalize:
        try:
            gin.finalize()
        except (ValueError, RuntimeError) as e:
            raise ConfigError(_required_message(str(e), gin_files, paths)) from None


def macro_is_bound(name: str) -> bool:
    """Whether the gin macro `name` has a value."""
    try:
        gin.query_parameter(f"{name}/gin.macro.value")
        return True
    except ValueError:
        return False


def macro_value(name: str, unbound=None):
    """The value the gin macro `name` is bound to (not evaluated), or `unbound`."""
    if not macro_is_bound(name):
        return unbound
    return gin.query_parameter(f"{name}/gin.macro.value")


def _macro_has_value(name: str) -> bool:
    """Bound to something other than %gin.REQUIRED."""
    if not macro_is_bound(name):
        return False
    value = gin.query_parameter(f"{name}/gin.macro.value")
    return not (isinstance(value, gin.config.ConfigurableReference)
                and str(value) == "%gin.REQUIRED")


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


STRING_HINT = (" (a string value needs quotes that reach gin, e.g. "
               "--gin.MODEL_DIR=\\\"/ckpt/run\\\" or --gin.MODEL_DIR=\"'/ckpt/run'\")")


class _translate_errors:
    """Context manager turning gin's multi-line parse/call errors into ConfigError."""

    def __init__(self, origin: str, calling: bool = False):
        self.origin, self.calling = origin, calling

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if isinstance(exc, tokenize.TokenError):  # an unclosed bracket or quote
            where = _unclosed_statement(self.origin)
            if where is not None:
                raise ConfigError(f"gin syntax error: a bracket or quote opened here is "
                                  f"never closed at {self.origin}:{where[0]}: "
                                  f"{where[1]}") from None
            raise ConfigError(f"gin syntax error: {exc.args[0]} (an unclosed bracket or "
                              f"quote?) in {self.origin}") from None
        if exc is None or not isinstance(exc, (ValueError, TypeError, RuntimeError, OSError,
                                               SyntaxError)):
            return False
        raise ConfigError(_gin_error_line(exc, self.origin, self.calling)) from None


def _unclosed_statement(path: str):
    """(line number, text) of the line in gin file `path` where a bracket or a
    triple-quoted string opens that the file never closes; None if `path` is not a
    readable file or closes everything (the error then lies in a file it includes)."""
    try:
        text = Path(path).read_text()
    except (OSError, ValueError):
        return None
    lines, depth, start = text.splitlines(), 0, None
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.OP and token.string in "([{":
                start = token.start[0] if depth == 0 else start
                depth += 1
            elif token.type == tokenize.OP and token.string in ")]}":
                depth = max(depth - 1, 0)
    except tokenize.TokenError as e:
        if "string" in str(e.args[0]) and len(e.args) > 1:
            start, depth = e.args[1][0], 1
    if depth and start and start <= len(lines):
        return start, lines[start - 1].strip()
    return None


def _gin_error_line(exc: BaseException, origin: str, calling: bool) -> str:
    """`<problem> at <file>:<line>: <text>`, or `<problem> (<origin>)`, on one line."""
    if isinstance(exc, SyntaxError) and len(exc.args) > 1 and hasattr(exc.args[1], "line_num"):
        loc = exc.args[1]
        problem = "gin syntax error: " + _squash(exc.args[0])
        if "Failed to parse token" in problem:  # drop Python's ast noise before it
            problem = "gin syntax error: " + problem[problem.index("Failed to parse token"):]
            problem += STRING_HINT
        elif "Unable to parse value" in problem:
            problem = problem.rstrip(".") + STRING_HINT
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


def check_command_line_macros(gin_files: Sequence[str], bindings: Sequence[str],
                              extra_search_paths: Iterable[str] = ()) -> None:
    """A `--gin.NAME=` macro that no gin file defines, nothing references and no command
    reads (`COMMAND_MACROS`) is a typo (`--gin.BATCH_SIZ=8`): gin would accept it and
    silently train with the default."""
    names = []
    for binding in bindings:
        name = binding.partition("=")[0].strip()
        if name and name.isidentifier() and "." not in name:
            names.append(name)
    if not names:
        return
    parse_gin(gin_files, (), extra_search_paths, finalize=False)
    from_files = {scope for scope, selector in gin.config._CONFIG if selector == "gin.macro"}
    parse_gin(gin_files, bindings, extra_search_paths, finalize=False)
    referenced = {ref.scoped_selector.rpartition("/")[0]
                  for ref in gin.config.iterate_references(gin.config._CONFIG)}
    for name in names:
        if name not in from_files and name not in referenced and name not in COMMAND_MACROS:
            close = difflib.get_close_matches(name, sorted(from_files | set(COMMAND_MACROS)),
                                              n=1)
            hint = f"did you mean {close[0]}?" if close else "check the spelling"
            raise ConfigError(f"--gin.{name}: the gin files define no macro {name} and "
                              f"nothing uses it ({hint})")
