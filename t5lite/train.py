"""`python -m t5lite.train`: train a gin-configured model (wiring only; the loop is
`t5lite.runtime.loop.train`).

    python -m t5lite.train --gin_file=configs/models/t5_1_1/tiny.gin \
      --gin_file=configs/synthetic_pretrain.gin --gin.MODEL_DIR=\"/tmp/run\" \
      --gin.TRAIN_STEPS=20 --gin.BATCH_SIZE=8

With no --gin_file it runs the embedded demo, configs/demo_pretrain.gin.

Multi-process: `--multiprocess` (or SLURM with several tasks) calls
`jax.distributed.initialize()`; `--coordinator_address=127.0.0.1:1234 --process_count=2
--process_index=0` starts one process of a run by hand.
"""
from __future__ import annotations

from typing import Optional, Sequence

from t5lite.config import command, flags, registry

DEMO_GIN_FILE = "configs/demo_pretrain.gin"


def main(argv: Optional[Sequence[str]] = None) -> int:
    return command.run_model_command(
        argv, flags.entry_parser(flags.summary(__doc__)),
        lambda model: registry.train(model=model),
        default_gin_file=DEMO_GIN_FILE, default_what="the demo")


if __name__ == "__main__":
    command.run_main(main)
