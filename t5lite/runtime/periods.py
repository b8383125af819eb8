"""Periods of the training loop (LOG_PERIOD, CHECKPOINT_PERIOD, EVAL_PERIOD, ...): the one
answer to "is this step due?". (Their values are checked where they are taken, with
`errors.check_positive_int`.)"""
from __future__ import annotations

from typing import Optional


def due(step: int, period: Optional[int], last_step: Optional[int] = None) -> bool:
    """Whether `step` is one of every `period` steps, or is `last_step`; never when
    `period` is None (the thing is off)."""
    return bool(period) and (step % period == 0 or step == last_step)
