"""Evaluation during training, T5X's two kinds: every EVAL_PERIOD steps (and after the
last), with the current parameters,

- the validation loss (T5X's `train_eval`): the teacher-forced loss, accuracy and
  perplexity of the first EVAL_STEPS batches of EVAL_SPLIT (`validation.ValidationLoss`;
  EVAL_STEPS=None: off), written to MODEL_DIR/training_eval/<task> (TensorBoard) as
  `loss_per_token`, `accuracy` and `perplexity`;
- the inference evaluation (T5X's `infer_eval`), where the task has metrics: decode the
  split and compute them, written to MODEL_DIR/inference_eval as `<task>/<metric>`, with
  the predictions of each evaluation in
  MODEL_DIR/inference_eval/<task>_<step>_predictions.jsonl (process 0).

The training loop (t5lite.runtime.loop) builds it through `train.inference_evaluator`:

    hook = InferenceEvaluation(model, partitioner, task_name="mnli",
                               feature_lengths={"inputs": 512, "targets": 16},
                               batch_size=32, output_dir="/runs/mnli",
                               settings=InferenceEvalSettings(period=1000, steps=20,
                                                              split="validation_matched"))
    metrics = hook(step, state.variables)
    # {"training_eval/mnli/loss_per_token": 0.41, ..., "mnli/accuracy": 83.1, ...}

The split is read (and tokenized) once, when the hook is built, so a missing split, or a
task with neither metrics nor EVAL_STEPS, fails before the first training step.
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
from t5lite.inference.validation import ValidationLoss
from t5lite.models import decoding
from t5lite.runtime import metrics
from t5lite.runtime.partitioning import Partitioner

log = logging.getLogger(__name__)
SUBDIR = "inference_eval"
VALIDATION_SUBDIR = "training_eval"  # T5X's directory for its train_eval summaries


@dataclasses.dataclass(frozen=True)
class InferenceEvalSettings:
    """Evaluation during training: EVAL_PERIOD (None or 0: never), EVAL_SPLIT,
    EVAL_BATCH_SIZE (None: BATCH_SIZE), EVAL_STEPS (the validation loss's batches:
    runs/pretrain.gin binds T5X's 20; None: no validation loss) and EVAL_NUM_EXAMPLES
    (the inference evaluation's examples; None: all). gin gives it to
    `train.inference_eval`; the training loop reads only `period` (it may not import
    inference) and passes it on to the evaluator it builds."""

    split: str
    period: Optional[int] = None
    batch_size: Optional[int] = None
    num_examples: Optional[int] = None
    steps: Optional[int] = None

    def __post_init__(self):
        check_text("EVAL_SPLIT", self.split)
        check_positive_int("EVAL_BATCH_SIZE", self.batch_size, optional=True)
        check_positive_int("EVAL_NUM_EXAMPLES", self.num_examples, optional=True)
        check_positive_int("EVAL_STEPS", self.steps, optional=True)
        if self.period == 0:
            object.__setattr__(self, "period", None)
        if self.period is not None and (isinstance(self.period, bool) or
                                        not isinstance(self.period, int) or self.period < 0):
            raise ConfigError(f"EVAL_PERIOD must be a positive integer (or None for no "
                              f"evaluation during training), got {self.period!r}")


def decodes_for_metrics(tasks, name: str) -> bool:
    """Whether the task or mixture `name` has inputs to decode and metrics to compute."""
    provider = tasks.get_provider(name)
    if not edge.has_inputs(provider):
        return False
    members = getattr(provider, "tasks", None) or [provider]
    return any(getattr(task, "metric_fns", None) for task in members)


class InferenceEvaluation:
    """The validation loss (with EVAL_STEPS) and, where the task has metrics, a decoding
    session, whose parameters are the training state's at each evaluation (their jitted
    functions compiled once). `batch_size` is the training batch, used when
    EVAL_BATCH_SIZE is None. The data settings of the training run are already in force
    (its iterator applied them)."""

    def __init__(self, model, partitioner: Partitioner, *, task_name: str,
                 feature_lengths: Mapping[str, int], batch_size: int, output_dir: str,
                 settings: InferenceEvalSettings, decoder=None):
        if not settings.split:
            raise ConfigError("EVAL_PERIOD is set but EVAL_SPLIT is not: name the split to "
                              "evaluate (e.g. 'validation')")
        batch_size = int(settings.batch_size or batch_size)
        partitioner.data_layout(batch_size)  # it divides over the data shards
        tasks = edge.import_tasks()
        edge.check_split(tasks, task_name, settings.split, macro="EVAL_SPLIT")
        decodes = decodes_for_metrics(tasks, task_name)
        if not decodes and not settings.steps:
            raise ConfigError(f"EVAL_PERIOD is set, but task {task_name!r} has no metrics to "
                              f"decode for and EVAL_STEPS=None turns the validation loss "
                              f"off: nothing to evaluate (set EVAL_STEPS, e.g. 20, or "
                              f"EVAL_PERIOD=None)")
        self.task_name = task_name
        self.validation = None
        if settings.steps:
            self.validation = ValidationLoss(
                model, partitioner, task_name=task_name, split=settings.split,
                feature_lengths=feature_lengths, batch_size=batch_size, steps=settings.steps)
            log.info("validation loss: %s %s, %d examples (EVAL_STEPS=%d batches of %d)",
                     task_name, settings.split, self.validation.examples, settings.steps,
                     batch_size)
        self.evaluator = self.session = None
        if decodes:
            lengths = {"inputs": int(feature_lengths["inputs"]),
                       "targets": int(feature_lengths["targets"])}
            self.evaluator = TaskEvaluator(task_name, settings.split, lengths,
                                           settings.num_examples)
            self.session = Session(model, partitioner, None, batch_size, lengths,
                                   decoder or decoding.GreedyDecoder())
            log.info("inference evaluation: %s %s, %s examples", task_name, settings.split,
                     self.evaluator.num_examples)
        self.output_dir = Path(output_dir) / SUBDIR
        self.writers: Dict[str, metrics.MetricWriter] = {}
        if jax.process_index() == 0:
            if self.evaluator is not None:
                self.output_dir.mkdir(parents=True, exist_ok=True)
                self.writers[SUBDIR] = metrics.MetricWriter(str(output_dir), 0, log_every=1,
                                                            subdir=SUBDIR)
            if self.validation is not None:
                subdir = f"{VALIDATION_SUBDIR}/{task_name}"
                self.writers[VALIDATION_SUBDIR] = metrics.MetricWriter(
                    str(output_dir), 0, log_every=1, subdir=subdir)

    def __call__(self, step: int, variables: Any) -> Dict[str, float]:
        """Both evaluations with `variables`; returns
        {"training_eval/<task>/<name>": value, "<task>/<metric>": value}."""
        flat: Dict[str, float] = {}
        if self.validation is not None:
            t0 = time.perf_counter()
            measured = self.validation(variables)
            self._write(VALIDATION_SUBDIR, step,
                        {**measured, "timing/seconds": time.perf_counter() - t0})
            flat.update({f"{VALIDATION_SUBDIR}/{self.task_name}/{k}": v
                         for k, v in measured.items()})
        if self.evaluator is not None:
            flat.update(self._decode(step, variables))
        return flat

    def _decode(self, step: int, variables: Any) -> Dict[str, float]:
        """Decode the split with `variables`: {"<task>/<metric>": value}."""
        self.session.params, self.session.step = variables, step
        t0 = time.perf_counter()
        results = self.evaluator.evaluate(self.session)
        seconds = time.perf_counter() - t0
        self.session.params = None  # do not keep the state's buffers alive between evals
        flat = {f"{task}/{k}": v for task, r in results.items() for k, v in r.metrics.items()}
        if self._write(SUBDIR, step, {**flat, "timing/seconds": seconds}):
            for task, r in results.items():
                write_predictions(self.output_dir / f"{task}_{step}_predictions.jsonl", r)
        return flat

    def _write(self, kind: str, step: int, scalars: Mapping[str, Any]) -> bool:
        """The scalars to TensorBoard, and their log line (process 0: True)."""
        writer = self.writers.get(kind)
        if writer is None:
            return False
        writer.write_scalars(step, scalars)  # also logs "[<subdir>] step N: ..."
        writer.flush()
        return True

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
