"""Periods of the training loop (LOG_PERIOD, CHECKPOINT_PERIOD, EVAL_PERIOD, ...): their
validation and the one answer to "is this step due?"."""
from __future__ import annotations

from typing import Optional

from t5lite.errors import ConfigError


def check_positive(name: str, value, optional: bool = False) -> Optional[int]:
    """`value` if it is a positive integer (or None when `optional`); else ConfigError
    naming the setting `name`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = " (or None)" if optional else ""
        raise ConfigError(f"{name} must be a positive integer{allowed}, got {value!r}")
    return value


def due(step: int, period: Optional[int], last_step: Optional[int] = None) -> bool:
    """Whether `step` is one of every `period` steps, or is `last_step`; never when
    `period` is None (the thing is off)."""
    return bool(period) and (step % period == 0 or step == last_step)
