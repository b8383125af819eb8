"""Bad settings through `python -m t5lite.train` (hardening): each ends in one `error:`
line and a non-zero exit before anything is written, a finished run says so, a run never
saves non-finite parameters, and a failed restart leaves the run's record (config.gin,
its checkpoints) as it was."""
import numpy as np
import pytest

import train_helpers as th


@pytest.mark.parametrize("flag,needles", [
    ("--gin.TRAIN_STEPS=2.5", ["TRAIN_STEPS must be a positive integer", "2.5"]),
    ("--gin.TRAIN_STEPS=0", ["TRAIN_STEPS must be a positive integer", "0"]),
    ("--gin.TRAIN_STEPS=-1", ["TRAIN_STEPS must be a positive integer"]),
    ("--gin.BATCH_SIZE=0", ["BATCH_SIZE must be a positive integer"]),
    ('--gin.BATCH_SIZE="8"', ["BATCH_SIZE must be a positive integer", "'8'"]),
    ("--gin.NUM_MICROBATCHES=0", ["NUM_MICROBATCHES must be a positive integer"]),
    ("--gin.ICI_MESH_SHAPE=[4,1", ["gin syntax error", "unclosed bracket", "ICI_MESH_SHAPE"]),
    ("--gin.MODEL_DIR=/tmp/x", ["Unable to parse value", "needs quotes", "MODEL_DIR"]),
    ("--gin.RANDOM_SEED=-1", ["RANDOM_SEED must be an integer >= 0, or None", "-1"]),
    ("--gin.INITIAL_CHECKPOINT_STATE='optimizer'", ["INITIAL_CHECKPOINT_STATE='optimizer'",
                                                    "'params'", "'train_state'"]),
    ("--gin.adafactor.learning_rate=1e999",
     ["adafactor.learning_rate must be a finite number", "got inf"]),
    ("--gin.TASK_FEATURE_LENGTHS={'inputs': 'x', 'targets': 8}",
     ["TASK_FEATURE_LENGTHS['inputs'] must be a positive integer", "'x'"]),
    ("--gin.TASK_FEATURE_LENGTHS={'input': 8, 'targets': 8}",
     ["TASK_FEATURE_LENGTHS has the key 'input'", "'inputs' and 'targets'"]),
    ("--gin.TASK_FEATURE_LENGTHS=[8, 8]", ["TASK_FEATURE_LENGTHS must be a dict like"]),
])
def test_bad_settings_are_one_line(tmp_path, flag, needles):
    proc = th.run_train(tmp_path / "run", flag, steps=2)
    line = th.assert_one_error(proc, *needles)
    assert proc.returncode == 2, line
    assert not (tmp_path / "run").exists()


def test_model_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    for model_dir, what in [(tmp_path / "afile", "MODEL_DIR is a file"),
                            (tmp_path / "afile" / "sub", "MODEL_DIR's parent")]:
        proc = th.run_train(model_dir, steps=2)
        th.assert_one_error(proc, what, "not a directory")
    assert (tmp_path / "afile").read_text() == "not a directory"


def test_finished_run_says_it_is_complete(tmp_path):
    model_dir = tmp_path / "run"
    assert th.run_train(model_dir, steps=2).returncode == 0
    again = th.run_train(model_dir, steps=2)
    assert again.returncode == 0, th.describe(again)
    assert "already complete" in again.stderr and "TRAIN_STEPS=2" in again.stderr
    assert th.logged_steps(again.stderr) == []


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_infinite_parameters_are_never_saved_and_a_failed_restart_keeps_the_record(tmp_path):
    """A good run keeps one checkpoint (KEEP_CHECKPOINTS=1). Its restart at a learning rate
    that makes the updated parameters infinite while the loss it saw was finite: it stops
    in one line, saves nothing, retention keeps the good checkpoint, and config.gin still
    describes the good run."""
    model_dir = tmp_path / "run"
    good = th.run_train(model_dir, "--gin.CHECKPOINT_PERIOD=1", "--gin.KEEP_CHECKPOINTS=1",
                        steps=2)
    assert good.returncode == 0, th.describe(good)
    config = (model_dir / "config.gin").read_text()
    assert th.complete_steps(model_dir) == [2]
    bad = th.run_train(model_dir, "--gin.CHECKPOINT_PERIOD=1", "--gin.KEEP_CHECKPOINTS=1",
                       "--gin.adafactor.learning_rate=1e38", "--gin.LOG_PERIOD=1", steps=6)
    line = th.assert_one_error(bad, "not finite at step 3", "last good checkpoint is step 2")
    assert bad.returncode == 1, line
    assert th.complete_steps(model_dir) == [2]
    state = th.load_state(model_dir, 2)
    assert all(np.isfinite(v).all() for v in th.flat(state["params"]).values())
    assert (model_dir / "config.gin").read_text() == config   # 1e38 is not recorded
    # and a successful restart does record its own configuration
    ok = th.run_train(model_dir, "--gin.CHECKPOINT_PERIOD=1", "--gin.KEEP_CHECKPOINTS=1",
                      "--gin.LOG_PERIOD=1", "--gin.DROPOUT_RATE=0.0125", steps=3)
    assert ok.returncode == 0, th.describe(ok)
    assert "0.0125" in (model_dir / "config.gin").read_text()


def test_vocabulary_mistakes_are_one_line(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    proc = th.run([th.sys.executable, "-m", "t5lite.vocab", f"--input={tmp_path / 'empty.txt'}",
                   "--vocab_size=100", f"--output={tmp_path / 'v.model'}"])
    th.assert_one_error(proc, "no text to train a vocabulary on", "empty.txt")
    assert "sentences_" not in proc.stderr and not (tmp_path / "v.model").exists()
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(bytes(range(256)) * 20)
    pile = tmp_path / "pile" / "train"
    pile.mkdir(parents=True)
    (pile / "00.jsonl").write_text('{"text": "a few words of text"}\n' * 20)
    proc = th.run_train(tmp_path / "run", '--gin.MIXTURE_OR_TASK_NAME="pile_span_corruption"',
                        f'--gin.PILE_DIR="{tmp_path / "pile"}"',
                        f'--gin.VOCABULARY_PATH="{garbage}"', steps=2)
    th.assert_one_error(proc, "garbage.model", "is not a SentencePiece model", "VOCABULARY_PATH")
