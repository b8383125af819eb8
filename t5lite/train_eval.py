"""Inference evaluation during training (T5X's `infer_eval`): every EVAL_PERIOD steps,
decode a task split with the current parameters and compute the task's metrics.

    hook = InferenceEvaluation.create(model, partitioner, task_name="mnli",
                                      split="validation_matched", batch_size=32,
                                      feature_lengths={"inputs": 512, "targets": 16},
                                      output_dir="/runs/mnli")
    metrics = hook(step, state.variables)   # {"mnli/accuracy": 83.1, ...}

Writes scalars `<task>/<metric>` to OUTPUT_DIR/inference_eval (TensorBoard) and the
predictions of each evaluation to OUTPUT_DIR/inference_eval/<task>_<step>_predictions.jsonl
(process 0). The split is read and tokenized once, when the hook is created, so a task
without metrics or a missing split fails before the first training step.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import jax

from t5lite import decoding, evaluation, gin_utils, metrics, partitioning
from t5lite.models.configs import T5Config

log = logging.getLogger("t5lite.train")
SUBDIR = "inference_eval"


def check_period(eval_period: Optional[int]) -> Optional[int]:
    """EVAL_PERIOD: a positive integer, or None / 0 for no evaluation during training."""
    if eval_period in (None, 0):
        return None
    if not isinstance(eval_period, int) or isinstance(eval_period, bool) or eval_period < 0:
        raise gin_utils.ConfigError(f"EVAL_PERIOD must be a positive integer (or None for "
                                    f"no evaluation during training), got {eval_period!r}")
    return eval_period


def due(step: int, period: Optional[int], last_step: int) -> bool:
    """Evaluate after this step? Every `period` steps and after the last one."""
    return bool(period) and (step % period == 0 or step == last_step)


@dataclasses.dataclass
class InferenceEvaluation:
    """A decoding session whose parameters are replaced by the training state's before
    each evaluation (its jitted predict function is compiled once)."""

    session: evaluation.Session
    evaluator: evaluation.TaskEvaluator
    output_dir: Path
    writer: Optional[metrics.MetricWriter]

    @classmethod
    def create(cls, model, partitioner: partitioning.Partitioner, *, task_name: str,
               split: str, batch_size: int, feature_lengths: Mapping[str, int],
               output_dir: str, num_examples: Optional[int] = None,
               decoder=None) -> "InferenceEvaluation":
        if not isinstance(model.config, T5Config):
            raise gin_utils.ConfigError(
                "EVAL_PERIOD: inference evaluation during training supports encoder-decoder "
                "(T5) models; set EVAL_PERIOD=None for decoder-only models")
        if not split:
            raise gin_utils.ConfigError("EVAL_PERIOD is set but EVAL_SPLIT is not: name the "
                                        "split to evaluate (e.g. 'validation')")
        partitioner.check_batch_size(batch_size)
        lengths = {"inputs": int(feature_lengths["inputs"]),
                   "targets": int(feature_lengths["targets"])}
        _, tasks = evaluation.import_data(configure=False)  # the trainer applied them
        evaluation.check_split(tasks, task_name, split, macro="EVAL_SPLIT")
        evaluator = evaluation.TaskEvaluator(task_name, split, lengths, num_examples)
        session = evaluation.Session(model, partitioner, None, int(batch_size), lengths,
                                     decoder or decoding.GreedyDecoder())
        out = Path(output_dir) / SUBDIR
        writer = None
        if jax.process_index() == 0:
            out.mkdir(parents=True, exist_ok=True)
            writer = metrics.MetricWriter(str(output_dir), 0, log_every=1, subdir=SUBDIR)
        log.info("inference evaluation: %s %s, %s examples", task_name, split,
                 evaluator.num_examples)
        return cls(session, evaluator, out, writer)

    def __call__(self, step: int, variables: Any) -> Dict[str, float]:
        """Decode the split with `variables`; returns {"<task>/<metric>": value}."""
        self.session.params, self.session.step = variables, step
        t0 = time.perf_counter()
        results = self.evaluator.evaluate(self.session)
        seconds = time.perf_counter() - t0
        self.session.params = None  # do not keep the state's buffers alive between evals
        flat = {f"{task}/{k}": v for task, r in results.items() for k, v in r.metrics.items()}
        if self.writer is not None:  # also logs "[inference_eval] step N: ..."
            self.writer.write_scalars(step, {**flat, "timing/seconds": seconds})
            self.writer.flush()
            for task, r in results.items():
                evaluation.write_predictions(
                    self.output_dir / f"{task}_{step}_predictions.jsonl", r)
        return flat

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
