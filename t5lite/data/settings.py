"""Where the data edge finds its files: a `DataSettings` value (built by gin from the
macros below, or by hand) handed to `t5lite.data.tasks.configure`, with environment
variables for what it leaves None. Nothing here is module state: the value travels.

    setting          gin macro          environment variable
    vocabulary_path  VOCABULARY_PATH    T5LITE_VOCABULARY_PATH
    pile_dir         PILE_DIR           T5LITE_PILE_DIR
    c4_dir           C4_DIR             T5LITE_C4_DIR   (allenai/c4's json.gz files)
    text_files       TEXT_FILES         T5LITE_TEXT_FILES   (globs; a list in gin, joined
    text_validation_files  TEXT_VALIDATION_FILES  T5LITE_TEXT_VALIDATION_FILES   by ':'
                                         in the environment, as PATH is; TEXT_FILES
                                         also (glob, weight) pairs or '@<weights file>':
                                         a blend, t5lite/data/blend.py)
    text_field       TEXT_FIELD         T5LITE_TEXT_FIELD   (default "text")
    mnli_dir         MNLI_DIR           T5LITE_MNLI_DIR
    squad_dir        SQUAD_DIR          T5LITE_SQUAD_DIR
    lambada_dir      LAMBADA_DIR        T5LITE_LAMBADA_DIR  (zero-shot: lambada_test.jsonl
                                         or lambada_test_plain_text.txt)
    boolq_dir        BOOLQ_DIR          T5LITE_BOOLQ_DIR    (zero-shot: dev.jsonl or val.jsonl)
    tfds_data_dir    TFDS_DATA_DIR      TFDS_DATA_DIR   (default ~/tensorflow_datasets)
    extra_ids        EXTRA_IDS          T5LITE_EXTRA_IDS (default 100: T5's sentinels;
                                         0 keeps a tokenizer as it is, e.g. LLaMA's)

    demo_dir         DEMO_DATA_DIR      (none: the generated demo corpus, written there
                                         on first use, supplies every path not given)
    mixtures         MIXTURES           (none: {name: [(task, rate), ...]}, SeqIO mixtures
                                         registered under those names, T5X's rates from
                                         Gin; blended as t5lite/data/blend.py says)

A configured value wins over the environment; `None` falls back to it. The environment
is read when a dataset is built, not when the value is made: `DataSettings.resolve()`
reads it then and returns a `ResolvedDataSettings`, every setting's value and where it
came from at that moment (frozen and hashable: the key under which a task's source is
cached). The task, source and vocabulary builders are handed these values; none reads a
module-level setting.

The one process-wide place left is SeqIO's TaskRegistry: seqio looks tasks up by name
(`seqio.get_mixture_or_task("pile_span_corruption")`), so the registered t5lite tasks
hold the `DataSettings` of the last `t5lite.data.tasks.configure(data)`, which registers
them again with the new value (a task object taken from the registry before keeps the
settings it was built with). `t5lite.data.tasks.configured()` reads the value back from
there. No TensorFlow here.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from t5lite.data import blend
from t5lite.errors import ConfigError

# setting -> (gin macro, environment variable)
SETTINGS: Dict[str, tuple] = {
    "vocabulary_path": ("VOCABULARY_PATH", "T5LITE_VOCABULARY_PATH"),
    "pile_dir": ("PILE_DIR", "T5LITE_PILE_DIR"),
    "c4_dir": ("C4_DIR", "T5LITE_C4_DIR"),
    "text_files": ("TEXT_FILES", "T5LITE_TEXT_FILES"),
    "text_validation_files": ("TEXT_VALIDATION_FILES", "T5LITE_TEXT_VALIDATION_FILES"),
    "text_field": ("TEXT_FIELD", "T5LITE_TEXT_FIELD"),
    "mnli_dir": ("MNLI_DIR", "T5LITE_MNLI_DIR"),
    "squad_dir": ("SQUAD_DIR", "T5LITE_SQUAD_DIR"),
    "lambada_dir": ("LAMBADA_DIR", "T5LITE_LAMBADA_DIR"),
    "boolq_dir": ("BOOLQ_DIR", "T5LITE_BOOLQ_DIR"),
    "tfds_data_dir": ("TFDS_DATA_DIR", "TFDS_DATA_DIR"),
    "extra_ids": ("EXTRA_IDS", "T5LITE_EXTRA_IDS"),
}
DEFAULT_TFDS_DATA_DIR = os.path.join("~", "tensorflow_datasets")
DEFAULT_EXTRA_IDS = 100
_INDEX = {name: i for i, name in enumerate(SETTINGS)}
GIN, ENVIRONMENT, DEFAULT = "gin", "environment", "default"  # where a value came from


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The data macros of a run (VOCABULARY_PATH, PILE_DIR, C4_DIR, TEXT_FILES,
    TEXT_VALIDATION_FILES, TEXT_FIELD, MNLI_DIR, SQUAD_DIR, LAMBADA_DIR, BOOLQ_DIR,
    TFDS_DATA_DIR, EXTRA_IDS, DEMO_DATA_DIR); None: the environment variable (or the
    default). TEXT_FILES and TEXT_VALIDATION_FILES take a glob or a list of globs (kept as
    a tuple: the value is hashable); TEXT_FILES also a blend: (glob, weight) pairs, or
    '@<a Megatron data weights file>' (t5lite/data/blend.py)."""

    vocabulary_path: Optional[str] = None
    pile_dir: Optional[str] = None
    c4_dir: Optional[str] = None
    text_files: Optional[Union[str, Sequence[str]]] = None
    text_validation_files: Optional[Union[str, Sequence[str]]] = None
    text_field: Optional[str] = None
    mnli_dir: Optional[str] = None
    squad_dir: Optional[str] = None
    lambada_dir: Optional[str] = None
    boolq_dir: Optional[str] = None
    tfds_data_dir: Optional[str] = None
    extra_ids: Optional[int] = None
    demo_dir: Optional[str] = None
    mixtures: Optional[Mapping[str, Sequence[Tuple[str, float]]]] = None

    def __post_init__(self):
        if self.mixtures is not None:
            object.__setattr__(self, "mixtures", _mixtures(self.mixtures))
        for field in dataclasses.fields(self):
            if field.name == "mixtures":
                continue
            value = getattr(self, field.name)
            macro = SETTINGS[field.name][0] if field.name in SETTINGS else "DEMO_DATA_DIR"
            if value is None:
                continue
            if field.name == "extra_ids":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"{macro} must be a whole number >= 0 (or None), got "
                                      f"{value!r}")
            elif field.name == "text_files" and isinstance(value, (list, tuple)) and \
                    any(isinstance(v, (list, tuple)) for v in value):
                pairs = blend.weighted_globs(value, macro)  # a blend: checked here
                object.__setattr__(self, field.name, tuple((g, float(w)) for g, w in pairs))
            elif field.name in ("text_files", "text_validation_files") and \
                    isinstance(value, (list, tuple)):
                if not value or not all(isinstance(v, str) for v in value):
                    raise ConfigError(f"{macro} must be a glob or a list of globs (strings), "
                                      f"got {value!r}")
                object.__setattr__(self, field.name, tuple(value))
            elif not isinstance(value, str):
                what = "a glob or a list of globs" if "files" in field.name else "a string"
                raise ConfigError(f"{macro} must be {what} (or None), got {value!r}")

    def resolve(self) -> "ResolvedDataSettings":
        """Every setting as it stands now: this value where it gives one, else its
        environment variable (read now), else unset."""
        values, origins = [], []
        for name, (_, env) in SETTINGS.items():
            value = _as_text(getattr(self, name))
            if value:
                values.append(value)
                origins.append(GIN)
            elif os.environ.get(env):
                values.append(os.environ[env])
                origins.append(ENVIRONMENT)
            else:
                values.append(None)
                origins.append(DEFAULT)
        return ResolvedDataSettings(tuple(values), tuple(origins))


