"""`evaluate`: a checkpoint's metrics on a task split (seqio's Evaluator), written to
OUTPUT_DIR. The library behind `python -m t5lite.eval` (configs/runs/eval.gin binds it).

Writes OUTPUT_DIR/eval/ (TensorBoard scalars `<task>/<metric>` at the checkpoint's step),
OUTPUT_DIR/metrics.json and OUTPUT_DIR/eval/<task>_predictions.jsonl (process 0).
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Dict, Mapping, Optional

import jax

from t5lite.data import edge
from t5lite.data.settings import DataSettings
from t5lite.errors import ConfigError
from t5lite.inference import task_eval
from t5lite.inference.session import DecodingSettings, load_session
from t5lite.runtime import disk_space, metrics
from t5lite.runtime.partitioning import MeshSettings

log = logging.getLogger(__name__)


def evaluate(*, model, checkpoint_path: str, mixture_or_task_name: str, output_dir: str,
             task_feature_lengths: Mapping[str, int], batch_size: int,
             split: str = "validation", num_examples: Optional[int] = None,
             decoding: Optional[DecodingSettings] = None,
             mesh: Optional[MeshSettings] = None,
             data_settings: Optional[DataSettings] = None) -> Dict[str, Dict[str, float]]:
    """Decode `split` of the task or mixture, compute its metrics, write them.
    Returns {task: {metric: value}}."""
    if not output_dir:
        raise ConfigError("OUTPUT_DIR is not set")
    decoding = decoding or DecodingSettings()
    tasks = edge.import_tasks(data_settings or DataSettings())
    edge.check_split(tasks, mixture_or_task_name, split)  # fail before restoring
    session = load_session(model, checkpoint_path, batch_size=batch_size,
                           feature_lengths=task_feature_lengths, decoding_settings=decoding,
                           mesh=mesh)
    t0 = time.perf_counter()
    results = task_eval.evaluate_task(session, mixture_or_task_name, split, num_examples)
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
            task_eval.write_predictions(root / "eval" / f"{name}_predictions.jsonl", r)
        summary = {"checkpoint": str(checkpoint_path), "step": session.step, "split": split,
                   "mixture_or_task_name": mixture_or_task_name,
                   "decoding": decoding.method,
                   "num_examples": {n: len(r.inputs) for n, r in results.items()},
                   "seconds": round(seconds, 3), "metrics": out}
        disk_space.replace_file(root / "metrics.json",
                                json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for name, m in out.items():
        log.info("%s %s: %s", name, split, ", ".join(f"{k} {v:.4g}" for k, v in m.items()))
    return out
