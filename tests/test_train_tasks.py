"""`python -m t5lite.train` on a real SeqIO task: Pile-style jsonl through span corruption,
the data position in the checkpoint, and a vocabulary larger than the model's embedding
refused in one line."""
import json
import re
import shutil

import numpy as np
import pytest

import train_helpers as th
from data_helpers import vocabulary
from t5lite.data.files import demo_corpus


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
    return [th.sys.executable, "-m", "t5lite.train", "--gin_file=models/t5_1_1/tiny.gin",
            "--gin_file=runs/pretrain.gin",
            '--gin.MIXTURE_OR_TASK_NAME="pile_span_corruption"',
            f'--gin.MODEL_DIR="{tmp_path / "run"}"', "--gin.TRAIN_STEPS=4",
            "--gin.BATCH_SIZE=4", "--gin.LOG_PERIOD=2",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
            f'--gin.PILE_DIR="{_pile(tmp_path)}"', f'--gin.VOCABULARY_PATH="{vocab}"', *extra]


def test_pile_pretraining_saves_its_data_position_and_a_resume_keeps_to_its_stream(
        tmp_path, tmp_path_factory):
    """One run's life on Pile jsonl: trained to step 4 with its data position saved; a
    resume under another batch size, another vocabulary at the same path, or one data
    file more each refuses in one line naming both sides (exit 2, nothing saved changes);
    the unchanged command continues from the saved iterator state; ALLOW_CHANGED_INPUTS=
    True resumes with changed inputs on purpose, saying so. The six runs one after another
    in one interpreter (th.run_mains), the files changed between them there (th.Between);
    the command's own subprocess is test_vocabulary_larger_than_the_model_is_one_line's."""
    vocab = tmp_path / "spm.model"
    shutil.copy(vocabulary(tmp_path_factory), vocab)
    pile = _pile(tmp_path) / "train"
    checkpoints, first_run = tmp_path / "run" / "checkpoints", tmp_path / "step_4"
    other = demo_corpus.write_text(str(tmp_path / "other.txt"), lines=800, seed=11)
    shutil.copy(pile / "00.jsonl", tmp_path / "01.jsonl")

    def saved_steps(*steps):  # nothing saved changed: the complete steps are still these
        return th.Between(f"import os; assert sorted(int(p) for p in os.listdir({str(checkpoints)!r})"
                          f" if p.isdigit()) == {list(steps)!r}")

    def argv(*extra):
        return _cmd(tmp_path, vocab, *extra)[3:]

    first, changed, swapped, added, again, allowed = th.run_mains([
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
            f"import shutil; shutil.copy({str(tmp_path / '01.jsonl')!r}, {str(pile / '01.jsonl')!r})"),
        argv("--gin.TRAIN_STEPS=8", "--gin.ALLOW_CHANGED_INPUTS=True"),
    ], cwd=tmp_path, extra_env={"PYTHONWARNINGS": "default"})

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


def test_vocabulary_larger_than_the_model_is_one_line(tmp_path, tmp_path_factory):
    proc = th.run(_cmd(tmp_path, vocabulary(tmp_path_factory), "--gin.T5Config.vocab_size=128"),
                  cwd=tmp_path)
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


# -------------------------------------------- a preempted or extended run resumes exactly
RESUME_STEPS = 40


def _resume_cmd(tmp_path, vocab, model_dir, steps, *extra):
    """The demo recipe on the demo's Pile-style data (two one-frame .jsonl.zst shards of
    200 documents), as the issue that found the bug ran it."""
    pile = tmp_path.parent / "demo_pile"
    if not pile.exists():
        demo_corpus.write_pile(str(pile), docs_per_file=200, eval_docs=2)
    return [th.sys.executable, "-m", "t5lite.train", "--gin_file=demo_pretrain.gin",
            "--gin.DEMO_DATA_DIR=None", f'--gin.VOCABULARY_PATH="{vocab}"',
            f'--gin.PILE_DIR="{pile}"', f'--gin.MODEL_DIR="{model_dir}"',
            "--gin.BATCH_SIZE=8", "--gin.CHECKPOINT_PERIOD=2", "--gin.LOG_PERIOD=1",
            f"--gin.TRAIN_STEPS={steps}", *extra]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run both resume tests must match: RESUME_STEPS steps in one go, saved only at
    the end (the resumed runs save every 2 steps: saving must not change what trains)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    vocab = vocabulary(tmp_path_factory)
    proc = th.run(_resume_cmd(tmp / "x", vocab, tmp / "run", RESUME_STEPS,
                              f"--gin.CHECKPOINT_PERIOD={RESUME_STEPS}"))
    assert proc.returncode == 0, th.describe(proc)
    return th.load_state(tmp / "run", RESUME_STEPS), vocab


