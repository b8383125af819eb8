"""Errors of the data edge, importable without TensorFlow.

Every one is a `gin_utils.ConfigError`: the user fixes it by pointing a setting at the
right data (or the right task name), and `python -m t5lite.train` prints it as one line.
"""
from __future__ import annotations

from t5lite.gin_utils import ConfigError


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
