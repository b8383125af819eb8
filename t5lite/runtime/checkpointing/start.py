"""Where a training run's state comes from: decided once, by `checkpoints.restore_or_init`,
as a `Start` that the rest of the run reads (the start line, the LoRA base check, the
non-finite-loss message) instead of parsing a string back.

    Start("resume", step=40)                 MODEL_DIR's checkpoint 40: state and data
    Start("initial", path="/ckpt/base")      INITIAL_CHECKPOINT_PATH's parameters; step 0
    Start("t5x_continue", path=".../checkpoint_1000000")   a T5X run's parameters, step
                                             and Adafactor state (INITIAL_CHECKPOINT_STATE
                                             'train_state')
    Start("upcycle", path="/ckpt/dense")     a dense checkpoint's parameters as experts
    Start("init")                            a fresh initialization
"""
from __future__ import annotations

import dataclasses
from typing import Optional

KINDS = ("resume", "initial", "t5x_continue", "upcycle", "init")


@dataclasses.dataclass(frozen=True)
class Start:
    kind: str
    step: Optional[int] = None  # resume: the checkpoint's step
    path: Optional[str] = None  # initial / t5x_continue / upcycle: INITIAL_CHECKPOINT_PATH

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Start kind {self.kind!r} is not one of {KINDS}")
        if (self.kind == "resume") != (self.step is not None):
            raise ValueError(f"Start({self.kind!r}): a step is given with 'resume' only")
        if (self.kind in ("resume", "init")) != (self.path is None):
            raise ValueError(f"Start({self.kind!r}): a path is given with an initial "
                             f"checkpoint only")

    def __str__(self) -> str:
        """The start line's form: resume:40, initial:/ckpt/base, upcycle:/ckpt/dense,
        init (a T5X run continued reads initial:<path>, as it starts from that path)."""
        if self.kind == "resume":
            return f"resume:{self.step}"
        if self.kind == "init":
            return "init"
        return f"{'upcycle' if self.kind == 'upcycle' else 'initial'}:{self.path}"

    def in_words(self) -> str:
        """Where the state came from, in a sentence's words."""
        if self.kind == "resume":
            return f"MODEL_DIR's checkpoint {self.step}"
        if self.kind == "init":
            return "a fresh init"
        return {"initial": f"INITIAL_CHECKPOINT_PATH {self.path}",
                "t5x_continue": f"INITIAL_CHECKPOINT_PATH {self.path} (a T5X run continued)",
                "upcycle": f"INITIAL_CHECKPOINT_PATH {self.path} (upcycled)"}[self.kind]


FRESH = Start("init")
