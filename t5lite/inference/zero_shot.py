"""Zero-shot evaluation: Lambada's last-word accuracy and BoolQ's yes/no accuracy, scored
as lm-evaluation-harness (and Pax's GPU recipes) score them (`t5lite.eval` with MODE
'zero_shot' and MIXTURE_OR_TASK_NAME 'lambada' or 'boolq'; docs/eval_infer.md).

    lambada   the passage without its last word is the context; the model greedy-decodes
              from it, and an example is right when its first tokens are all the tokens
              of the target " " + last word (the harness's `is_greedy`)
    boolq     "{passage}\\nQuestion: {question}?\\nAnswer:" is the context; the answer is
              whichever of " yes" and " no" has the higher log-likelihood after it (a tie:
              " no", the harness's first choice)

Both families, by asking the model (`model.inference_ids`, `model.inference_batch`): a
decoder-only model reads BOS + the context's tokens and continues it; a T5 reads the
context (EOS appended, as every T5 input) in its encoder and decodes or scores the
target through its decoder, EOS included (the harness's seq2seq reading: its tokenizer
ends both with </s>). A continuation's tokens are those the context + continuation text
has after the context's (the harness's split: SentencePiece's word-initial "▁" stays
right, LLaMA's tokenizer included), then what the model ends a text with (T5: EOS).

The batches are as wide as the longest context and continuation need; a context or
continuation longer than TASK_FEATURE_LENGTHS' 'inputs' / 'targets' is refused in one
line, before the checkpoint loads (no example is silently cut). Every process reads the
whole file and passes the same batches (the `Session` contract), so any process count
gives the same result. Accuracy, its standard error sqrt(p (1 - p) / n) and n are the
metrics; each example's prediction is kept for the predictions file.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from t5lite.data import edge
from t5lite.errors import ConfigError, DataNotFoundError
from t5lite.inference.session import DecodingSettings, Session, load_session
from t5lite.models.common.features import decode_tokens
from t5lite.runtime import metrics
from t5lite.runtime.partitioning import MeshSettings
from t5lite.runtime.process import disk_space

log = logging.getLogger(__name__)
Example = edge.zero_shot_files.Example  # one example: its text and what is scored
# task -> (data setting, name in messages, file names looked for, suffixes of a lone file)
TASKS = {"lambada": ("lambada_dir", "Lambada", edge.zero_shot_files.LAMBADA_FILES,
                     (".jsonl", ".txt")),
         "boolq": ("boolq_dir", "BoolQ", edge.zero_shot_files.BOOLQ_FILES, (".jsonl",))}
_UNTRIMMED = 1 << 30  # a length no text reaches: inference_ids keeps every token


@dataclasses.dataclass
class Result:
    """One zero-shot evaluation: its metrics, the per-example rows (predictions file), the
    file read, the checkpoint's step and the seconds the model ran."""

    metrics: Dict[str, float]
    rows: List[dict]
    path: str
    step: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class _Ids:
    context: List[int]
    continuations: Tuple[List[int], ...]


def evaluate(model, *, task: str, checkpoint_path: str,
             task_feature_lengths: Mapping[str, int], batch_size: int,
             num_examples: Optional[int], decoding: DecodingSettings, mesh: MeshSettings,
             data_settings: edge.DataSettings, input_file: Optional[str]) -> Result:
    """`task` ('lambada' or 'boolq') of INPUT_FILE, else of its directory setting, scored
    by the checkpoint (see the module docstring). The file is read and tokenized, and
    every length checked, before the checkpoint loads."""
    if task not in TASKS:
        raise ConfigError(f"MODE 'zero_shot' evaluates MIXTURE_OR_TASK_NAME 'lambada' or "
                          f"'boolq', got {task!r}")
    if str(decoding.method).lower() != "greedy":
        raise ConfigError(f"MODE 'zero_shot' decodes greedily (Lambada's last-word accuracy "
                          f"is greedy), got DECODING_METHOD={decoding.method!r}: leave it "
                          f"'greedy'")
    limits = {k: task_feature_lengths.get(k) for k in ("inputs", "targets")}
    if not all(limits.values()):
        raise ConfigError(f"MODE 'zero_shot' needs TASK_FEATURE_LENGTHS 'inputs' (the longest "
                          f"context) and 'targets' (the longest continuation), got "
                          f"{dict(task_feature_lengths)}")
    tasks = edge.import_tasks(data_settings)
    path = find_file(task, tasks.configured(), input_file)
    examples = edge.zero_shot_files.read(task, path)
    if num_examples is not None:
        examples = examples[:num_examples]
    if not examples:
        raise DataNotFoundError(f"{path} holds no {TASKS[task][1]} example")
    vocab = edge.vocabulary()
    model.check_vocabulary(vocab)
    ids = [tokenize(model, vocab, ex) for ex in examples]
    lengths = widths(ids, limits, f"{len(ids)} {TASKS[task][1]} examples of {path}")
    model.check_decode_lengths(lengths)  # the positions the network reads fit the model
    session = load_session(model, checkpoint_path, batch_size=batch_size,
                           feature_lengths=lengths, mesh=mesh, decodes=task == "lambada")
    log.info("%s: %d examples of %s, contexts up to %d tokens, continuations up to %d",
             task, len(ids), path, lengths["inputs"], lengths["targets"])
    t0 = time.perf_counter()
    if task == "lambada":
        correct, rows = _greedy(session, vocab, examples, ids)
    else:
        correct, rows = _choose(session, examples, ids)
    seconds = time.perf_counter() - t0
    return Result(accuracy(correct), rows, path, session.step, seconds)


