"""`python -m t5lite.train` on real SeqIO tasks: Pile-style jsonl through span corruption,
the data position in the checkpoint, a vocabulary larger than the model's embedding
refused in one line, text files, a run moved between one and two processes, and a run
extended and preempted on the demo recipe's data.

The one-process runs of all but the two-process test go through `train.main` one after
another in one interpreter (the `one_process_runs` fixture, th.run_mains): TensorFlow,
SeqIO and the tasks load once, not once a test (measured: a Pile run's first ~18 CPU s
in an interpreter, each next one's ~6). The command's own subprocesses: the SIGTERM
test's and the two-process test's."""
import json
import re
import shutil

import numpy as np
import pytest

import train_helpers as th
from data_helpers import vocabulary
from t5lite.data.files import demo_corpus

# The demo's model (configs/demo_model.gin): tiny T5 with float32 activations and a
# 512-entry vocabulary, which holds these tests' 400 ids, cut to one layer a side. Tiny
# T5's 32128 entries and second layers would be most of each step's, compile's and
# checkpoint's cost, for nothing these tests look at (the data stream and its position);
# float32, which the two-process test needs, gives every one-process run of the Pile
# and text tasks here one train step to compile.
MODEL = "--gin_file=demo_model.gin"
ONE_LAYER = ("--gin.T5Config.num_encoder_layers=1", "--gin.T5Config.num_decoder_layers=1")