def _mixtures(value) -> Tuple[Tuple[str, Tuple[Tuple[str, float], ...]], ...]:
    """MIXTURES checked and made hashable: ((name, ((task, rate), ...)), ...)."""
    example = "{'pile_and_c4': [('pile_span_corruption', 0.7), ('c4_span_corruption', 0.3)]}"
    if isinstance(value, tuple):  # already checked
        return value
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"MIXTURES must map a mixture's name to its (task, rate) pairs, "
                          f"e.g. {example}; got {value!r}")
    out = []
    for name, pairs in value.items():
        if not isinstance(pairs, (list, tuple)) or not pairs or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str)
                for p in pairs):
            raise ConfigError(f"MIXTURES[{name!r}] must be a list of (task, rate) pairs, "
                              f"e.g. {example}; got {pairs!r}")
        blend.Schedule([t for t, _ in pairs], [r for _, r in pairs], f"MIXTURES[{name!r}]")
        out.append((name, tuple((t, float(r)) for t, r in pairs)))
    return tuple(out)


def _as_text(value) -> Optional[str]:
    """A configured value as the environment would write it (globs joined as PATH is; a
    blend's (glob, weight) pairs as JSON)."""
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], tuple):
        return json.dumps([list(pair) for pair in value])
    if isinstance(value, (list, tuple)):
        value = os.pathsep.join(os.fspath(v) for v in value)
    if value is None or value == "":
        return None
    return str(value) if isinstance(value, int) else os.fspath(value)


