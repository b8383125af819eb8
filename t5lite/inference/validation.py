"""The validation loss during training (T5X's `train_eval`): every EVAL_PERIOD steps, the
teacher-forced loss of the first EVAL_STEPS batches of EVAL_BATCH_SIZE examples of the
task's EVAL_SPLIT, with the parameters of that step.

    validation = ValidationLoss(model, partitioner, task_name="pile", split="validation",
                                feature_lengths={"inputs": 0, "targets": 1024},
                                batch_size=32, steps=20)
    validation(variables)   # {"loss_per_token": 2.31, "perplexity": 10.07,
                            #  "accuracy": 0.41, "tokens": 651264.0, "examples": 640.0}

The batches are read once, when it is built, as `python -m t5lite.eval` with MODE
'perplexity' reads a split (`perplexity.split_batches`: the training task's preprocessing,
unshuffled, unpacked; every process reads them all), at most EVAL_STEPS x
EVAL_BATCH_SIZE examples, and kept in host memory (EVAL_STEPS x EVAL_BATCH_SIZE x the
feature lengths, in int32); each evaluation scores the same ones, summed on the host in
float64 in example order (`perplexity.measure`). So its numbers are what MODE
'perplexity' with EVAL_NUM_EXAMPLES = EVAL_STEPS x EVAL_BATCH_SIZE reports for that
step's checkpoint, for any process count. `loss_per_token` is the cross entropy per
target token (no z-loss, no label smoothing, no dropout), `accuracy` the share of those
tokens the argmax predicts (as the training metrics of the same names), `perplexity`
exp(loss_per_token).

Training is untouched: the training stream is never read here, and the parameters are
only read (the scoring function takes no state and donates nothing).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping

from t5lite.errors import ConfigError, DataNotFoundError
from t5lite.inference import perplexity
from t5lite.inference.session import Session
from t5lite.runtime.partitioning import Partitioner

log = logging.getLogger(__name__)


class ValidationLoss:
    """The first `steps` batches of `split`, read once; `__call__(variables)` scores them."""

    def __init__(self, model, partitioner: Partitioner, *, task_name: str, split: str,
                 feature_lengths: Mapping[str, int], batch_size: int, steps: int):
        lengths = {k: int(v) for k, v in feature_lengths.items() if v}
        self.task_name, self.split = task_name, split
        try:
            self.batches: List[Dict[str, Any]] = list(perplexity.split_batches(
                model, task_name, split, lengths, batch_size, num_examples=steps * batch_size))
        except DataNotFoundError as e:  # e.g. text files without TEXT_VALIDATION_FILES
            raise DataNotFoundError(f"{e}; the validation loss reads EVAL_SPLIT {split!r} "
                                    f"every EVAL_PERIOD steps (EVAL_STEPS=None turns it "
                                    f"off)") from None
        if not self.batches:
            raise ConfigError(f"EVAL_SPLIT {split!r} of task {task_name!r} holds no example: "
                              f"nothing to measure the validation loss on (set "
                              f"EVAL_STEPS=None to train without it)")
        self.examples = sum(len(b["decoder_loss_weights"]) for b in self.batches)
        self.session = Session(model, partitioner, None, batch_size, lengths)

    def __call__(self, variables: Any) -> Dict[str, float]:
        """{"loss_per_token", "perplexity", "accuracy", "tokens", "examples"} of the
        batches under `variables` (the training state's)."""
        self.session.params = variables
        try:
            measured = perplexity.measure(self.session, self.batches)
        finally:
            self.session.params = None  # the state's buffers are not kept between evals
        return {"loss_per_token": measured["loss"], "perplexity": measured["perplexity"],
                "accuracy": measured["accuracy"], "tokens": measured["tokens"],
                "examples": measured["examples"]}
