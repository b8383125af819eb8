"""Perplexity: a model's token-weighted mean loss over a whole task split or file, and
its exponential (`t5lite.eval` with MODE 'perplexity').

    loss       = -(sum of log p(token | what precedes it)) / (number of those tokens)
    perplexity = exp(loss)
    accuracy   = (tokens whose argmax is the token) / (number of those tokens)

The tokens are those the training loss counts (`decoder_loss_weights`): every token of a
language-modeling task, the answer tokens of an inputs -> targets task (a decoder-only
model reads it as prompt then answer), an encoder-decoder's targets. Cross entropy only
(no z-loss, no label smoothing). The batches are the training pipeline's, unshuffled and
unpacked, one epoch, the last batch kept; every process reads all of them and passes the
same batches (the `Session` contract), and the sums are taken on the host in float64 in
example order: the result is deterministic and the same for any process count.

A file (INPUT_FILE) is either text, one sequence a line (decoder-only models: the line's
tokens and EOS, the first `targets` kept, as a language-modeling task reads a document),
or jsonl with "inputs" and "targets" (any model: the targets' log-likelihood after the
inputs, processed and scored as `t5lite.infer` MODE 'score' does per line: as the
training task processes its inputs and targets, `t5lite.inference.file_inputs`).

With STRIDE (`stream_windows`, Megatron's `--overlapping-eval`), a text file is one
stream instead (decoder-only models; WikiText's way): its whole text tokenized once,
read in windows of `targets` tokens that start STRIDE apart; the first window scores
all its tokens (the first one after BOS), each later one only the tokens past the end of
the window before it, so every token is scored once, with up to `targets` - STRIDE
tokens of context before it. Besides the token-level numbers, `word_perplexity` is
exp(total loss / the text's words, split at whitespace), WikiText's word-level figure.
(Megatron scores neither the first token nor the first word and divides by the counts
less one; here the first token is scored after BOS, as a language-modeling task's is.)
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from t5lite.data import edge
from t5lite.errors import ConfigError
from t5lite.inference.session import Session
from t5lite.models.common import model_kinds

Batch = Dict[str, np.ndarray]


def measure(session: Session, batches: Iterable[Batch]) -> Dict[str, float]:
    """{"loss", "perplexity", "accuracy", "tokens", "examples"} of `batches` (each at
    most the session's batch size): the token-weighted mean cross entropy, its
    exponential, and the share of those tokens the argmax predicts."""
    log_likelihood, correct, tokens, examples = 0.0, 0.0, 0.0, 0
    for batch in batches:
        sums = session.teacher_forced(batch)
        log_likelihood += float(np.sum(sums["log_likelihood"].astype(np.float64)))
        correct += float(np.sum(sums["correct"].astype(np.float64)))
        tokens += float(np.sum(batch["decoder_loss_weights"], dtype=np.float64))
        examples += len(sums["log_likelihood"])
    if not tokens:
        raise ConfigError("no token to measure: the split or file holds no example with "
                          "target tokens")
    loss = -log_likelihood / tokens
    return {"loss": loss, "perplexity": math.exp(loss), "accuracy": correct / tokens,
            "tokens": tokens, "examples": float(examples)}


def split_batches(model, name: str, split: str, feature_lengths: Mapping[str, int],
                  batch_size: int, num_examples: Optional[int] = None) -> Iterator[Batch]:
    """The task's (or mixture's) `split` as the training pipeline builds it for `model`,
    unshuffled and unpacked, one epoch; at most `num_examples` rows."""
    # every process reads the whole split (one shard) and feeds its rows to the session
    iterator = edge.make_iterator(name, split=split, feature_lengths=feature_lengths,
                                  layout=edge.DataLayout(batch_size),
                                  model_kind=model.FEATURE_CONVERTER_KIND,
                                  bos_id=model.bos_id, pack=False, shuffle=False, seed=0,
                                  repeat=False, drop_remainder=False)
    try:
        model.check_vocabulary(iterator.vocabulary)  # before a checkpoint is restored
    except BaseException:
        iterator.close()
        raise
    return _closing(_first_rows(iterator, num_examples), iterator)


def _closing(batches: Iterator[Batch], iterator) -> Iterator[Batch]:
    """`batches`, then `iterator` closed: its tf.data threads end when the batches do
    (or when the consumer stops early), not in some later garbage collection."""
    try:
        yield from batches
    finally:
        iterator.close()


def is_pairs_file(path: str) -> bool:
    """Whether INPUT_FILE holds inputs -> targets pairs (jsonl) rather than sequences."""
    return Path(path).suffix in (".jsonl", ".json")


def file_batches(model, path: str, vocabulary, feature_lengths: Mapping[str, int],
                 batch_size: int, rule=None) -> Iterator[Batch]:
    """Batches of INPUT_FILE (see the module docstring); a jsonl file's pairs are
    processed as `rule` says (`t5lite.inference.file_inputs`, as `t5lite.infer`
    MODE 'score' processes them)."""
    from t5lite.inference.file_inputs import read_lines, tokenized_file
    lengths = {k: int(v) for k, v in feature_lengths.items() if v}
    if is_pairs_file(path):
        if set(lengths) != {"inputs", "targets"}:
            raise ConfigError(f"TASK_FEATURE_LENGTHS needs 'inputs' and 'targets' for the "
                              f"inputs -> targets pairs of {path}, got {dict(feature_lengths)}")
        if rule is None:
            raise ValueError("a jsonl INPUT_FILE needs the rule that processes its pairs")
        examples = tokenized_file(path, "score", rule, lengths, model)
        for chunk in _chunks(examples, batch_size):
            yield model.inference_batch([ex["inputs_ids"] for ex in chunk], lengths,
                                        [ex["targets_ids"] for ex in chunk])
        return
    if model.FEATURE_CONVERTER_KIND != model_kinds.DECODER_ONLY:
        raise ConfigError(f"INPUT_FILE {path} is plain text: an encoder-decoder model needs "
                          f"inputs and targets, give a .jsonl file with both fields")
    if "targets" not in lengths:
        raise ConfigError(f"TASK_FEATURE_LENGTHS needs a 'targets' length (the sequence "
                          f"length), got {dict(feature_lengths)}")
    lm = {"inputs": 0, "targets": lengths["targets"]}
    eos = int(vocabulary.eos_id)
    sequences = ([int(t) for t in vocabulary.encode(line)][:lm["targets"] - 1] + [eos]
                 for _, line, _ in read_lines(path) if line.strip())
    for chunk in _chunks(sequences, batch_size):
        yield model.inference_batch([[] for _ in chunk], lm, chunk)


def stream_windows(tokens: List[int], window: int, stride: int) -> List[Tuple[int, int, int]]:
    """(start, end, first scored) of each window over a stream of `len(tokens)` tokens:
    tokens[start:end] are read, tokens[first:end] scored."""
    windows, scored_to, start = [], 0, 0
    while scored_to < len(tokens):
        end = min(start + window, len(tokens))
        windows.append((start, end, scored_to))
        scored_to, start = end, start + stride
    return windows


def stream_batches(model, tokens: List[int], window: int, stride: int,
                   batch_size: int) -> Iterator[Batch]:
    """The windows of `stream_windows` as a decoder-only model's rows of `window` tokens:
    BOS and the window shifted in, the window as targets, loss weights on its scored
    tokens."""
    bos = int(model.bos_id)
    for chunk in _chunks(stream_windows(tokens, window, stride), batch_size):
        rows = len(chunk)
        target = np.zeros((rows, window), np.int32)
        weights = np.zeros((rows, window), np.float32)
        for i, (start, end, first) in enumerate(chunk):
            target[i, :end - start] = tokens[start:end]
            weights[i, first - start:end - start] = 1.0
        inputs = np.concatenate([np.full((rows, 1), bos, np.int32), target[:, :-1]], axis=1)
        causal = np.zeros((rows, window), np.int32)
        causal[:, 0] = 1  # BOS: a prefix LM reads no prompt beyond it
        yield {"decoder_target_tokens": target, "decoder_input_tokens": inputs,
               "decoder_loss_weights": weights, "decoder_causal_attention": causal}


def stream_text(path: str) -> str:
    """A text INPUT_FILE whole (UTF-8; a bad line is one error naming it)."""
    from t5lite.inference.file_inputs import read_lines
    return "".join(line + ("\n" if complete else "") for _, line, complete in read_lines(path))


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    remaining = iter(items)
    while chunk := list(itertools.islice(remaining, size)):
        yield chunk


def _first_rows(batches: Iterable[Batch], limit: Optional[int]) -> Iterator[Batch]:
    left = limit
    for batch in batches:
        if left is not None:
            if left <= 0:
                return
            batch = {k: v[:left] for k, v in batch.items()}
            left -= len(batch["decoder_loss_weights"])
        yield batch
