"""Where the data edge finds its files: set by gin (a `DataSettings` that the commands
hand to `t5lite.data.tasks.configure`) or by environment variables, and read only when a
dataset is built.

    setting          gin macro          environment variable
    vocabulary_path  VOCABULARY_PATH    T5LITE_VOCABULARY_PATH
    pile_dir         PILE_DIR           T5LITE_PILE_DIR
    c4_dir           C4_DIR             T5LITE_C4_DIR   (allenai/c4's json.gz files)
    text_files       TEXT_FILES         T5LITE_TEXT_FILES   (globs; a list in gin, joined
    text_validation_files  TEXT_VALIDATION_FILES  T5LITE_TEXT_VALIDATION_FILES   by ':'
                                         in the environment, as PATH is)
    text_field       TEXT_FIELD         T5LITE_TEXT_FIELD   (default "text")
    mnli_dir         MNLI_DIR           T5LITE_MNLI_DIR
    squad_dir        SQUAD_DIR          T5LITE_SQUAD_DIR
    tfds_data_dir    TFDS_DATA_DIR      TFDS_DATA_DIR   (default ~/tensorflow_datasets)
    extra_ids        EXTRA_IDS          T5LITE_EXTRA_IDS (default 100: T5's sentinels;
                                         0 keeps a tokenizer as it is, e.g. LLaMA's)

    demo_dir         DEMO_DATA_DIR      (none: the generated demo corpus, written there
                                         on first use, supplies every path not given)

A configured value wins over the environment; `None` falls back to it. No TensorFlow here.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Sequence, Union

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
    "tfds_data_dir": ("TFDS_DATA_DIR", "TFDS_DATA_DIR"),
    "extra_ids": ("EXTRA_IDS", "T5LITE_EXTRA_IDS"),
}
DEFAULT_TFDS_DATA_DIR = os.path.join("~", "tensorflow_datasets")
DEFAULT_EXTRA_IDS = 100

_configured: Dict[str, Optional[str]] = {name: None for name in SETTINGS}


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The data macros of a run (VOCABULARY_PATH, PILE_DIR, C4_DIR, TEXT_FILES,
    TEXT_VALIDATION_FILES, TEXT_FIELD, MNLI_DIR, SQUAD_DIR, TFDS_DATA_DIR, EXTRA_IDS,
    DEMO_DATA_DIR); None: the environment variable (or the default). TEXT_FILES and
    TEXT_VALIDATION_FILES take a glob or a list of globs."""

    vocabulary_path: Optional[str] = None
    pile_dir: Optional[str] = None
    c4_dir: Optional[str] = None
    text_files: Optional[Union[str, Sequence[str]]] = None
    text_validation_files: Optional[Union[str, Sequence[str]]] = None
    text_field: Optional[str] = None
    mnli_dir: Optional[str] = None
    squad_dir: Optional[str] = None
    tfds_data_dir: Optional[str] = None
    extra_ids: Optional[int] = None
    demo_dir: Optional[str] = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            macro = SETTINGS[field.name][0] if field.name in SETTINGS else "DEMO_DATA_DIR"
            if value is None:
                continue
            if field.name == "extra_ids":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"{macro} must be a whole number >= 0 (or None), got "
                                      f"{value!r}")
            elif field.name in ("text_files", "text_validation_files") and \
                    isinstance(value, (list, tuple)):
                if not value or not all(isinstance(v, str) for v in value):
                    raise ConfigError(f"{macro} must be a glob or a list of globs (strings), "
                                      f"got {value!r}")
            elif not isinstance(value, str):
                what = "a glob or a list of globs" if "files" in field.name else "a string"
                raise ConfigError(f"{macro} must be {what} (or None), got {value!r}")


def set_values(**values: Optional[str]) -> None:
    """Set settings by name (None: use the environment variable)."""
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
        raise TypeError(f"unknown data setting(s) {unknown}; known: {sorted(SETTINGS)}")
    for name, value in values.items():
        if isinstance(value, (list, tuple)):  # globs: joined as PATH is
            value = os.pathsep.join(os.fspath(v) for v in value)
        _configured[name] = None if value in (None, "") else \
            str(value) if isinstance(value, int) else os.fspath(value)


def reset() -> None:
    """Forget configured values (the environment applies again)."""
    for name in _configured:
        _configured[name] = None


def get(name: str) -> Optional[str]:
    """The configured value of `name`, else its environment variable, else None
    (tfds_data_dir: else ~/tensorflow_datasets); `~` expanded."""
    value = _raw(name) or None
    if value is None and name == "tfds_data_dir":
        value = DEFAULT_TFDS_DATA_DIR
    return os.path.expanduser(value) if value else None


def get_globs(name: str) -> List[str]:
    """A glob-list setting (text_files, text_validation_files): its globs, `~` expanded."""
    return [os.path.expanduser(g) for g in (_raw(name) or "").split(os.pathsep) if g.strip()]


def _raw(name: str) -> Optional[str]:
    """The configured value of `name`, else its environment variable (as written)."""
    return _configured[name] or os.environ.get(SETTINGS[name][1])


def text_field() -> str:
    """The JSON field (or Parquet column) of the texts in TEXT_FILES: default "text"."""
    return get("text_field") or "text"


def extra_ids() -> int:
    """The vocabulary's number of extra ids (sentinels added on top of its pieces);
    ConfigError unless a whole number >= 0."""
    value = get("extra_ids")
    if value is None:
        return DEFAULT_EXTRA_IDS
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        from t5lite.errors import ConfigError
        macro, env = SETTINGS["extra_ids"]
        raise ConfigError(f"{macro} must be a whole number >= 0 (100: T5's sentinels; 0: the "
                          f"tokenizer as it is, e.g. LLaMA's), got {value!r} "
                          f"({source_of('extra_ids')}; environment variable {env})")
    return number


def snapshot() -> tuple:
    """The current value of every setting (to notice changes)."""
    return tuple(get(name) for name in SETTINGS)


def how_to_set(name: str) -> str:
    """'set the gin macro X or the environment variable Y' for error messages."""
    macro, env = SETTINGS[name]
    return (f"set the gin macro {macro} (--gin.{macro}=\\\"...\\\") or the environment "
            f"variable {env}")


def source_of(name: str) -> str:
    """Where the current value of `name` comes from, for error messages."""
    macro, env = SETTINGS[name]
    if _configured[name]:
        return f"from gin macro {macro}"
    if os.environ.get(env):
        return f"from environment variable {env}"
    return "the default"
