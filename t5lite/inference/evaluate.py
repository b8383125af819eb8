"""`evaluate`: a checkpoint's metrics on a task split, written to OUTPUT_DIR. The library
behind `python -m t5lite.eval` (configs/runs/eval.gin binds it).

MODE 'decode' (default): seqio's Evaluator decodes the split and scores it with the
task's metrics; MODE 'perplexity': the token-weighted mean loss and perplexity over the
split, or over INPUT_FILE (`t5lite.inference.perplexity`); MODE 'zero_shot': Lambada's or
BoolQ's accuracy (MIXTURE_OR_TASK_NAME 'lambada' / 'boolq'; `t5lite.inference.zero_shot`).

Writes OUTPUT_DIR/eval/ (TensorBoard scalars `<task>/<metric>` at the checkpoint's step),
OUTPUT_DIR/metrics.json and, decoding or zero-shot, OUTPUT_DIR/eval/<task>_predictions.jsonl
(process 0).
"""
from __future__ import annotations

import functools
import json
import math
import logging
import time
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional

import jax

from t5lite.data import edge
from t5lite.errors import ConfigError, check_feature_lengths, check_positive_int, check_text
from t5lite.inference import perplexity, task_eval, zero_shot
from t5lite.inference.session import DecodingSettings, load_session
from t5lite.runtime.process import disk_space
from t5lite.runtime import metrics
from t5lite.runtime.partitioning import MeshSettings

log = logging.getLogger(__name__)
MODES = ("decode", "perplexity", "zero_shot")


def evaluate(*, model, checkpoint_path: str, mixture_or_task_name: Optional[str],
             output_dir: str, task_feature_lengths: Mapping[str, int], batch_size: int,
             split: str, num_examples: Optional[int], decoding: DecodingSettings,
             mesh: MeshSettings, data_settings: edge.DataSettings, mode: str,
             input_file: Optional[str], stride: Optional[int] = None
             ) -> Dict[str, Dict[str, float]]:
    """Decode `split` of the task or mixture, compute its metrics, write them (MODE
    'decode'), measure its perplexity (MODE 'perplexity'; of INPUT_FILE when given), or
    evaluate 'lambada' / 'boolq' zero-shot (MODE 'zero_shot'; SPLIT not read). With
    `stride` (STRIDE), MODE 'perplexity' reads a text INPUT_FILE as one stream in
    overlapping windows (`perplexity.stream_windows`). Returns
    {task: {metric: value}}. Every keyword is bound by configs/runs/eval.gin, the one
    home of their defaults."""
    check_feature_lengths(task_feature_lengths)
    check_positive_int("BATCH_SIZE", batch_size)
    check_positive_int("NUM_EXAMPLES", num_examples, optional=True)
    check_positive_int("STRIDE", stride, optional=True)
    for macro, value in (("CHECKPOINT_PATH", checkpoint_path), ("OUTPUT_DIR", output_dir),
                         ("MIXTURE_OR_TASK_NAME", mixture_or_task_name),
                         ("INPUT_FILE", input_file), ("SPLIT", split), ("MODE", mode)):
        check_text(macro, value, optional=macro not in ("SPLIT", "MODE"))
    if not output_dir:
        raise ConfigError("OUTPUT_DIR is not set")
    if mode not in MODES:
        raise ConfigError(f"MODE must be one of {', '.join(MODES)}, got {mode!r}")
    if not mixture_or_task_name and not (mode == "perplexity" and input_file):
        raise ConfigError("MIXTURE_OR_TASK_NAME is not set: name the task (or mixture) to "
                          "evaluate ('lambada' or 'boolq' for MODE 'zero_shot')")
    if mode != "zero_shot" and mixture_or_task_name in zero_shot.TASKS:
        raise ConfigError(f"{mixture_or_task_name!r} is a zero-shot set, not a SeqIO task: "
                          f"evaluate it with MODE='zero_shot'")
    if stride is not None and mode != "perplexity":
        raise ConfigError(f"STRIDE is read by MODE 'perplexity' (a text INPUT_FILE read as "
                          f"one stream), not MODE {mode!r}; drop STRIDE or set MODE")
    if mode == "perplexity" and stride is not None:
        return _stream_perplexity(model, checkpoint_path, output_dir, task_feature_lengths,
                                  batch_size, mesh, data_settings, input_file, stride)
    if mode == "perplexity":
        return _perplexity(model, checkpoint_path, mixture_or_task_name, output_dir,
                           task_feature_lengths, batch_size, split, num_examples, mesh,
                           data_settings, input_file)
    if mode == "zero_shot":
        return _zero_shot(model, checkpoint_path, mixture_or_task_name, output_dir,
                          task_feature_lengths, batch_size, num_examples, decoding, mesh,
                          data_settings, input_file)
    if input_file:
        raise ConfigError("INPUT_FILE is read by MODE 'perplexity' and 'zero_shot' (decoding "
                          "reads a task split); set MODE or drop INPUT_FILE")
    tasks = edge.import_tasks(data_settings)
    provider = edge.check_split(tasks, mixture_or_task_name, split)  # fail before restoring
    # loads the vocabulary: a bad file is one line here, not an error inside tf.data
    model.check_vocabulary(provider.output_features["targets"].vocabulary)
    session = load_session(model, checkpoint_path, batch_size=batch_size,
                           feature_lengths=task_feature_lengths, decoding_settings=decoding,
                           mesh=mesh)
    t0 = time.perf_counter()
    results = task_eval.evaluate_task(session, mixture_or_task_name, split, num_examples)
    seconds = time.perf_counter() - t0
    out = {name: r.metrics for name, r in results.items()}
    predictions = {f"{name}_predictions.jsonl": functools.partial(task_eval.write_predictions,
                                                                  result=r)
                   for name, r in results.items()}
    _write(output_dir, out, step=session.step, seconds=seconds, predictions=predictions,
           checkpoint=str(checkpoint_path), split=split,
           mixture_or_task_name=mixture_or_task_name, decoding=decoding.method,
           num_examples={n: len(r.inputs) for n, r in results.items()})
    for name, m in out.items():
        log.info("%s %s: %s", name, split, ", ".join(f"{k} {v:.4g}" for k, v in m.items()))
    return out