@dataclasses.dataclass(frozen=True)
class ResolvedDataSettings:
    """Every setting's value as written (None: unset) and where it came from (GIN,
    ENVIRONMENT or DEFAULT), in SETTINGS' order, read at one moment by
    `DataSettings.resolve()`: what a task's source and vocabulary are built from."""

    values: Tuple[Optional[str], ...]
    origins: Tuple[str, ...]

    def raw(self, name: str) -> Optional[str]:
        """The value of `name` as written (no default, `~` not expanded)."""
        return self.values[_INDEX[name]]

    def get(self, name: str) -> Optional[str]:
        """The value of `name`, else None (tfds_data_dir: else ~/tensorflow_datasets);
        `~` expanded."""
        value = self.raw(name)
        if value is None and name == "tfds_data_dir":
            value = DEFAULT_TFDS_DATA_DIR
        return os.path.expanduser(value) if value else None

    def get_globs(self, name: str) -> List[str]:
        """A glob-list setting (text_files, text_validation_files): its globs, `~`
        expanded (a blend's: every source's)."""
        pairs = self.get_blend(name)
        if pairs is not None:
            return [g for g, _ in pairs]
        return [os.path.expanduser(g) for g in (self.raw(name) or "").split(os.pathsep)
                if g.strip()]

    def get_blend(self, name: str) -> Optional[List[Tuple[str, float]]]:
        """[(glob, weight)] of a glob-list setting that weighs its globs ((glob, weight)
        pairs, written as JSON; '@<weights file>': read now); None for plain globs."""
        raw = (self.raw(name) or "").strip()
        what = f"{SETTINGS[name][0]}, {self.source_of(name)}"
        if raw.startswith("["):
            try:
                value = json.loads(raw)
            except ValueError:
                raise ConfigError(f"{what}: {raw!r} is neither globs nor a JSON list of "
                                  f"(glob, weight) pairs") from None
            return blend.weighted_globs([tuple(v) if isinstance(v, list) else v
                                         for v in value], what)
        if raw.startswith("@"):
            return blend.weighted_globs(raw, what)
        return None

    def text_field(self) -> str:
        """The JSON field (or Parquet column) of the texts in TEXT_FILES: default
        "text"."""
        return self.get("text_field") or "text"

    def extra_ids(self) -> int:
        """The vocabulary's number of extra ids (sentinels added on top of its pieces);
        ConfigError unless a whole number >= 0."""
        value = self.get("extra_ids")
        if value is None:
            return DEFAULT_EXTRA_IDS
        try:
            number = int(value)
        except ValueError:
            number = -1
        if number < 0:
            macro, env = SETTINGS["extra_ids"]
            raise ConfigError(f"{macro} must be a whole number >= 0 (100: T5's sentinels; 0: "
                              f"the tokenizer as it is, e.g. LLaMA's), got {value!r} "
                              f"({self.source_of('extra_ids')}; environment variable {env})")
        return number

    def source_of(self, name: str) -> str:
        """Where the value of `name` comes from, for error messages."""
        macro, env = SETTINGS[name]
        origin = self.origins[_INDEX[name]]
        if origin == GIN:
            return f"from gin macro {macro}"
        if origin == ENVIRONMENT:
            return f"from environment variable {env}"
        return "the default"


def how_to_set(name: str) -> str:
    """'set the gin macro X or the environment variable Y' for error messages."""
    macro, env = SETTINGS[name]
    return (f"set the gin macro {macro} (--gin.{macro}=\\\"...\\\") or the environment "
            f"variable {env}")
