"""`python -m t5lite.eval`: a checkpoint's metrics on a task split (seqio's Evaluator).

    python -m t5lite.eval --gin_file=models/t5_1_1/small.gin --gin_file=runs/eval.gin \
      --gin.CHECKPOINT_PATH=\"/runs/mnli\" --gin.MIXTURE_OR_TASK_NAME=\"mnli\" \
      --gin.SPLIT=\"validation_matched\" --gin.OUTPUT_DIR=\"/runs/mnli_eval\"

Writes OUTPUT_DIR/eval/ (TensorBoard scalars `<task>/<metric>` at the checkpoint's step),
OUTPUT_DIR/metrics.json and OUTPUT_DIR/eval/<task>_predictions.jsonl. See
docs/eval_infer.md.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import jax

from t5lite import checkpoints, evaluation, gin_utils, metrics, partitioning

log = logging.getLogger("t5lite.eval")


def evaluate(*, model, checkpoint_path: str, mixture_or_task_name: str, output_dir: str,
             task_feature_lengths: Mapping[str, int], batch_size: int,
             split: str = "validation", decoding_method: str = "greedy", beam_size: int = 4,
             alpha: float = 0.6, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, num_examples: Optional[int] = None,
             ici_mesh_shape: Sequence[int] = (-1, 1, 1),
             dcn_mesh_shape: Sequence[int] = (1, 1, 1), partition_rules: Sequence = (),
             data_settings: Optional[Mapping[str, Any]] = None) -> Dict[str, Dict[str, float]]:
    """Decode `split` of the task or mixture, compute its metrics, write them.
    Returns {task: {metric: value}}."""
    if not output_dir:
        raise gin_utils.ConfigError("OUTPUT_DIR is not set")
    evaluation.check_encoder_decoder(model, "python -m t5lite.eval")
    spec = evaluation.decoder_spec(decoding_method, beam_size, alpha, temperature,
                                   top_k, top_p)
    _, tasks = evaluation.import_data(data_settings)
    evaluation.check_split(tasks, mixture_or_task_name, split)  # fail before restoring
    session = evaluation.load_session(
        model, checkpoint_path, batch_size=batch_size, feature_lengths=task_feature_lengths,
        decoder=spec, seed=seed, ici_mesh_shape=ici_mesh_shape,
        dcn_mesh_shape=dcn_mesh_shape,
        partition_rules=partition_rules)
    t0 = time.perf_counter()
    results = evaluation.evaluate_task(session, mixture_or_task_name, split, num_examples)
    seconds = time.perf_counter() - t0
    out = {name: r.metrics for name, r in results.items()}
    if jax.process_index() == 0:
        root = Path(output_dir)
        (root / "eval").mkdir(parents=True, exist_ok=True)
        writer = metrics.MetricWriter(str(root), 0, log_every=1, subdir="eval")
        writer.write_scalars(session.step, {f"{task}/{k}": v for task, m in out.items()
                                            for k, v in m.items()})
        writer.close()
        for name, r in results.items():
            evaluation.write_predictions(root / "eval" / f"{name}_predictions.jsonl", r)
        summary = {"checkpoint": str(checkpoint_path), "step": session.step, "split": split,
                   "mixture_or_task_name": mixture_or_task_name,
                   "decoding": decoding_method,
                   "num_examples": {n: len(r.inputs) for n, r in results.items()},
                   "seconds": round(seconds, 3), "metrics": out}
        tmp = root / "metrics.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, root / "metrics.json")
    for name, m in out.items():
        log.info("%s %s: %s", name, split, ", ".join(f"{k} {v:.4g}" for k, v in m.items()))
    return out


# --------------------------------------------------------------------------- CLI


def _parser(description: Optional[str] = None) -> argparse.ArgumentParser:
    return gin_utils.entry_parser(description or __doc__.splitlines()[0])


def run_entry(argv: Optional[Sequence[str]], parser: argparse.ArgumentParser,
              call) -> int:
    """The shared CLI body of eval and infer (train.main's pattern): flags -> gin, call
    the registered configurable with MODEL, one `error:` line for a user error."""
    from t5lite import train as train_module
    gin_utils.setup_logging()
    args = gin_utils.parse_flags(parser, argv)
    partitioning.initialize_distributed(args.coordinator_address, args.process_count,
                                        args.process_index, args.multiprocess)
    train_module._check_command_line_macros(args)  # noqa: SLF001 (shared CLI helper)
    gin_utils.configure(args)
    import t5lite.configurables as conf
    model = gin_utils.resolve_macro("MODEL")
    try:
        call(conf, model)
    except gin_utils.ConfigError as e:
        print(f"error: {train_module._one_line(e)}", file=sys.stderr)  # noqa: SLF001
        return gin_utils.EXIT_CONFIG_ERROR
    except (partitioning.PartitioningError, checkpoints.CheckpointMismatchError,
            FileNotFoundError) as e:
        print(f"error: {train_module._one_line(e)}", file=sys.stderr)  # noqa: SLF001
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_entry(argv, _parser(), lambda conf, model: conf.evaluate(model=model))


if __name__ == "__main__":
    gin_utils.run_main(main)
