"""`python -m t5lite.infer`: predict or score a task split or a file of inputs, to jsonl
(wiring only; the library is `t5lite.inference.predict`).

    python -m t5lite.infer --gin_file=models/t5_1_1/small.gin --gin_file=runs/infer.gin \
      --gin.CHECKPOINT_PATH=\"/runs/mnli\" --gin.INPUT_FILE=\"/data/questions.txt\" \
      --gin.VOCABULARY_PATH=\"/data/spm.model\" --gin.OUTPUT_DIR=\"/runs/answers\"

Writes OUTPUT_DIR/predictions.jsonl, one line per example in input order:
`{"inputs": ..., "prediction": ...}` (MODE 'predict') or
`{"inputs": ..., "targets": ..., "score": ...}` (MODE 'score'); a rerun after a crash
continues after the complete lines already written. Each line of INPUT_FILE is processed
as the model's training task processed its inputs (MIXTURE_OR_TASK_NAME, else the task
CHECKPOINT_PATH's MODEL_DIR/config.gin records: EOS appended for mnli and squad);
RAW_PROMPTS=True has a decoder-only model continue the lines as they are. See
docs/eval_infer.md.
"""
from __future__ import annotations

from typing import Optional, Sequence

from t5lite.config import command, flags, registry


def main(argv: Optional[Sequence[str]] = None) -> int:
    return command.run_model_command(argv, flags.entry_parser(flags.summary(__doc__)),
                                     lambda model: registry.infer(model=model))


if __name__ == "__main__":
    command.run_main(main)
