"""Bad settings through `python -m t5lite.train` (hardening): each ends in one `error:`
line and a non-zero exit before anything is written, a finished run says so, a run never
saves non-finite parameters, and a failed restart leaves the run's record (config.gin,
its checkpoints) as it was.

The training runs go through `train.main` in one interpreter (th.run_mains): the file's
quick cases in one (the `runs` fixture), the restart cases in another; the runs that
train use the tiny T5 cut to one layer a side and a 512-entry vocabulary. The command's
own subprocesses are the CLI tests' (tests/test_train_cli.py: a loss that is not finite
too), and t5lite.vocab's here."""
import numpy as np
import pytest

import model_helpers as mh
import train_helpers as th

SMALL_MODEL = tuple(mh.small_flags())


BAD_SETTINGS = [
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
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The file's quick training runs, in one interpreter: {case: (MODEL_DIR, the run)}
    for the BAD_SETTINGS (("bad", i)), the MODEL_DIR that is a file or under one
    ("afile", "sub"), a finished run run again ("first", "again"), the WRONG_VALUES
    (("wrong", macro, value)) and a garbage vocabulary ("garbage_vocab")."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "afile").write_text("not a directory")
    garbage = root / "garbage.model"
    garbage.write_bytes(bytes(range(256)) * 20)
    pile = root / "pile" / "train"
    pile.mkdir(parents=True)
    (pile / "00.jsonl").write_text('{"text": "a few words of text"}\n' * 20)
    cases = {}  # case: (MODEL_DIR, flags)
    for i, (flag, _) in enumerate(BAD_SETTINGS):
        cases[("bad", i)] = (root / f"bad{i}", [flag])
    cases["afile"] = (root / "afile", [])
    cases["sub"] = (root / "afile" / "sub", [])
    cases["first"] = cases["again"] = (root / "finished", [])
    for i, (macro, value) in enumerate((m, v) for m, vs in WRONG_VALUES.items() for v in vs):
        cases[("wrong", macro, value)] = (root / f"wrong{i}", [f"--gin.{macro}={value}"])
    cases["garbage_vocab"] = (root / "garbage_run", [
        '--gin.MIXTURE_OR_TASK_NAME="pile_span_corruption"', f'--gin.PILE_DIR="{root / "pile"}"',
        f'--gin.VOCABULARY_PATH="{garbage}"'])
    procs = th.run_mains([th.train_command(model_dir, *SMALL_MODEL, *flags, steps=2)[3:]
                          for model_dir, flags in cases.values()])
    return {case: (model_dir, proc) for (case, (model_dir, _)), proc in zip(cases.items(), procs)}


def test_bad_settings_are_one_line(runs):
    for i, (flag, needles) in enumerate(BAD_SETTINGS):
        model_dir, proc = runs[("bad", i)]
        line = th.assert_one_error(proc, *needles)
        assert proc.returncode == 2, (flag, line)
        assert not model_dir.exists(), flag


def test_model_dir_that_is_a_file_is_one_line(runs):
    for case, what in (("afile", "MODEL_DIR is a file"), ("sub", "MODEL_DIR's parent")):
        model_dir, proc = runs[case]
        th.assert_one_error(proc, what, "not a directory")
    assert runs["afile"][0].read_text() == "not a directory"


def test_finished_run_says_it_is_complete(runs):
    (_, first), (_, again) = runs["first"], runs["again"]
    assert first.returncode == 0, th.describe(first)
    assert again.returncode == 0, th.describe(again)
    assert "already complete" in again.stderr and "TRAIN_STEPS=2" in again.stderr
    assert th.logged_steps(again.stderr) == []


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_infinite_parameters_are_never_saved_and_a_failed_restart_keeps_the_record(tmp_path):
    """A good run keeps one checkpoint (KEEP_CHECKPOINTS=1). Its restart at a learning rate
    that makes the updated parameters infinite while the loss it saw was finite: it stops
    in one line, saves nothing, retention keeps the good checkpoint, and config.gin still
    describes the good run."""
    model_dir, good_copy, bad_copy = (tmp_path / name for name in ("run", "good", "bad"))
    keep = ("--gin.CHECKPOINT_PERIOD=1", "--gin.KEEP_CHECKPOINTS=1")

    def copy_to(dst):  # MODEL_DIR as that run left it
        return th.Between(f"import shutil; shutil.copytree({str(model_dir)!r}, {str(dst)!r})")

    good, bad, ok = th.run_mains([
        th.train_command(model_dir, *SMALL_MODEL, *keep, steps=2)[3:], copy_to(good_copy),
        th.train_command(model_dir, *SMALL_MODEL, *keep, "--gin.adafactor.learning_rate=1e38",
                         "--gin.LOG_PERIOD=1", steps=6)[3:], copy_to(bad_copy),
        # and a successful restart does record its own configuration
        th.train_command(model_dir, *SMALL_MODEL, *keep, "--gin.LOG_PERIOD=1",
                         "--gin.DROPOUT_RATE=0.0125", steps=3)[3:]])
    assert good.returncode == 0, th.describe(good)
    config = (good_copy / "config.gin").read_text()
    assert th.complete_steps(good_copy) == [2]
    line = th.assert_one_error(bad, "not finite at step 3", "last saved checkpoint is step 2")
    assert bad.returncode == 1, line
    assert th.complete_steps(bad_copy) == [2]
    state = th.load_state(bad_copy, 2)
    assert all(np.isfinite(v).all() for v in th.flat(state["params"]).values())
    assert (bad_copy / "config.gin").read_text() == config   # 1e38 is not recorded
    assert ok.returncode == 0, th.describe(ok)
    assert "0.0125" in (model_dir / "config.gin").read_text()


def test_vocabulary_mistakes_are_one_line(runs, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    proc = th.run([th.sys.executable, "-m", "t5lite.vocab", f"--input={tmp_path / 'empty.txt'}",
                   "--vocab_size=100", f"--output={tmp_path / 'v.model'}"])
    th.assert_one_error(proc, "no text to train a vocabulary on", "empty.txt")
    assert "sentences_" not in proc.stderr and not (tmp_path / "v.model").exists()
    th.assert_one_error(runs["garbage_vocab"][1], "garbage.model",
                        "is not a SentencePiece model", "VOCABULARY_PATH")


# Every macro of a training run, given a value of the wrong type or out of its range.
WRONG_VALUES = {
    "ACTIVATION_DTYPE": ["'bf16'", "3"], "ALLOW_CHANGED_INPUTS": ["'yes'"],
    "ATTENTION_IMPL": ["'flash'", "3"], "BATCH_SIZE": ["None", "[8]"],
    "CHECKPOINT_PERIOD": ["'x'", "0", "2.5"], "DCN_MESH_SHAPE": ["'x'", "[1,1]", "[1,'a',1]"],
    "DROPOUT_RATE": ["'x'", "1.5", "-0.1"], "EVAL_BATCH_SIZE": ["'x'", "0"],
    "EVAL_NUM_EXAMPLES": ["'x'", "0"], "EVAL_PERIOD": ["'x'", "-1"], "EVAL_SPLIT": ["3"],
    "EVAL_STEPS": ["'x'", "0"],
    "EXTRA_IDS": ["'x'", "-1"], "FP8": ["'x'"], "FP8_BACKEND": ["'x'"], "FP8_RECIPE": ["'x'"],
    "FUSE_QKV": ["'x'"],
    "ICI_MESH_SHAPE": ["'x'", "[1,1]", "[0,1,1]", "[1.5,1,1]", "[1,1,1,1,1,1,1]"],
    "INITIAL_CHECKPOINT_PATH": ["3", "'/nonexistent'"], "INJECT_STALL": ["'x'", "3"],
    "KEEP_CHECKPOINTS": ["'x'", "0", "-1"], "LABEL_SMOOTHING": ["'x'", "1.5", "-1"],
    "LOG_PERIOD": ["'x'", "0"], "LORA_ALPHA": ["'x'", "-1"],
    "LORA_DROPOUT": ["'x'", "1.0", "-0.1"], "LORA_RANK": ["'x'", "-1", "1.5"],
    "LORA_TARGETS": ["3", "'query'", "['nope']"], "LOSS_NORMALIZING_FACTOR": ["'x'", "-1", "[1]"],
    "MIXTURE_OR_TASK_NAME": ["3", "'nope'"], "MODEL_DIR": ["3", "None"],
    "NUM_MICROBATCHES": ["'x'", "3"], "PACK": ["'x'", "2"],
    "PIPELINE_MICROBATCHES": ["'x'", "0", "4"], "PIPELINE_REPEATS": ["'x'", "0", "2"],
    "PARTITION_RULES": ["'x'", "[('embed',)]", "[3]", "[('embed', 'rows')]"],
    "RANDOM_SEED": ["'x'", "1.5"], "REMAT_POLICY": ["'x'", "3"], "SCAN_LAYERS": ["'x'"],
    "STEP_WATCHDOG": ["'x'"], "TEXT_FIELD": ["3"], "TEXT_FILES": ["3", "[3]"],
    "TRAIN_STEPS": ["'x'", "None"], "TRANSPOSE_BS": ["'x'"], "VOCABULARY_PATH": ["3"],
    "WATCHDOG_FACTOR": ["'x'", "0", "-1"], "WATCHDOG_FLOOR_SECONDS": ["'x'", "-1"],
    "WATCHDOG_SAVE_SECONDS": ["'x'", "-1"], "WATCHDOG_WARMUP_STEPS": ["'x'", "-1"],
    "Z_LOSS": ["'x'", "-1"],
}

def test_every_run_macro_wrong_in_type_or_range_is_one_line(runs):
    """Each case ends with one `error:` line, status 2 (1 for the run errors: no such
    checkpoint, a batch that does not split into the microbatches), and no traceback or
    stray exception."""
    bad = []
    for (_, macro, value), (_, proc) in ((c, r) for c, r in runs.items()
                                         if isinstance(c, tuple) and c[0] == "wrong"):
        status, err = proc.returncode, proc.stderr
        lines = th.error_lines(err)
        if status not in (1, 2) or len(lines) != 1 or "Traceback" in err or macro not in lines[0] \
                and macro not in ("INITIAL_CHECKPOINT_PATH", "MIXTURE_OR_TASK_NAME"):
            bad.append((macro, value, status, err[-300:]))
    assert not bad, bad
