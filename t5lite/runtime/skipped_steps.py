"""Steps to skip, not runs to lose: the setting, and the loop's part that watches it.

    SKIP_BAD_STEPS = True            # off by default: a non-finite loss stops the run
    MAX_GRAD_NORM_TO_APPLY = 100.0   # also skip a step whose gradient norm is above this
    MAX_SKIPPED_IN_A_ROW = 10        # stop after this many skipped steps in a row
    INJECT_BAD_GRADIENT = None       # fault injection: [3, 5] makes steps 3 and 5's
                                     # gradients NaN (skipped, or the NaN guard stops)

With SKIP_BAD_STEPS the optimizer leaves the state as it was on a step whose gradient is
not finite or above the bound (`optim/skipping.py`; the step count advances: its batch
is spent). Each skipped step is one warning line (`SkipWatch`, reading the step's
counters one step late, so the device is never waited for); TensorBoard counts them
(`skipped_steps`, with `skipped` and `skipped_in_a_row` beside the other metrics). The
run stops (TrainingError, exit 1, nothing of the bad steps saved: they changed nothing)
after MAX_SKIPPED_IN_A_ROW in a row. The counters are optimizer state: switching the
setting changes the checkpoint's tree, so a run resumes with the setting it saved with.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, Optional, Tuple

import jax

from t5lite.errors import ConfigError, TrainingError, check_bool, check_positive_int

log = logging.getLogger(__name__)

WATCHED = ("skipped", "skipped_in_a_row", "skipped_steps", "loss", "grad_norm")


@dataclasses.dataclass(frozen=True)
class SkipSettings:
    """SKIP_BAD_STEPS, MAX_GRAD_NORM_TO_APPLY (None: only non-finite gradients),
    MAX_SKIPPED_IN_A_ROW and the fault injection INJECT_BAD_GRADIENT (the steps, counted
    from 1, whose gradient is made NaN); defaults in configs/runs/pretrain.gin."""

    enabled: bool = False
    max_grad_norm: Optional[float] = None
    max_in_a_row: int = 10
    inject: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        check_bool("SKIP_BAD_STEPS", self.enabled)
        check_positive_int("MAX_SKIPPED_IN_A_ROW", self.max_in_a_row)
        bound = self.max_grad_norm
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                  or not math.isfinite(bound) or not bound > 0):
            raise ConfigError(f"MAX_GRAD_NORM_TO_APPLY must be a positive number or None, got "
                              f"{bound!r}")
        if self.inject is not None:
            steps = self.inject if isinstance(self.inject, (list, tuple)) else [self.inject]
            for step in steps:
                check_positive_int("INJECT_BAD_GRADIENT's steps", step)
            object.__setattr__(self, "inject", tuple(int(x) for x in steps))
        if bound is not None and not self.enabled:
            raise ConfigError("MAX_GRAD_NORM_TO_APPLY skips steps, and SKIP_BAD_STEPS is "
                              "False: set SKIP_BAD_STEPS=True (or MAX_GRAD_NORM_TO_APPLY=None)")


class SkipWatch:
    """The loop's part for skipped steps: each step's counters read one step late (the next
    step is queued by then), a warning line per skipped step, TrainingError after
    `max_in_a_row` in a row. `ckpt`: the checkpointer (the last good checkpoint named)."""

    def __init__(self, settings: SkipSettings, ckpt, model_dir):
        self.max_in_a_row, self.ckpt, self.model_dir = settings.max_in_a_row, ckpt, model_dir
        self.pending: Optional[tuple] = None

    def after_step(self, step: int, step_metrics: Mapping[str, Any], ends: bool) -> None:
        """Read the step before's counters (this step is queued); at the run's last step,
        this step's too."""
        before, self.pending = self.pending, (step, step_metrics)
        if before is not None:
            self._read(*before)
        if ends:
            self.pending = None
            self._read(step, step_metrics)

    def _read(self, step: int, step_metrics: Mapping[str, Any]) -> None:
        values = {k: float(v) for k, v in
                  jax.device_get({k: step_metrics[k] for k in WATCHED}).items()}
        if not values["skipped"]:
            return
        in_a_row = int(values["skipped_in_a_row"])
        what = (f"step {step} skipped (loss {values['loss']:.4g}, gradient norm "
                f"{values['grad_norm']:.4g}): parameters and optimizer state kept")
        if in_a_row < self.max_in_a_row:
            log.warning("%s; %d in a row, %d in all", what, in_a_row,
                        int(values["skipped_steps"]))
            return
        self.ckpt.wait()
        good = self.ckpt.latest_step()
        kept = (f"the last checkpoint is step {good} in {self.model_dir}" if good is not None
                else f"no checkpoint was saved in {self.model_dir}")
        raise TrainingError(
            f"{in_a_row} steps in a row skipped up to step {step} (MAX_SKIPPED_IN_A_ROW="
            f"{self.max_in_a_row}; the last: loss {values['loss']:.4g}, gradient norm "
            f"{values['grad_norm']:.4g}); stopped: {kept} (skipped steps change nothing "
            f"in it). Lower the learning rate, check the data, or raise "
            f"MAX_GRAD_NORM_TO_APPLY")