def _pile(tmp_path):
    text = demo_corpus.write_text(str(tmp_path / "corpus.txt"), lines=200, seed=3)
    (tmp_path / "pile" / "train").mkdir(parents=True, exist_ok=True)
    lines = [line.strip() for line in open(text)]
    with open(tmp_path / "pile" / "train" / "00.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps({"text": line, "meta": {"pile_set_name": "t"}}) + "\n")
    with open(tmp_path / "pile" / "val.jsonl", "w") as f:  # the validation split
        for line in lines[:12]:
            f.write(json.dumps({"text": line[::-1], "meta": {"pile_set_name": "t"}}) + "\n")
    return tmp_path / "pile"


def _cmd(tmp_path, vocab, *extra):
    return [th.sys.executable, "-m", "t5lite.train", MODEL, *ONE_LAYER,
            "--gin_file=runs/pretrain.gin",
            '--gin.MIXTURE_OR_TASK_NAME="pile_span_corruption"',
            f'--gin.MODEL_DIR="{tmp_path / "run"}"', "--gin.TRAIN_STEPS=4",
            "--gin.BATCH_SIZE=4", "--gin.LOG_PERIOD=2",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
            f'--gin.PILE_DIR="{_pile(tmp_path)}"', f'--gin.VOCABULARY_PATH="{vocab}"', *extra]


def _pile_life(tmp_path, vocabulary_path):
    """The runs of the Pile test's run, with th.Between steps that change its files (and
    check that nothing saved changed) between them."""
    vocab = tmp_path / "spm.model"
    shutil.copy(vocabulary_path, vocab)
    pile = _pile(tmp_path) / "train"
    checkpoints, first_run = tmp_path / "run" / "checkpoints", tmp_path / "step_4"
    other = demo_corpus.write_text(str(tmp_path / "other.txt"), lines=800, seed=11)
    shutil.copy(pile / "00.jsonl", tmp_path / "01.jsonl")

    def saved_steps(*steps):  # nothing saved changed: the complete steps are still these
        return th.Between(f"import os; assert sorted(int(p) for p in "
                          f"os.listdir({str(checkpoints)!r}) if p.isdigit()) == {list(steps)!r}")

    def argv(*extra):
        return _cmd(tmp_path, vocab, *extra)[3:]

    return [
        argv(),
        saved_steps(4),
        th.Between(  # step 4 as the first run left it (a later run's retention drops it)
            f"import shutil; shutil.copytree({str(checkpoints / '4')!r}, {str(first_run)!r})"),
        argv("--gin.TRAIN_STEPS=6", "--gin.BATCH_SIZE=8"),  # would leave the stream
        saved_steps(4),
        th.Between(  # another vocabulary at the same path
            f"import shutil; from t5lite.data.files import vocab_training; "
            f"shutil.copy({str(vocab)!r}, {str(tmp_path / 'spm.first')!r}); "
            f"vocab_training.train_vocabulary([{other!r}], {str(vocab)!r}, 300)"),
        argv("--gin.TRAIN_STEPS=6"),
        saved_steps(4),
        th.Between(  # the run's vocabulary back, and one data file more
            f"import shutil; shutil.copy({str(tmp_path / 'spm.first')!r}, {str(vocab)!r}); "
            f"shutil.copy({str(tmp_path / '01.jsonl')!r}, {str(pile / '01.jsonl')!r})"),
        argv("--gin.TRAIN_STEPS=6"),
        saved_steps(4),
        th.Between(f"import os; os.unlink({str(pile / '01.jsonl')!r})"),
        argv("--gin.TRAIN_STEPS=6"),  # the unchanged command continues the saved stream
        saved_steps(4, 6),
        th.Between(  # changed inputs on purpose
            f"import shutil; shutil.copy({str(tmp_path / '01.jsonl')!r}, "
            f"{str(pile / '01.jsonl')!r})"),
        argv("--gin.TRAIN_STEPS=8", "--gin.ALLOW_CHANGED_INPUTS=True"),
    ]


def _text_files(tmp_path):
    """The demo corpus's lines as a Parquet file of 16-row groups and a C4-style json.gz."""
    import gzip
    import pyarrow as pa
    import pyarrow.parquet as pq
    text = demo_corpus.write_text(str(tmp_path / "corpus.txt"), lines=200, seed=5)
    docs = [{"text": line.strip(), "url": f"https://example.com/{i}"}
            for i, line in enumerate(open(text)) if line.strip()]
    half = len(docs) // 2
    pq.write_table(pa.Table.from_pylist(docs[:half]), tmp_path / "fineweb-00.parquet",
                   row_group_size=16)
    (tmp_path / "c4-train.00000-of-00001.json.gz").write_bytes(gzip.compress(
        "".join(json.dumps(d) + "\n" for d in docs[half:]).encode()))
    return [str(tmp_path / "fineweb-00.parquet"),
            str(tmp_path / "c4-train.00000-of-00001.json.gz")]


def _text_argv(tmp_path, files, vocab, name, steps, *extra):
    return [MODEL, *ONE_LAYER, "--gin_file=runs/pretrain.gin",
            '--gin.MIXTURE_OR_TASK_NAME="text_span_corruption"',
            f"--gin.TEXT_FILES={files!r}", f'--gin.VOCABULARY_PATH="{vocab}"',
            f'--gin.MODEL_DIR="{tmp_path / name}"', f"--gin.TRAIN_STEPS={steps}",
            "--gin.BATCH_SIZE=4", "--gin.LOG_PERIOD=2", "--gin.CHECKPOINT_PERIOD=2",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}", *extra]


def _text_runs(tmp_path, vocab):
    """The text test's runs: stopped at 4 and run on to 8; 8 in one go, validated on the
    json.gz file; validation asked for without TEXT_VALIDATION_FILES."""
    files = _text_files(tmp_path)
    held_out = [f for f in files if f.endswith(".json.gz")]
    validated = ("--gin.EVAL_PERIOD=4", "--gin.EVAL_STEPS=1",
                 f"--gin.TEXT_VALIDATION_FILES={held_out!r}")
    return [_text_argv(tmp_path, files, vocab, "run", 4),
            _text_argv(tmp_path, files, vocab, "run", 8),
            _text_argv(tmp_path, files, vocab, "whole", 8, *validated),
            _text_argv(tmp_path, files, vocab, "unheld", 2, "--gin.EVAL_PERIOD=2")]


# -------------------------------------------- a preempted or extended run resumes exactly
RESUME_STEPS, FINISHED_AT = 40, 6


def _resume_cmd(tmp_path, vocab, model_dir, steps, *extra):
    """The demo recipe on the demo's Pile-style data (two one-frame .jsonl.zst shards of
    200 documents), as the issue that found the bug ran it."""
    pile = tmp_path.parent / "demo_pile"
    if not pile.exists():
        demo_corpus.write_pile(str(pile), docs_per_file=200, eval_docs=2)
    return [th.sys.executable, "-m", "t5lite.train", "--gin_file=demo_pretrain.gin",
            *ONE_LAYER, "--gin.DEMO_DATA_DIR=None", f'--gin.VOCABULARY_PATH="{vocab}"',
            f'--gin.PILE_DIR="{pile}"', f'--gin.MODEL_DIR="{model_dir}"',
            "--gin.BATCH_SIZE=8", "--gin.CHECKPOINT_PERIOD=2", "--gin.LOG_PERIOD=1",
            f"--gin.TRAIN_STEPS={steps}", *extra]


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory):
    """The one-process runs of the tests below, one after another in one interpreter
    (th.run_mains), the Pile test's first, so that the warnings it would print are its
    own: {test: (its directory, [a CompletedProcess a run])}. The tests: "pile" (a run's
    life on Pile jsonl), "text" (text files), "small_model" (a model's vocabulary smaller
    than the task's), "demo" (the demo recipe: RESUME_STEPS steps uninterrupted, saved
    only at the end, and a run finished at FINISHED_AT that saves every 2 steps, as the
    SIGTERM test's continuation of it does: saving must not change what trains)."""
    vocab = vocabulary(tmp_path_factory)
    dirs = {test: tmp_path_factory.mktemp(test) for test in ("pile", "text", "small_model",
                                                              "demo")}
    demo = dirs["demo"]
    plans = {
        "pile": _pile_life(dirs["pile"], vocab),
        "text": _text_runs(dirs["text"], vocab),
        "small_model": [_cmd(dirs["small_model"], vocab, "--gin.T5Config.vocab_size=128")[3:]],
        "demo": [_resume_cmd(demo, vocab, demo / "uninterrupted", RESUME_STEPS,
                             f"--gin.CHECKPOINT_PERIOD={RESUME_STEPS}")[3:],
                 _resume_cmd(demo, vocab, demo / "run", FINISHED_AT)[3:]],
    }
    runs = iter(th.run_mains([item for plan in plans.values() for item in plan],
                             cwd=dirs["pile"], extra_env={"PYTHONWARNINGS": "default"},
                             timeout=900))
    return {test: (dirs[test], [next(runs) for item in plan if not isinstance(item, th.Between)])
            for test, plan in plans.items()}


