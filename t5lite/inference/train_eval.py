"""Inference evaluation during training (T5X's `infer_eval`): every EVAL_PERIOD steps,
decode a task split with the current parameters and compute the task's metrics. The
training loop (t5lite.runtime.loop) builds it through `train.inference_evaluator`:

    hook = InferenceEvaluation(model, partitioner, task_name="mnli",
                               feature_lengths={"inputs": 512, "targets": 16},
                               batch_size=32, output_dir="/runs/mnli",
                               settings=InferenceEvalSettings(period=1000,
                                                              split="validation_matched"))
    metrics = hook(step, state.variables)   # {"mnli/accuracy": 83.1, ...}

Writes scalars `<task>/<metric>` to OUTPUT_DIR/inference_eval (TensorBoard) and the
predictions of each evaluation to OUTPUT_DIR/inference_eval/<task>_<step>_predictions.jsonl
(process 0). The split is read and tokenized once, when the hook is built, so a task
without metrics or a missing split fails before the first training step.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import jax

from t5lite.data import edge
from t5lite.errors import ConfigError, check_positive_int, check_text
from t5lite.inference.session import Session
from t5lite.inference.task_eval import TaskEvaluator, write_predictions
from t5lite.models import decoding
from t5lite.runtime import metrics
from t5lite.runtime.partitioning import Partitioner

log = logging.getLogger(__name__)
SUBDIR = "inference_eval"


@dataclasses.dataclass(frozen=True)
class InferenceEvalSettings:
    """Evaluation during training (T5X's infer_eval): EVAL_PERIOD (None or 0: never),
    EVAL_SPLIT, EVAL_BATCH_SIZE (None: BATCH_SIZE) and EVAL_NUM_EXAMPLES (None: all). gin
    gives it to `train.inference_eval`; the training loop reads only `period` (it may not
    import inference) and passes it on to the evaluator it builds."""

    split: str
    period: Optional[int] = None
    batch_size: Optional[int] = None
    num_examples: Optional[int] = None

    def __post_init__(self):
        check_text("EVAL_SPLIT", self.split)
        check_positive_int("EVAL_BATCH_SIZE", self.batch_size, optional=True)
        check_positive_int("EVAL_NUM_EXAMPLES", self.num_examples, optional=True)
        if self.period == 0:
            object.__setattr__(self, "period", None)
        if self.period is not None and (isinstance(self.period, bool) or
                                        not isinstance(self.period, int) or self.period < 0):
            raise ConfigError(f"EVAL_PERIOD must be a positive integer (or None for no "
                              f"evaluation during training), got {self.period!r}")


class InferenceEvaluation:
    """A decoding session whose parameters are replaced by the training state's before
    each evaluation (its jitted predict function is compiled once). `batch_size` is the
    training batch, used when EVAL_BATCH_SIZE is None. The data settings of the training
    run are already in force (its iterator applied them)."""

    def __init__(self, model, partitioner: Partitioner, *, task_name: str,
                 feature_lengths: Mapping[str, int], batch_size: int, output_dir: str,
                 settings: InferenceEvalSettings, decoder=None):
        if not settings.split:
            raise ConfigError("EVAL_PERIOD is set but EVAL_SPLIT is not: name the split to "
                              "evaluate (e.g. 'validation')")
        batch_size = int(settings.batch_size or batch_size)
        partitioner.data_layout(batch_size)  # it divides over the data shards
        lengths = {"inputs": int(feature_lengths["inputs"]),
                   "targets": int(feature_lengths["targets"])}
        edge.check_split(edge.import_tasks(), task_name, settings.split, macro="EVAL_SPLIT")
        self.evaluator = TaskEvaluator(task_name, settings.split, lengths,
                                       settings.num_examples)
        self.session = Session(model, partitioner, None, batch_size, lengths,
                               decoder or decoding.GreedyDecoder())
        self.output_dir = Path(output_dir) / SUBDIR
        self.writer: Optional[metrics.MetricWriter] = None
        if jax.process_index() == 0:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.writer = metrics.MetricWriter(str(output_dir), 0, log_every=1, subdir=SUBDIR)
        log.info("inference evaluation: %s %s, %s examples", task_name, settings.split,
                 self.evaluator.num_examples)

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
                write_predictions(self.output_dir / f"{task}_{step}_predictions.jsonl", r)
        return flat

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