def find_file(task: str, data: edge.DataSettings, input_file: Optional[str]) -> str:
    """INPUT_FILE when given, else the task's file in its directory setting
    (LAMBADA_DIR / BOOLQ_DIR, or the demo corpus's)."""
    if input_file:
        if not Path(input_file).is_file():
            raise DataNotFoundError(f"INPUT_FILE {input_file} does not exist")
        return str(input_file)
    setting, what, names, suffixes = TASKS[task]
    resolved = data.resolve()
    directory = resolved.get(setting)
    if not directory:
        raise DataNotFoundError(f"no {what} directory: {edge.how_to_set(setting)} to a directory "
                                f"holding {' or '.join(names)}, or name the file with "
                                f"INPUT_FILE")
    return edge.zero_shot_files.find_file(directory, names, suffixes, what,
                                     f"{resolved.source_of(setting)}; {edge.how_to_set(setting)}")


def tokenize(model, vocab, example: Example) -> _Ids:
    """The example's context as the model reads an input (`model.inference_ids`: T5's
    with EOS, a decoder-only model's as is) and each continuation's tokens: those the
    whole text has after the context's, then what the model's own reading of the
    continuation adds to its tokens (T5: EOS; decoder-only: nothing)."""
    def encode(text: str) -> List[int]:
        return [int(t) for t in vocab.encode(text)]

    context = encode(example.context)
    continuations = []
    for text in example.continuations:
        own, alone = model.inference_ids(vocab, text, _UNTRIMMED), encode(text)
        ids = encode(example.context + text)[len(context):] or alone
        continuations.append(ids + list(own[len(alone):]))
    return _Ids(list(model.inference_ids(vocab, example.context, _UNTRIMMED)),
                tuple(continuations))


def widths(ids: Sequence[_Ids], limits: Mapping[str, int], what: str) -> Dict[str, int]:
    """{"inputs": the longest context, "targets": the longest continuation}; ConfigError
    naming the feature when TASK_FEATURE_LENGTHS (`limits`) would cut any."""
    out = {}
    for key, name, lengths in (
            ("inputs", "context", [len(x.context) for x in ids]),
            ("targets", "continuation", [len(c) for x in ids for c in x.continuations])):
        longest, cut = max(lengths), sum(n > limits[key] for n in lengths)
        if cut:
            raise ConfigError(
                f"TASK_FEATURE_LENGTHS['{key}']={limits[key]} would cut {cut} {name}"
                f"{'s' if cut > 1 else ''} of the {what} (the longest takes {longest} tokens): "
                f"set it to at least {longest} (zero-shot evaluation cuts nothing)")
        out[key] = longest
    return out


def _greedy(session: Session, vocab, examples: Sequence[Example], ids: Sequence[_Ids]):
    """Lambada: right when the greedy continuation starts with every target token."""
    correct, rows = [], []
    with metrics.Progress(len(ids), desc="zero-shot (greedy)") as bar:
        for start in range(0, len(ids), session.batch_size):
            chunk = ids[start:start + session.batch_size]
            batch = session.model.inference_batch([x.context for x in chunk],
                                                  session.feature_lengths)
            tokens = session.predict(batch, index=start)
            bar.update(start + len(chunk))
            for i, (x, row) in enumerate(zip(chunk, tokens)):
                target = x.continuations[0]
                got = [int(t) for t in row[:len(target)]]
                correct.append(got == target)
                example = examples[start + i]
                rows.append({"inputs": example.context, "target": example.target.strip(),
                             "prediction": decode_tokens(vocab, got),
                             "correct": got == target})
    return correct, rows


def _choose(session: Session, examples: Sequence[Example], ids: Sequence[_Ids]):
    """BoolQ (any multiple choice): the continuation of the highest log-likelihood."""
    pairs = [(i, k) for i, x in enumerate(ids) for k in range(len(x.continuations))]
    scores = np.zeros(len(pairs), np.float64)
    with metrics.Progress(len(pairs), desc="zero-shot (choices)") as bar:
        for start in range(0, len(pairs), session.batch_size):
            chunk = pairs[start:start + session.batch_size]
            batch = session.model.inference_batch(
                [ids[i].context for i, _ in chunk], session.feature_lengths,
                [ids[i].continuations[k] for i, k in chunk])
            scores[start:start + len(chunk)] = session.score(batch)
            bar.update(start + len(chunk))
    correct, rows, at = [], [], 0
    for example, x in zip(examples, ids):
        lls = scores[at:at + len(x.continuations)]
        at += len(x.continuations)
        choice = int(np.argmax(lls))  # a tie: the first
        correct.append(choice == example.label)
        names = [c.strip() for c in example.continuations]
        rows.append({"inputs": example.context, "target": names[example.label],
                     "prediction": names[choice], "correct": choice == example.label,
                     "loglikelihoods": dict(zip(names, map(float, lls)))})
    return correct, rows


def accuracy(correct: Sequence[bool]) -> Dict[str, float]:
    """{"accuracy": 100 p, "accuracy_stderr": 100 sqrt(p (1 - p) / n), "examples": n}: in
    percent, as T5X and the finetuning tasks' metrics (MNLI's accuracy) report it."""
    n = len(correct)
    p = float(np.mean(correct))
    return {"accuracy": 100.0 * p, "accuracy_stderr": 100.0 * math.sqrt(p * (1 - p) / n),
            "examples": float(n)}


def write_predictions(path: Path, rows: Sequence[dict]) -> None:
    """One JSON line per example (the file is replaced whole, or not at all when the
    disk is full)."""
    disk_space.replace_file(path, "".join(json.dumps(r) + "\n" for r in rows),
                            f"the predictions {Path(path).name}")