def test_pile_pretraining_saves_its_data_position_and_a_resume_keeps_to_its_stream(
        one_process_runs):
    """One run's life on Pile jsonl: trained to step 4 with its data position saved; a
    resume under another batch size, another vocabulary at the same path, or one data
    file more each refuses in one line naming both sides (exit 2, nothing saved changes);
    the unchanged command continues from the saved iterator state; ALLOW_CHANGED_INPUTS=
    True resumes with changed inputs on purpose, saying so. The six runs one after another
    in the fixture's interpreter, the files changed between them there (th.Between)."""
    tmp_path, (first, changed, swapped, added, again, allowed) = one_process_runs["pile"]
    vocab, pile, first_run = tmp_path / "spm.model", tmp_path / "pile" / "train", \
        tmp_path / "step_4"
    assert first.returncode == 0, th.describe(first)
    assert "Warning" not in first.stderr, th.describe(first)  # none, deprecations included
    saved = json.loads((first_run / "data" / "metadata").read_text())
    assert saved["position"] == 4 and saved["task"] == "pile_span_corruption"
    assert saved["inputs"]["vocabulary"]["path"] == str(vocab)
    assert list(saved["inputs"]["files"]) == [str(pile / "00.jsonl")]
    iterator = first_run / "data_iterator"
    assert (iterator / "shard_00000-of-00001.process_00000").stat().st_size > 0
    losses = th.scalars(tmp_path / "run")["loss_per_token"]  # LOG_PERIOD 2: the four runs
    assert [s for s, _ in losses] == [2, 4, 6, 8] and all(0 < v < 20 for _, v in losses)

    th.assert_one_error(changed, "batch_size 4 -> 8")
    line = th.assert_one_error(swapped, f"the vocabulary is {vocab} (sha256 ",
                               f"but the checkpoint was trained with {vocab} (sha256 ",
                               "ALLOW_CHANGED_INPUTS=True")
    assert swapped.returncode == 2
    old, new = re.findall(r"sha256 (\w+)", line)
    assert old != new
    th.assert_one_error(added, "data files are not the ones the checkpoint was trained on",
                        f"1 added ({pile / '01.jsonl'})", "ALLOW_CHANGED_INPUTS=True")

    assert again.returncode == 0, th.describe(again)
    assert "data: continuing at batch 4 from the saved iterator state" in again.stderr

    assert allowed.returncode == 0, th.describe(allowed)
    assert "ALLOW_CHANGED_INPUTS: resuming with them" in allowed.stderr
    assert "start: resume:6 at step 6" in allowed.stderr
    assert th.complete_steps(tmp_path / "run")[-1] == 8


