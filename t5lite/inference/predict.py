"""`infer`: predict or score a task split or a file of inputs, to jsonl. The library
behind `python -m t5lite.infer` (configs/runs/infer.gin binds it).

Writes OUTPUT_DIR/predictions.jsonl, one line per example in input order:
`{"inputs": ..., "prediction": ...}` (MODE 'predict') or
`{"inputs": ..., "targets": ..., "score": ...}` (MODE 'score', the summed log-likelihood
of the targets). Each batch's lines are flushed and fsynced; a rerun after a crash keeps
the complete lines already written (a partial last line is cut off) and continues with
the next example, but only for the same job: OUTPUT_DIR/predictions.job.json records the
checkpoint, inputs, mode, lengths and decoding, and output of another job is refused in
one line instead of extended.

INPUT_FILE's texts are processed exactly as the model's training task processed its
inputs and targets (`t5lite.inference.file_inputs`): the task MIXTURE_OR_TASK_NAME
names, else the one the checkpoint's run recorded in MODEL_DIR/config.gin; for t5lite's
inputs -> targets tasks that is trimmed to the feature's length with EOS appended, for
both families. A decoder-only model with RAW_PROMPTS=True, a language-modeling task or
no known task continues each line as it is instead (no EOS: a pretrained LM's prompt).

A decoder-only model reads each input as a prompt (BOS, then the input's tokens),
continued by up to TASK_FEATURE_LENGTHS['targets'] new tokens (predict), or followed by
its targets, whose log-likelihood is the score (score).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

import jax

from t5lite.data import edge
from t5lite.errors import (ConfigError, DataError, DiskFullError, check_bool,
                           check_feature_lengths, check_positive_int, check_text)
from t5lite.inference import file_inputs
from t5lite.inference.session import DecodingSettings, load_session
from t5lite.inference.task_eval import tfds_numpy
from t5lite.models.common.features import decode_tokens
from t5lite.runtime import metrics
from t5lite.runtime.process import disk_space, run_lock
from t5lite.runtime.partitioning import MeshSettings

log = logging.getLogger(__name__)
MODES = ("predict", "score")
OUTPUT_FILE = "predictions.jsonl"
JOB_FILE = "predictions.job.json"


def job_record(*, checkpoint_path: str, step: int, mode: str, input_file: Optional[str],
               task: Optional[str], split: str, lengths: Mapping[str, int],
               decoding: DecodingSettings, rule: Optional[file_inputs.FileInputs] = None
               ) -> Dict[str, Any]:
    """What makes the lines of predictions.jsonl: the checkpoint, the inputs (a file's
    path, size and modification time and how its texts are processed, or the task
    split), the mode, lengths and decoding."""
    if input_file:
        stat = Path(input_file).stat()
        source = {"input_file": str(Path(input_file).resolve()), "size": stat.st_size,
                  "mtime_ns": stat.st_mtime_ns,
                  "processed_as": rule.record() if rule else None}
    else:
        source = {"task": task, "split": split}
    return {"checkpoint": str(Path(checkpoint_path).resolve()), "step": int(step),
            "mode": mode, **source, "feature_lengths": dict(lengths),
            "decoding": dataclasses.asdict(decoding)}


def check_same_job(output_dir: Path, record: Dict[str, Any], done: int) -> None:
    """ConfigError (one line) unless OUTPUT_DIR's predictions came from this same job;
    records the job when the file is new."""
    job = output_dir / JOB_FILE
    if job.exists():
        try:
            previous = json.loads(job.read_text())
        except ValueError:
            previous = None
        changed = ([k for k in record if previous.get(k) != record[k]]
                   if isinstance(previous, dict) else ["(unreadable job record)"])
        if changed and done:
            k = changed[0]
            was = previous.get(k) if isinstance(previous, dict) else None
            raise ConfigError(
                f"OUTPUT_DIR {output_dir} holds {done} predictions of another job ({k}: "
                f"{was!r} there, {record.get(k)!r} now): use a new OUTPUT_DIR, or delete "
                f"{OUTPUT_FILE} and {JOB_FILE} to start over")
    elif done:
        raise ConfigError(
            f"OUTPUT_DIR {output_dir} holds {done} predictions but no {JOB_FILE} saying which "
            f"checkpoint and inputs made them: use a new OUTPUT_DIR, or delete {OUTPUT_FILE} "
            f"to start over")
    disk_space.replace_file(job, json.dumps(record, indent=1))


# ----------------------------------------------------------------------------- resume


@contextlib.contextmanager
def _appending(out_path: Path, kept: int):
    """An append of lines to predictions.jsonl: a full disk ends in one line that says
    how many complete lines are kept (a partial last line is cut off by the rerun)."""
    try:
        with disk_space.writing(OUTPUT_FILE, out_path.parent):
            yield
    except DiskFullError as e:
        raise DiskFullError(f"{e}; the {kept} complete lines in {out_path} are kept — free "
                            f"space, then run the same command to continue after them"
                            ) from None


def complete_lines(path: Path) -> int:
    """The number of complete (newline-terminated) lines in `path`; a partial last line
    (a crash mid-write) is cut off the file. 0 if the file does not exist."""
    if not path.exists():
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1  # 0 when there is no complete line
        if end != len(data):
            log.warning("%s ends with a partial line (%d bytes); cutting it off", path,
                        len(data) - end)
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    return data[:end].count(b"\n")


def _count_lines_readonly(path: Path) -> int:
    if not path.exists():
        return 0
    data = path.read_bytes()
    return data[:data.rfind(b"\n") + 1].count(b"\n")


# ----------------------------------------------------------------------------- inputs


def _task_examples(provider, split: str, lengths: Mapping[str, int]
                   ) -> Iterator[Dict[str, Any]]:
    with edge.stream_scope() as stream:
        ds = provider.get_dataset(dict(lengths), split=split, shuffle=False, num_epochs=1,
                                  use_cached=False)
    vocab = provider.output_features["targets"].vocabulary
    # a tokenizer.json's id 0 (a token of text) is written as a stand-in in a task's stream
    stand_in = getattr(vocab, "zero_stand_in", None)

    def ids(key):
        return [0 if int(t) == stand_in else int(t) for t in ex[key]]

    for ex in tfds_numpy(ds, stream):
        def text(key):
            raw = ex.get(f"{key}_pretokenized")
            if raw is None:
                return vocab.decode(ids(key))
            return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        yield {"inputs": text("inputs"), "targets": text("targets"),
               "inputs_ids": ids("inputs"), "targets_ids": ids("targets")}


def _batches(it: Iterator, size: int) -> Iterator[List]:
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


# ----------------------------------------------------------------------------- main


def infer(*, model, checkpoint_path: str, output_dir: str,
          task_feature_lengths: Mapping[str, int], batch_size: int, mode: str,
          mixture_or_task_name: Optional[str], split: str, input_file: Optional[str],
          raw_prompts: bool, decoding: DecodingSettings, mesh: MeshSettings,
          data_settings: edge.DataSettings) -> int:
    """Predict or score every example of INPUT_FILE (else of the task split) into
    OUTPUT_DIR/predictions.jsonl, resuming after the lines already there. INPUT_FILE's
    texts are processed as `file_inputs.file_inputs` says (the training task's inputs
    by default; RAW_PROMPTS: a decoder-only model's raw prompts). Returns the number of
    lines written by this call. Every keyword is bound by configs/runs/infer.gin, the one home
    of their defaults."""
    inputs = _check_settings(task_feature_lengths, batch_size, raw_prompts, checkpoint_path,
                             output_dir, mixture_or_task_name, input_file, split, mode)
    # one infer per OUTPUT_DIR: two would interleave their lines in one file
    lock = run_lock.hold(Path(output_dir), "OUTPUT_DIR", "infer run")
    try:
        lengths = {"inputs": int(task_feature_lengths["inputs"]),
                   "targets": int(task_feature_lengths["targets"])}
        examples, vocab, rule = _examples(model, edge.import_tasks(data_settings), lengths,
                                          mode, mixture_or_task_name, split, input_file,
                                          checkpoint_path, raw_prompts)
        session = load_session(model, checkpoint_path, batch_size=batch_size,
                               feature_lengths=lengths, decoding_settings=decoding, mesh=mesh)
        out_path = Path(output_dir) / OUTPUT_FILE
        writer = jax.process_index() == 0
        if writer:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            done = complete_lines(out_path)
            check_same_job(out_path.parent, job_record(
                checkpoint_path=checkpoint_path, step=session.step, mode=mode,
                input_file=input_file, task=mixture_or_task_name, split=split, lengths=lengths,
                decoding=decoding, rule=rule), done)
        else:
            done = _count_lines_readonly(out_path)
        if done:
            log.info("resuming: %s already holds %d lines; skipping that many examples",
                     out_path, done)
        t0 = time.perf_counter()
        total = inputs - done if inputs is not None else None  # a task split: uncounted
        written = _write_lines(itertools.islice(examples, done, None), session, model, vocab,
                               lengths, mode, batch_size, out_path if writer else None, done,
                               total)
        log.info("wrote %d lines to %s (%d in all) in %.1fs", written, out_path, done + written,
                 time.perf_counter() - t0)
        return written
    finally:
        lock.release()


def _check_settings(task_feature_lengths, batch_size, raw_prompts, checkpoint_path, output_dir,
                    mixture_or_task_name, input_file, split, mode) -> Optional[int]:
    """Every setting of an infer run checked, and INPUT_FILE read through, before anything
    loads: one line for the first that is wrong. Returns INPUT_FILE's number of inputs
    (None without one)."""
    check_feature_lengths(task_feature_lengths)
    check_positive_int("BATCH_SIZE", batch_size)
    check_bool("RAW_PROMPTS", raw_prompts)
    for macro, value in (("CHECKPOINT_PATH", checkpoint_path), ("OUTPUT_DIR", output_dir),
                         ("MIXTURE_OR_TASK_NAME", mixture_or_task_name),
                         ("INPUT_FILE", input_file), ("SPLIT", split), ("MODE", mode)):
        check_text(macro, value, optional=macro not in ("SPLIT", "MODE"))
    if mode not in MODES:
        raise ConfigError(f"MODE must be one of {', '.join(MODES)}, got {mode!r}")
    if not output_dir:
        raise ConfigError("OUTPUT_DIR is not set")
    if not input_file and not mixture_or_task_name:
        raise ConfigError("set INPUT_FILE (jsonl or text) or MIXTURE_OR_TASK_NAME (with "
                          "SPLIT) to say what to run on")
    if input_file and not Path(input_file).is_file():
        raise FileNotFoundError(f"INPUT_FILE {input_file} does not exist")
    if input_file and not file_inputs.has_text(Path(input_file)):
        raise DataError(f"INPUT_FILE {input_file} is empty: there is nothing to {mode}; give "
                        f"it one input a line (text) or one JSON record a line (.jsonl)")
    if raw_prompts and not input_file:
        raise ConfigError("RAW_PROMPTS applies to INPUT_FILE's lines; a task split is read "
                          "as its task processes it: drop RAW_PROMPTS or give INPUT_FILE")
    if input_file:  # a line that is not UTF-8 (or JSON) fails here, before anything loads
        count = file_inputs.check_file(input_file, mode)
        log.info("INPUT_FILE %s: %d inputs", input_file, count)
        return count
    return None


def _examples(model, tasks, lengths, mode, mixture_or_task_name, split, input_file,
              checkpoint_path, raw_prompts):
    """(the examples to run, the targets' vocabulary, INPUT_FILE's rule or None): INPUT_FILE's
    lines processed as `file_inputs` says, else the task split's examples."""
    if input_file:
        rule = file_inputs.file_inputs(model, task_name=mixture_or_task_name,
                                       checkpoint_path=checkpoint_path, raw_prompts=raw_prompts)
        vocab = rule.vocabularies["targets"]
        model.check_vocabulary(rule.vocabularies["inputs"])
        model.check_vocabulary(vocab)
        return file_inputs.tokenized_file(input_file, mode, rule, lengths, model), vocab, rule
    provider = edge.check_split(tasks, mixture_or_task_name, split)
    vocab = provider.output_features["targets"].vocabulary
    model.check_vocabulary(vocab)  # loads it: a bad file is one line, here
    return _task_examples(provider, split, lengths), vocab, None


def _write_lines(examples, session, model, vocab, lengths, mode: str, batch_size: int,
                 out_path: Optional[Path], done: int, total: Optional[int] = None) -> int:
    """Predict or score `examples` a batch at a time, appending each batch's lines to
    `out_path` (None: a process that does not write) as one synced write; returns the
    number of lines. A bar of the lines (of `total`, when known) on a terminal."""
    written = 0
    f = open(out_path, "a", encoding="utf-8") if out_path is not None else None
    bar = metrics.Progress(total, desc=mode)
    try:
        for chunk in _batches(examples, batch_size):
            inputs = [ex["inputs_ids"] for ex in chunk]
            if mode == "predict":
                tokens = session.predict(model.inference_batch(inputs, lengths),
                                         index=done + written)
                lines = [{"inputs": ex["inputs"], "prediction": decode_tokens(vocab, row)}
                         for ex, row in zip(chunk, tokens)]
            else:
                batch = model.inference_batch(inputs, lengths,
                                              [ex["targets_ids"] for ex in chunk])
                lines = [{"inputs": ex["inputs"], "targets": ex["targets"],
                          "score": float(s)} for ex, s in zip(chunk, session.score(batch))]
            if f is not None:
                with _appending(out_path, done + written):
                    f.write("".join(json.dumps(line, ensure_ascii=False) + "\n"
                                    for line in lines))
                    f.flush()
                    os.fsync(f.fileno())
            written += len(lines)
            bar.update(written)
    finally:
        bar.close()
        if f is not None:
            with contextlib.suppress(OSError):  # a full disk was reported above
                f.close()
    return written
