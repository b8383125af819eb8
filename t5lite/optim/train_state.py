"""The training state: one pytree, saved whole in checkpoints.

    step       int32 []            optimizer steps taken
    params     {"params": ...}     float32 parameters (a flax variables dict)
    fp8        {} or {FP8_COLLECTION: ...}  FP8 scales / amax histories: not parameters
    opt_state  optax state of the trainable part of `params["params"]` (all of it; with
               LoRA the adapters only: `model.split_trainable`)
    rng        PRNG key data uint32 [2]: the dropout key; step keys are fold_in(rng, step)

`variables` rebuilds the dict the model wrappers take.
"""
from __future__ import annotations

from typing import Any, Dict

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Dict[str, Any]
    fp8: Dict[str, Any]
    opt_state: Any
    rng: jax.Array

    @property
    def variables(self) -> Dict[str, Any]:
        return {**self.params, **self.fp8}

    def as_dict(self) -> Dict[str, Any]:
        """Plain nested dict (the checkpoint layout)."""
        return {"step": self.step, "params": self.params, "fp8": self.fp8,
                "opt_state": self.opt_state, "rng": self.rng}