def test_vocabulary_larger_than_the_model_is_one_line(one_process_runs):
    _, (proc,) = one_process_runs["small_model"]
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "vocabulary has 400 ids" in lines[0], th.describe(proc)
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_run_moves_between_one_and_two_processes_on_one_data_stream(tmp_path,
                                                                       tmp_path_factory):
    """One process with DATA_SHARDS=2 and two processes (gloo on 127.0.0.1; 2 shards by
    default) train on one stream. Two processes to step 4, then one: steps 5-8 train on
    the uninterrupted run's batches (the same target tokens each step, the loss within
    float reordering of the gradient's sum over devices); one process to step 4, then two:
    the same. Each process restores its shards from the states the other count saved.
    The validation loss (EVAL_PERIOD=4) agrees as closely, on one process and two,
    resumed or not, at the same steps."""
    vocab = vocabulary(tmp_path_factory)
    common = ("--gin.CHECKPOINT_PERIOD=4", "--gin.KEEP_CHECKPOINTS=None",
              "--gin.ACTIVATION_DTYPE='float32'", "--gin.EVAL_PERIOD=4",
              "--gin.EVAL_STEPS=1")

    def one(model_dir, steps):
        return _cmd(tmp_path, vocab, f'--gin.MODEL_DIR="{model_dir}"',
                    f"--gin.TRAIN_STEPS={steps}", "--gin.DATA_SHARDS=2", *common)[3:]

    def pair(model_dir, steps, tag):
        port, procs = th.free_port(), []
        try:
            for i in range(2):
                cmd = _cmd(tmp_path, vocab, f'--gin.MODEL_DIR="{model_dir}"',
                           f"--gin.TRAIN_STEPS={steps}", *common,
                           "--gin.ICI_MESH_SHAPE=[1,1,1]", "--gin.DCN_MESH_SHAPE=[2,1,1]",
                           f"--coordinator_address=127.0.0.1:{port}", "--process_count=2",
                           f"--process_index={i}")
                procs.append(th.start(cmd, tmp_path / f"{tag}{i}.log", devices=1))
            rcs = [th.finish(p) for p in procs]
        finally:
            for p in procs:
                th.kill(p)
        logs = [th.read_log(tmp_path / f"{tag}{i}.log") for i in range(2)]
        assert rcs == [0, 0], "\n".join(th.tail(t) for t in logs)
        return logs

    pair(tmp_path / "shrunk", 4, "shrunk_first")
    item = tmp_path / "shrunk" / "checkpoints" / "4" / "data_iterator"
    assert sorted(p.name for p in item.glob("shard_*")) == [  # a shard each, with its SHA-256
        "shard_00000-of-00002.process_00000", "shard_00000-of-00002.process_00000.sha256",
        "shard_00001-of-00002.process_00001", "shard_00001-of-00002.process_00001.sha256"]
    # the two one-process runs (the uninterrupted one, the shrunk one's second half) one
    # after the other in one interpreter (th.run_mains)
    ran = th.run_mains([one(tmp_path / "whole", 8), one(tmp_path / "shrunk", 8)],
                       cwd=tmp_path)
    for proc in ran:
        assert proc.returncode == 0, th.describe(proc)
    assert "data: continuing at batch 4 from the saved iterator state of 2 shard(s)" in \
        ran[1].stderr, ran[1].stderr[-3000:]
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "4",  # one process's step 4
                    tmp_path / "grown" / "checkpoints" / "4")
    shutil.copy(tmp_path / "whole" / "config.gin", tmp_path / "grown" / "config.gin")
    for log in pair(tmp_path / "grown", 8, "grown"):
        assert "data: continuing at batch 4 from the saved iterator state of 1 shard(s)" in \
            log, log[-3000:]
    whole = th.scalars(tmp_path / "whole")
    for moved in ("shrunk", "grown"):
        after = th.scalars(tmp_path / moved)
        assert [v for s, v in whole["weight_sum"] if s > 4] == \
            [v for s, v in after["weight_sum"] if s > 4], moved  # the same batches
        np.testing.assert_allclose([v for s, v in after["loss"] if s > 4],
                                   [v for s, v in whole["loss"] if s > 4], rtol=1e-5,
                                   err_msg=moved)
    val = {run: th.scalars(tmp_path / run, "training_eval/pile_span_corruption")
           for run in ("whole", "shrunk", "grown")}
    assert [s for s, _ in val["whole"]["loss_per_token"]] == [4, 8]
    assert [s for s, _ in val["shrunk"]["loss_per_token"]] == [4, 8]  # two, then one
    assert [s for s, _ in val["grown"]["loss_per_token"]] == [8]  # from the whole's step 4
    for run in ("shrunk", "grown"):
        whole_at = dict(val["whole"]["loss_per_token"])
        for step, value in val[run]["loss_per_token"]:
            assert value == pytest.approx(whole_at[step], rel=1e-5), (run, step)
        assert val[run]["tokens"][-1][1] == val["whole"]["tokens"][-1][1] > 0


