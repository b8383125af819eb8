"""What every process of a run must agree on, decided once: process 0 checks, and every
process gets its outcome in one broadcast (`process_0_decides`; the run lock and the
checkpoint directory's checks use it)."""
from __future__ import annotations

from typing import Callable

import jax
import numpy as np


def process_0_decides(check: Callable[[], None], refused: Callable[[], Exception]) -> None:
    """Run `check` on process 0 only and give every process its outcome: process 0
    raises what `check` raised, the others `refused()` (for one process, just `check`).
    Call it on every process: they meet in one broadcast."""
    error = None
    if jax.process_index() == 0:
        try:
            check()
        except Exception as e:  # noqa: BLE001 - every outcome is shared, then raised
            error = e
    fine = error is None
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        fine = bool(multihost_utils.broadcast_one_to_all(np.int32(fine)))
    if error is not None:
        raise error
    if not fine:
        raise refused()
