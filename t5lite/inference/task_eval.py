"""Task evaluation: seqio's Evaluator over a task split, decoding with a `Session`, each
task's postprocessing and metrics, and the predictions written next to them.

    evaluator = TaskEvaluator("mnli", "validation_matched", {"inputs": 512, "targets": 8})
    results = evaluator.evaluate(session)        # {task: TaskResult}, as often as needed
    write_predictions(path, results["mnli"])

TensorFlow and SeqIO load when a TaskEvaluator is built (the data edge), not on import.
Each example's inputs (trimmed to the inputs length, EOS appended, as in training) become
the batch the session's model decodes from (`model.inference_batch`: an encoder-decoder's
encoder_input_tokens, a decoder-only model's prompt BOS + inputs, as its prefix-LM
training sequence starts).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from t5lite.data import edge
from t5lite.errors import ConfigError
from t5lite.inference.session import Session
from t5lite.models.common.features import decode_tokens
from t5lite.runtime import metrics
from t5lite.runtime.process import disk_space


def _jsonable(x):
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, np.ndarray):
        return [_jsonable(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return x


@dataclasses.dataclass
class TaskResult:
    """Metrics of one task, and what they were computed from (in example order)."""

    metrics: Dict[str, float]
    inputs: List[str]
    predictions: List[Any]  # postprocessed
    prediction_texts: List[str]
    targets: List[Any]  # postprocessed (for SQuAD: all answers)


class TaskEvaluator:
    """seqio.Evaluator over `split` of the task or mixture `name`, built once (the split
    is read, tokenized and cached here) and run as often as needed: each `evaluate(session)`
    decodes every example with `session.predict`, detokenizes with each task's output
    vocabulary and applies its postprocess_fn and metric_fns.

    feature_lengths: {"inputs": ..., "targets": ...}; num_examples: None for the whole
    split. Raises ConfigError when the tasks have no metrics (span corruption)."""

    def __init__(self, name: str, split: str, feature_lengths: Mapping[str, int],
                 num_examples: Optional[int] = None):
        edge.import_tensorflow()  # TensorFlow set up by the data edge before seqio loads it
        import seqio
        self.name, self.split = name, split
        if not edge.has_inputs(edge.import_tasks().get_provider(name)):
            raise ConfigError(f"task {name!r} has no inputs to decode from (a language-"
                              f"modeling task): measure its perplexity instead "
                              f"(MODE='perplexity')")
        with edge.stream_scope() as stream:
            self._evaluator = seqio.Evaluator(
                mixture_or_task_name=name,
                feature_converter=edge.feature_converter("encoder_decoder", pack=False),
                eval_split=split,
                sequence_length=dict(feature_lengths), num_examples=num_examples,
                use_memory_cache=True, async_compute_metrics=False)
        edge.raise_deferred_error(stream)  # a bad record met while caching the targets
        if not self._evaluator.eval_tasks:
            raise ConfigError(f"task {name!r} has no metric_fns (or no split {split!r}): "
                              f"nothing to evaluate")
        # The Evaluator calls predict_fn once per task with that task's cached dataset.
        self._task_of = {id(ds): task_name
                         for task_name, ds in self._evaluator.cached_model_datasets.items()}
        self._examples = {
            t.name: list(edge.numpy_iterator(self._evaluator.cached_task_datasets[t.name],
                                                stream))
            for t in self._evaluator.eval_tasks}
        for task in self._evaluator.eval_tasks:
            _check_labels_fit(task, split, self._examples[task.name], feature_lengths)

    @property
    def num_examples(self) -> Dict[str, int]:
        return {name: len(ex) for name, ex in self._examples.items()}

    def evaluate(self, session: Session, progress: bool = False) -> Dict[str, TaskResult]:
        """{task name: TaskResult} for the session's current parameters; `progress`: a bar
        of each task's examples on a terminal (the eval command's; not during training,
        whose own bar is on the terminal then)."""
        tokens_by_task: Dict[str, Dict[int, List[int]]] = {}
        provider = edge.import_tasks().get_provider(self.name)
        stand_in = getattr(provider.output_features["inputs"].vocabulary, "zero_stand_in", None)

        def predict_fn(ds, model_feature_shapes=None):
            out = []
            task = self._task_of.get(id(ds), self.name)
            with metrics.Progress(self.num_examples.get(task), desc=f"eval {task}",
                                  enable=None if progress else False) as bar:
                for indices, features in ds.batch(session.batch_size).as_numpy_iterator():
                    inputs = [_unpadded(row, stand_in)
                              for row in features["encoder_input_tokens"]]
                    tokens = session.predict(session.model.inference_batch(
                        inputs, session.feature_lengths), index=int(indices[0]))
                    out.extend((int(i), [int(t) for t in row])
                               for i, row in zip(indices, tokens))
                    bar.update(len(out))
            tokens_by_task[task] = dict(out)
            return out

        metrics_future, _ = self._evaluator.evaluate(compute_metrics=True, step=session.step,
                                                     predict_fn=predict_fn)
        all_metrics = metrics_future.result()
        return {task.name: self._result(task, tokens_by_task[task.name],
                                        all_metrics.get(task.name, {}))
                for task in self._evaluator.eval_tasks}

    def _result(self, task, tokens: Mapping[int, List[int]], task_metrics) -> TaskResult:
        vocab = task.output_features["targets"].vocabulary
        inputs_vocab = task.output_features.get("inputs", task.output_features["targets"]
                                                ).vocabulary
        inputs, preds, texts, targets = [], [], [], []
        for i, ex in enumerate(self._examples[task.name]):
            text = decode_tokens(vocab, tokens[i])
            texts.append(text)
            preds.append(_jsonable(task.postprocess_fn(text, example=ex, is_target=False)))
            target_text = ex["targets_pretokenized"] if "targets_pretokenized" in ex else \
                vocab.decode([int(t) for t in ex["targets"]])
            if isinstance(target_text, bytes):
                target_text = target_text.decode("utf-8")
            targets.append(_jsonable(task.postprocess_fn(target_text, example=ex,
                                                         is_target=True)))
            if "inputs_pretokenized" in ex:
                inputs.append(_jsonable(ex["inputs_pretokenized"]))
            else:
                inputs.append(inputs_vocab.decode([int(t) for t in ex["inputs"]]))
        metrics = {k: float(v.value if hasattr(v, "value") else v)
                   for k, v in task_metrics.items()}
        return TaskResult(metrics, inputs, preds, texts, targets)


def _check_labels_fit(task, split: str, examples, feature_lengths: Mapping[str, int]) -> None:
    """ConfigError (one line) when TASK_FEATURE_LENGTHS' targets cannot hold a label the
    metrics compare predictions with: such an example could never be scored right, and
    the evaluation would report it as the model's error."""
    cuts = edge.cut_labels(examples, task.output_features["targets"].vocabulary,
                                   feature_lengths["targets"])
    if cuts.cut["targets"]:
        raise ConfigError(
            f"TASK_FEATURE_LENGTHS['targets']={feature_lengths['targets']} cuts the labels "
            f"of {cuts.cut['targets']} of the {cuts.examples} examples of {task.name} "
            f"{split} (the longest takes {cuts.longest['targets']} tokens with its EOS), so "
            f"no prediction could match them: set TASK_FEATURE_LENGTHS['targets'] to at "
            f"least {cuts.longest['targets']}")