def _check_resumed(log, resumed_at, stopped_at):
    """A run resumed at `resumed_at` on the saved iterator state, to `stopped_at`."""
    assert "Traceback" not in log and not th.error_lines(log), th.tail(log)
    assert f"data: continuing at batch {resumed_at} from the saved iterator state" in log, \
        th.tail(log)
    assert th.logged_steps(log) == list(range(resumed_at + 1, stopped_at + 1)), th.tail(log)


def test_a_finished_run_extended_then_sigterm_then_the_same_command_matches_an_uninterrupted_one(
        tmp_path, tmp_path_factory, one_process_runs):
    """The two ways users meet a resume on real data (the demo recipe on its Pile-style
    .jsonl.zst shards), one after the other on one run: a run finished at FINISHED_AT is
    extended by raising TRAIN_STEPS to RESUME_STEPS; that run is stopped by SIGTERM at
    step 8 or later and the same command run again. Its final state is the uninterrupted
    run's (the fixture's), bit for bit. (Two tests before, each with its own run.)"""
    demo, (uninterrupted, finished) = one_process_runs["demo"]
    assert uninterrupted.returncode == 0, th.describe(uninterrupted)
    assert finished.returncode == 0, th.describe(finished)
    assert th.complete_steps(demo / "run")[-1] == FINISHED_AT
    log = tmp_path / "extended.log"
    cmd = _resume_cmd(demo, vocabulary(tmp_path_factory), demo / "run", RESUME_STEPS)
    proc = th.start(cmd, log)
    try:
        th.wait_for(lambda: max(th.logged_steps(th.read_log(log)) or [0]) >= 8, "step 8",
                    proc=proc, log_path=log)
        proc.send_signal(th.signal.SIGTERM)
        assert th.finish(proc) == 0, th.tail(th.read_log(log))
    finally:
        th.kill(proc)
    m = re.search(r"SIGTERM: saved step (\d+); exiting", th.read_log(log))
    assert m and 8 <= int(m.group(1)) < RESUME_STEPS, th.tail(th.read_log(log))
    stopped = int(m.group(1))
    _check_resumed(th.read_log(log), FINISHED_AT, stopped)

    again = th.run(cmd)
    assert again.returncode == 0, th.describe(again)
    _check_resumed(again.stderr, stopped, RESUME_STEPS)
    th.assert_trees_equal(th.load_state(demo / "uninterrupted", RESUME_STEPS),
                          th.load_state(demo / "run", RESUME_STEPS),
                          "the resumed run's final state")


def test_pretrains_on_text_files_and_resumes_as_if_uninterrupted(one_process_runs):
    """text_span_corruption on a list of text files (Parquet and json.gz, the gin list as
    a user writes it): stopped at step 4 and run on to 8, the parameters equal an
    uninterrupted 8-step run's. Its validation loss reads TEXT_VALIDATION_FILES (here the
    json.gz file); without them, EVAL_PERIOD is refused in one line naming them. (The
    runs: the fixture's.)"""
    tmp_path, runs = one_process_runs["text"]
    for proc in runs[:3]:
        assert proc.returncode == 0, th.describe(proc)
    assert "start: resume:4 at step 4" in runs[1].stderr
    th.assert_trees_equal(th.load_state(tmp_path / "run", 8)["params"],
                          th.load_state(tmp_path / "whole", 8)["params"], "params")
    val = th.scalars(tmp_path / "whole", "training_eval/text_span_corruption")
    assert [s for s, _ in val["loss_per_token"]] == [4, 8]
    assert [v for _, v in val["examples"]] == [4, 4]
    th.assert_one_error(runs[3], "TEXT_VALIDATION_FILES", "EVAL_STEPS=None")
    assert not th.complete_steps(tmp_path / "unheld")