def _check_same_as_uninterrupted(model_dir, uninterrupted, proc, resumed_at):
    assert proc.returncode == 0, th.describe(proc)
    assert "Traceback" not in proc.stderr and not th.error_lines(proc.stderr)
    assert f"data: continuing at batch {resumed_at} from the saved iterator state" \
        in proc.stderr, th.describe(proc)
    assert th.logged_steps(proc.stderr) == list(range(resumed_at + 1, RESUME_STEPS + 1))
    th.assert_trees_equal(uninterrupted[0], th.load_state(model_dir, RESUME_STEPS),
                          "the resumed run's final state")


def test_a_finished_run_extended_to_more_steps_matches_an_uninterrupted_one(
        tmp_path, uninterrupted):
    vocab, model_dir, finished_at = uninterrupted[1], tmp_path / "run", 6
    first, more = th.run_mains([_resume_cmd(tmp_path, vocab, model_dir, steps)[3:]
                                for steps in (finished_at, RESUME_STEPS)])
    assert first.returncode == 0, th.describe(first)
    _check_same_as_uninterrupted(model_dir, uninterrupted, more, finished_at)


def test_sigterm_then_the_same_command_matches_an_uninterrupted_run(tmp_path,
                                                                    uninterrupted):
    vocab, model_dir, log = uninterrupted[1], tmp_path / "run", tmp_path / "first.log"
    cmd = _resume_cmd(tmp_path, vocab, model_dir, RESUME_STEPS)
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
    again = th.run(cmd)
    _check_same_as_uninterrupted(model_dir, uninterrupted, again, int(m.group(1)))


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


def test_pretrains_on_text_files_and_resumes_as_if_uninterrupted(tmp_path, tmp_path_factory):
    """text_span_corruption on a list of text files (Parquet and json.gz, the gin list as
    a user writes it): stopped at step 4 and run on to 8, the parameters equal an
    uninterrupted 8-step run's. Its validation loss reads TEXT_VALIDATION_FILES (here the
    json.gz file); without them, EVAL_PERIOD is refused in one line naming them."""
    vocab, files = vocabulary(tmp_path_factory), _text_files(tmp_path)

    def argv(name, steps, *extra):
        return ["--gin_file=models/t5_1_1/tiny.gin", "--gin_file=runs/pretrain.gin",
                '--gin.MIXTURE_OR_TASK_NAME="text_span_corruption"',
                f"--gin.TEXT_FILES={files!r}", f'--gin.VOCABULARY_PATH="{vocab}"',
                f'--gin.MODEL_DIR="{tmp_path / name}"', f"--gin.TRAIN_STEPS={steps}",
                "--gin.BATCH_SIZE=4", "--gin.LOG_PERIOD=2", "--gin.CHECKPOINT_PERIOD=2",
                "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}", *extra]
    held_out = [f for f in files if f.endswith(".json.gz")]
    validated = ("--gin.EVAL_PERIOD=4", "--gin.EVAL_STEPS=1",
                 f"--gin.TEXT_VALIDATION_FILES={held_out!r}")
    # the runs in one interpreter, one after another (th.run_mains)
    runs = th.run_mains([argv("run", 4), argv("run", 8), argv("whole", 8, *validated),
                         argv("unheld", 2, "--gin.EVAL_PERIOD=2")])
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