def evaluate_task(session: Session, name: str, split: str,
                  num_examples: Optional[int] = None) -> Dict[str, TaskResult]:
    """One evaluation of `split` of the task or mixture `name` (see TaskEvaluator), with a
    bar of its examples on a terminal."""
    return TaskEvaluator(name, split, session.feature_lengths, num_examples).evaluate(
        session, progress=True)


def write_predictions(path: Path, result: TaskResult) -> None:
    """One JSON line per example: inputs, prediction text, postprocessed, target (the
    file is replaced whole, or not at all when the disk is full)."""
    disk_space.replace_file(path, "".join(
        json.dumps({"inputs": inp, "prediction": text, "postprocessed": pred,
                    "target": tgt}) + "\n"
        for inp, pred, text, tgt in zip(result.inputs, result.predictions,
                                        result.prediction_texts, result.targets)),
        f"the predictions {Path(path).name}")


def tfds_numpy(ds, stream: int = 0):
    """The dataset's elements as numpy; a bad record raises the reader's DataError."""
    return edge.numpy_iterator(ds, stream)


def _unpadded(row: np.ndarray, stand_in: Optional[int]) -> np.ndarray:
    """An evaluation input without its padding, the zeros after its EOS; a tokenizer.json's
    id 0 (a token of text, written as `stand_in` in the task's stream) as 0 again."""
    row = np.trim_zeros(row, "b")
    return row if stand_in is None else np.where(row == stand_in, 0, row)
