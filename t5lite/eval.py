"""`python -m t5lite.eval`: a checkpoint's metrics on a task split (seqio's Evaluator;
wiring only, the library is `t5lite.inference.evaluate`).

    python -m t5lite.eval --gin_file=models/t5_1_1/small.gin --gin_file=runs/eval.gin \
      --gin.CHECKPOINT_PATH=\"/runs/mnli\" --gin.MIXTURE_OR_TASK_NAME=\"mnli\" \
      --gin.SPLIT=\"validation_matched\" --gin.OUTPUT_DIR=\"/runs/mnli_eval\"

Writes OUTPUT_DIR/eval/ (TensorBoard scalars `<task>/<metric>` at the checkpoint's step),
OUTPUT_DIR/metrics.json and OUTPUT_DIR/eval/<task>_predictions.jsonl. See
docs/eval_infer.md.
"""
from __future__ import annotations

from typing import Optional, Sequence

from t5lite.config import command, flags, registry


def main(argv: Optional[Sequence[str]] = None) -> int:
    return command.run_model_command(argv, flags.entry_parser(flags.summary(__doc__)),
                                     lambda model: registry.evaluate(model=model))


if __name__ == "__main__":
    command.run_main(main)
