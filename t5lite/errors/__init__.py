"""The error types every layer raises, and `check_positive_int` for the settings that must be
positive integers (a leaf: this module imports nothing of t5lite's).

Each carries a one-line message that names the problem and the fix. The commands turn
them into a single `error: ...` line and an exit status (t5lite/config/command.py):

    ConfigError                 the configuration (a gin binding, a macro, a flag)     exit 2
      DataError                 data or a task the user must point at                  exit 2
        DataNotFoundError       nothing where a task looks for its data
        DataFormatError         a file that is not in the format its task reads
        UnknownTaskError        a task or mixture name no registry knows
        VocabularyError         no vocabulary configured, or its file is missing
    PartitioningError           a mesh or batch that does not fit the devices          exit 1
    CheckpointMismatchError     a checkpoint whose tree or shapes differ from the model exit 1
    TrainingError               a run that must stop (a non-finite loss)               exit 1
    OutputWriteError            a checkpoint or other output that could not be written exit 1
      DiskFullError             a write that found no room on its disk
"""
from __future__ import annotations

import numbers
from typing import Dict, Mapping, Optional, Type


class ConfigError(Exception):
    """A user-facing configuration problem; the message is a single line."""


class DataError(ConfigError):
    """A data problem the user must fix; the message is one line naming what and where."""


class DataNotFoundError(DataError):
    """No data where a task looks for it (an unset or empty directory, a missing file)."""


class DataFormatError(DataError):
    """A file that is not in the format its task reads."""


class UnknownTaskError(DataError):
    """A task or mixture name that no registry knows."""


class VocabularyError(DataError):
    """No vocabulary configured, or its file is missing."""


class PartitioningError(ValueError):
    """A mesh or batch that does not fit the devices; the message is one line."""


class CheckpointMismatchError(ValueError):
    """A checkpoint's tree or shapes do not match the model; the message is one line."""


class CheckpointDamagedError(CheckpointMismatchError):
    """No checkpoint of a run restores (each is unreadable); the message is one line."""


class TrainingError(RuntimeError):
    """A run that must stop (NaN loss, bad data); the message is one line."""


class OutputWriteError(RuntimeError):
    """A run's output (a checkpoint, TensorBoard events, predictions) that could not be
    written; the message is one line naming what, where and why."""


class DiskFullError(OutputWriteError):
    """A write (a checkpoint, TensorBoard events, predictions) that found no room on its
    disk; the message is one line: what, where, how much it needs and how much is free."""


def check_positive_int(setting: str, value, optional: bool = False,
                       error: Type[Exception] = ConfigError) -> Optional[int]:
    """`value` as an int if it is a positive integer (numpy's too; or None when
    `optional`); else `error` (ConfigError: a setting such as BATCH_SIZE, TRAIN_STEPS,
    LOG_PERIOD; a library value type passes ValueError) naming it."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        allowed = " (or None)" if optional else ""
        raise error(f"{setting} must be a positive integer{allowed}, got {value!r}")
    return int(value)


FEATURES = ("inputs", "targets")


def check_feature_lengths(value, setting: str = "TASK_FEATURE_LENGTHS") -> Dict[str, int]:
    """`value` as {feature: length} when it is a dict of 'inputs' / 'targets' to positive
    integers (None: that feature unused); else ConfigError naming the setting and what is
    wrong with it."""
    example = "{'inputs': 512, 'targets': 128}"
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(f"{setting} must be a dict like {example}, got {value!r}")
    for name, length in value.items():
        if name not in FEATURES:
            raise ConfigError(f"{setting} has the key {name!r}: its keys are 'inputs' and "
                              f"'targets' (e.g. {example})")
        if length is not None:
            check_positive_int(f"{setting}[{name!r}]", length)
    return dict(value)


def check_bool(setting: str, value) -> bool:
    """`value` if it is True or False; else ConfigError naming the setting."""
    if not isinstance(value, bool):
        raise ConfigError(f"{setting} must be True or False, got {value!r}")
    return value


def check_number(setting: str, value, low: Optional[float] = None,
                 below: Optional[float] = None) -> float:
    """`value` if it is a number (not a bool) >= `low` and < `below` (each when given);
    else ConfigError naming the setting and the range."""
    import math
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or (low is not None and value < low) or \
            (below is not None and value >= below):
        bounds = " and ".join(b for b in (f">= {low:g}" if low is not None else "",
                                          f"< {below:g}" if below is not None else "") if b)
        raise ConfigError(f"{setting} must be a number{' ' + bounds if bounds else ''}, "
                          f"got {value!r}")
    return value


def check_text(setting: str, value, optional: bool = False) -> Optional[str]:
    """`value` if it is a string (or None when `optional`); else ConfigError naming the
    setting (a gin string needs quotes: --gin.NAME=\\"value\\")."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{setting} must be a string{' (or None)' if optional else ''}, "
                          f"got {value!r} (in gin, quoted: --gin.{setting}=\\\"...\\\")")
    return value