def _perplexity(model, checkpoint_path, name, output_dir, task_feature_lengths, batch_size,
                split, num_examples, mesh, data_settings, input_file):
    """MODE 'perplexity' (see the module docstring)."""
    tasks = edge.import_tasks(data_settings)
    if input_file:
        if not Path(input_file).is_file():
            raise FileNotFoundError(f"INPUT_FILE {input_file} does not exist")
        from t5lite.inference import file_inputs
        file_inputs.check_file(input_file, "perplexity")  # a bad line: one error, before loading
        vocab = edge.vocabulary()
        model.check_vocabulary(vocab)  # before restoring (the batches are read lazily)
        rule = None
        if perplexity.is_pairs_file(input_file):  # processed as infer's MODE 'score' does
            rule = file_inputs.file_inputs(model, task_name=name,
                                           checkpoint_path=checkpoint_path, raw_prompts=False)
            model.check_vocabulary(rule.vocabularies["targets"])
        batches = perplexity.file_batches(model, input_file, vocab, task_feature_lengths,
                                          batch_size, rule)
        name, split = Path(input_file).name, None
    else:
        edge.check_split(tasks, name, split)  # fail before restoring
        batches = perplexity.split_batches(model, name, split, task_feature_lengths,
                                           batch_size, num_examples)
    session = load_session(model, checkpoint_path, batch_size=batch_size,
                           feature_lengths=task_feature_lengths, mesh=mesh, decodes=False)
    t0 = time.perf_counter()
    measured = perplexity.measure(session, batches)
    out = {name: measured}
    _write(output_dir, out, step=session.step, seconds=time.perf_counter() - t0,
           checkpoint=str(checkpoint_path), split=split, mode="perplexity",
           **({"input_file": str(input_file)} if input_file else
              {"mixture_or_task_name": name}))
    log.info("%s%s: loss %.6g, perplexity %.6g over %d tokens (%d examples)", name,
             f" {split}" if split else "", measured["loss"], measured["perplexity"],
             measured["tokens"], measured["examples"])
    return out


