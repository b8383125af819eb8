"""`t5lite.eval` and `t5lite.infer` on a LoRA checkpoint (tiny LLaMA, MNLI fixture): both
read its base and adapters, merge them (the base network runs), and predict the same;
without the LORA_* settings both take them from the checkpoint (its adapters' shapes, the
LORA_ALPHA its run recorded) and predict the same again; another rank or LORA_ALPHA given
is refused in one line.
Runs call `main(argv)` in this process."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("seqio")
pytest.importorskip("t5")  # registers its gin configurables before any config is locked

from t5lite import eval as eval_module, infer, train  # noqa: E402
from t5lite.data.files import demo_corpus  # noqa: E402

import train_helpers as th  # noqa: E402
from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402

LLAMA_LORA = ["--gin.LORA_RANK=4", "--gin.LORA_TARGETS=['query', 'value', 'out']"]


def _error(err):
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def test_eval_and_infer_run_a_lora_checkpoint_alike(tmp_path, tmp_path_factory, monkeypatch,
                                                    capsys):
    """A LoRA finetune on an MNLI fixture: `t5lite.eval` (the task's split) and
    `t5lite.infer` (the same inputs from a file) read its base and adapters (unmerged)
    and predict the same, with the LORA_* settings repeated or without them; other ones
    are refused in one line."""
    vocab = vocabulary(tmp_path_factory)
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=64, dev=8)
    data_env(monkeypatch, tmp_path, vocab, mnli_dir=tmp_path / "multinli")
    model = [f"--gin_file={th.MODEL_FILES['llama']}", "--gin.DecoderConfig.vocab_size=512",
             "--gin.ACTIVATION_DTYPE='float32'"]
    lengths = "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 10}"
    run, out = tmp_path / "run", tmp_path / "out"
    try:
        assert train.main(model + LLAMA_LORA + [
            "--gin_file=configs/finetune_mnli.gin", f'--gin.MODEL_DIR="{run}"',
            "--gin.INITIAL_CHECKPOINT_PATH=None", lengths, "--gin.BATCH_SIZE=8",
            "--gin.TRAIN_STEPS=4", "--gin.EVAL_PERIOD=None", "--gin.CHECKPOINT_PERIOD=4",
            th.SYNC_CHECKPOINTS, "--gin.train.optimizer=@adamw()",
            "--gin.adamw.learning_rate=1e-2", f'--gin.VOCABULARY_PATH="{vocab}"']) == 0
        shared = [f'--gin.CHECKPOINT_PATH="{run}"', lengths, "--gin.BATCH_SIZE=8",
                  f'--gin.VOCABULARY_PATH="{vocab}"']
        task = ["--gin.MIXTURE_OR_TASK_NAME='mnli'", "--gin.SPLIT='validation_matched'"]
        capsys.readouterr()
        assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + model + task + shared
                                + ["--gin.LORA_RANK=2", "--gin.LORA_TARGETS=['query']",
                                   f'--gin.OUTPUT_DIR="{out / "no"}"']) != 0
        line = _error(capsys.readouterr().err)
        assert "rank 4 on out, query, value" in line and "rank 2 on query" in line, line
        # the adapters were trained with LORA_ALPHA 16 (the default): another is refused
        assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + model + LLAMA_LORA
                                + task + shared + ["--gin.LORA_ALPHA=32.0",
                                                   f'--gin.OUTPUT_DIR="{out / "a"}"']) != 0
        line = _error(capsys.readouterr().err)
        assert "LORA_ALPHA=16" in line and "LORA_ALPHA=32" in line, line
        assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + model + LLAMA_LORA
                                + task + shared + [f'--gin.OUTPUT_DIR="{out / "e"}"']) == 0
        assert ("rank 4 adapters on query, value, out merged into the base for inference"
                in capsys.readouterr().err)
        evaluated = [json.loads(l) for l in
                     (out / "e" / "eval" / "mnli_predictions.jsonl").read_text().splitlines()]
        inputs = tmp_path / "inputs.txt"
        inputs.write_text("".join(r["inputs"] + "\n" for r in evaluated))
        assert infer.main(["--gin_file=configs/runs/infer.gin"] + model + LLAMA_LORA + shared
                          + [f'--gin.OUTPUT_DIR="{out / "i"}"',
                             f'--gin.INPUT_FILE="{inputs}"']) == 0
        inferred = [json.loads(l) for l in
                    (out / "i" / "predictions.jsonl").read_text().splitlines()]
        assert len(evaluated) == 8
        assert [r["prediction"] for r in inferred] == [r["prediction"] for r in evaluated]
        # without the LORA_* settings: the checkpoint's own, and the same predictions
        assert eval_module.main(["--gin_file=configs/runs/eval.gin"] + model + task + shared
                                + [f'--gin.OUTPUT_DIR="{out / "e0"}"']) == 0
        err = capsys.readouterr().err
        assert ("holds LoRA rank 4 adapters on out, query, value (LORA_ALPHA 16 as its run "
                "recorded)" in err), err[-3000:]
        assert infer.main(["--gin_file=configs/runs/infer.gin"] + model + shared
                          + [f'--gin.OUTPUT_DIR="{out / "i0"}"',
                             f'--gin.INPUT_FILE="{inputs}"']) == 0
        for again in (out / "e0" / "eval" / "mnli_predictions.jsonl",
                      out / "i0" / "predictions.jsonl"):
            rows = [json.loads(l) for l in again.read_text().splitlines()]
            assert [r["prediction"] for r in rows] == [r["prediction"] for r in evaluated]
    finally:
        reset_data_settings()