def _stream_perplexity(model, checkpoint_path, output_dir, task_feature_lengths, batch_size,
                       mesh, data_settings, input_file, stride):
    """MODE 'perplexity' with STRIDE: INPUT_FILE as one stream (`perplexity.stream_windows`)."""
    from t5lite.models.common import model_kinds
    if not input_file:
        raise ConfigError("STRIDE reads a text INPUT_FILE as one stream: set INPUT_FILE (a "
                          "task split is read example by example: drop STRIDE)")
    if model.FEATURE_CONVERTER_KIND != model_kinds.DECODER_ONLY:
        raise ConfigError("STRIDE: windows over one stream are a decoder-only model's "
                          "(Megatron's --overlapping-eval); an encoder-decoder model scores "
                          "targets after inputs: give a .jsonl INPUT_FILE without STRIDE")
    if perplexity.is_pairs_file(input_file):
        raise ConfigError(f"STRIDE reads a text INPUT_FILE as one stream, and {input_file} "
                          f"holds inputs -> targets pairs: drop STRIDE, or give a text file")
    window = int((task_feature_lengths or {}).get("targets") or 0)
    if not window:
        raise ConfigError(f"STRIDE needs TASK_FEATURE_LENGTHS['targets'] (the window), got "
                          f"{dict(task_feature_lengths)}")
    if stride > window:
        raise ConfigError(f"STRIDE={stride} is larger than the window "
                          f"(TASK_FEATURE_LENGTHS['targets']={window}): tokens between windows "
                          f"would go unscored; set STRIDE <= {window}")
    if not Path(input_file).is_file():
        raise FileNotFoundError(f"INPUT_FILE {input_file} does not exist")
    edge.import_tasks(data_settings)
    vocab = edge.vocabulary()
    model.check_vocabulary(vocab)  # before restoring
    text = perplexity.stream_text(input_file)
    tokens = [int(t) for t in vocab.encode(text)]
    if not tokens:
        raise ConfigError(f"INPUT_FILE {input_file} holds no text to measure")
    session = load_session(model, checkpoint_path, batch_size=batch_size,
                           feature_lengths={"targets": window}, mesh=mesh, decodes=False)
    t0 = time.perf_counter()
    measured = perplexity.measure(
        session, perplexity.stream_batches(model, tokens, window, stride, batch_size))
    words = len(text.split())
    measured.update(words=float(words), windows=measured.pop("examples"),
                    word_perplexity=math.exp(measured["loss"] * measured["tokens"] / words))
    name = Path(input_file).name
    _write(output_dir, {name: measured}, step=session.step, seconds=time.perf_counter() - t0,
           checkpoint=str(checkpoint_path), split=None, mode="perplexity",
           input_file=str(input_file), stride=stride, window=window)
    log.info("%s: loss %.6g, perplexity %.6g over %d tokens in %d windows of %d, stride %d; "
             "word perplexity %.6g over %d words", name, measured["loss"],
             measured["perplexity"], measured["tokens"], measured["windows"], window, stride,
             measured["word_perplexity"], words)
    return {name: measured}


def _zero_shot(model, checkpoint_path, name, output_dir, task_feature_lengths, batch_size,
               num_examples, decoding, mesh, data_settings, input_file):
    """MODE 'zero_shot' (see the module docstring)."""
    result = zero_shot.evaluate(model, task=name, checkpoint_path=checkpoint_path,
                                task_feature_lengths=task_feature_lengths,
                                batch_size=batch_size, num_examples=num_examples,
                                decoding=decoding, mesh=mesh, data_settings=data_settings,
                                input_file=input_file)
    out = {name: result.metrics}
    write = functools.partial(zero_shot.write_predictions, rows=result.rows)
    _write(output_dir, out, step=result.step, seconds=result.seconds,
           predictions={f"{name}_predictions.jsonl": write}, checkpoint=str(checkpoint_path),
           mode="zero_shot", mixture_or_task_name=name, input_file=result.path)
    m = result.metrics
    log.info("%s: accuracy %.2f%% (stderr %.2f) over %d examples of %s", name, m["accuracy"],
             m["accuracy_stderr"], m["examples"], result.path)
    return out


def _write(output_dir, out: Mapping[str, Mapping[str, float]], *, step: int, seconds: float,
           predictions: Optional[Mapping[str, Callable[[Path], None]]] = None, **record):
    """metrics.json, TensorBoard scalars `<name>/<metric>` and the prediction files, each
    written by its function given the path (process 0)."""
    if jax.process_index() != 0:
        return
    root = Path(output_dir)
    (root / "eval").mkdir(parents=True, exist_ok=True)
    writer = metrics.MetricWriter(str(root), 0, log_every=1, subdir="eval")
    writer.write_scalars(step, {f"{name}/{k}": v for name, m in out.items()
                                for k, v in m.items()})
    writer.close()
    for filename, write in (predictions or {}).items():
        write(root / "eval" / filename)
    summary = {**record, "step": step, "seconds": round(seconds, 3), "metrics": out}
    disk_space.replace_file(root / "metrics.json",
                            json.dumps(summary, indent=2, sort_keys=True) + "\n")
