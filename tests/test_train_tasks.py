"""`python -m t5lite.train` on a real SeqIO task: Pile-style jsonl through span corruption,
the data position in the checkpoint, and a vocabulary larger than the model's embedding
refused in one line."""
import json

import pytest

import train_helpers as th
from data_helpers import vocabulary
from t5lite.data import demo_corpus


def _pile(tmp_path):
    text = demo_corpus.write_text(str(tmp_path / "corpus.txt"), lines=200, seed=3)
    (tmp_path / "pile" / "train").mkdir(parents=True, exist_ok=True)
    with open(tmp_path / "pile" / "train" / "00.jsonl", "w") as f:
        for line in open(text):
            f.write(json.dumps({"text": line.strip(), "meta": {"pile_set_name": "t"}}) + "\n")
    return tmp_path / "pile"


def _cmd(tmp_path, vocab, *extra):
    return [th.sys.executable, "-m", "t5lite.train", "--gin_file=models/t5_1_1/tiny.gin",
            "--gin_file=runs/pretrain.gin",
            '--gin.MIXTURE_OR_TASK_NAME="pile_span_corruption"',
            f'--gin.MODEL_DIR="{tmp_path / "run"}"', "--gin.TRAIN_STEPS=4",
            "--gin.BATCH_SIZE=4", "--gin.LOG_PERIOD=2",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
            f'--gin.PILE_DIR="{_pile(tmp_path)}"', f'--gin.VOCABULARY_PATH="{vocab}"', *extra]


def test_pretrains_on_pile_jsonl_and_saves_the_data_position(tmp_path, tmp_path_factory):
    proc = th.run(_cmd(tmp_path, vocabulary(tmp_path_factory)), cwd=tmp_path)
    assert proc.returncode == 0, th.describe(proc)
    assert th.complete_steps(tmp_path / "run") == [4]
    data = json.loads((tmp_path / "run" / "checkpoints" / "4" / "data" / "metadata").read_text())
    assert data["position"] == 4 and data["task"] == "pile_span_corruption"
    iterator = tmp_path / "run" / "checkpoints" / "4" / "data_iterator"
    assert (iterator / "process_00000-of-00001").stat().st_size > 0
    losses = [v for _, v in th.scalars(tmp_path / "run")["loss_per_token"]]
    assert len(losses) == 2 and all(0 < v < 20 for v in losses)


@pytest.mark.slow
def test_resume_continues_the_saved_data_stream_and_refuses_a_changed_one(
        tmp_path, tmp_path_factory):
    first = th.run(_cmd(tmp_path, vocabulary(tmp_path_factory)), cwd=tmp_path)
    assert first.returncode == 0, th.describe(first)
    # resuming under another batch size would leave the stream: one line, nothing lost
    changed = th.run(_cmd(tmp_path, vocabulary(tmp_path_factory), "--gin.TRAIN_STEPS=6",
                          "--gin.BATCH_SIZE=8"), cwd=tmp_path)
    assert changed.returncode != 0
    lines = [l for l in changed.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "batch_size 4 -> 8" in lines[0], th.describe(changed)
    assert "Traceback" not in changed.stderr and th.complete_steps(tmp_path / "run") == [4]
    again = th.run(_cmd(tmp_path, vocabulary(tmp_path_factory), "--gin.TRAIN_STEPS=6"),
                   cwd=tmp_path)
    assert again.returncode == 0, th.describe(again)
    assert "data: continuing at batch 4 from the saved iterator state" in again.stderr
    assert th.complete_steps(tmp_path / "run")[-1] == 6


def test_vocabulary_larger_than_the_model_is_one_line(tmp_path, tmp_path_factory):
    proc = th.run(_cmd(tmp_path, vocabulary(tmp_path_factory), "--gin.T5Config.vocab_size=128"),
                  cwd=tmp_path)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "vocabulary has 400 ids" in lines[0], th.describe(proc)
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_two_processes_resume_the_pile_stream_from_their_own_states(tmp_path,
                                                                     tmp_path_factory):
    """Two processes (gloo on 127.0.0.1) each save their own data iterator state; a
    restart at step 4 restores both and trains on the batches of an uninterrupted run."""
    vocab = vocabulary(tmp_path_factory)

    def pair(model_dir, steps, tag):
        port, procs = th.free_port(), []
        try:
            for i in range(2):
                cmd = _cmd(tmp_path, vocab, f'--gin.MODEL_DIR="{model_dir}"',
                           f"--gin.TRAIN_STEPS={steps}", "--gin.CHECKPOINT_PERIOD=4",
                           "--gin.ICI_MESH_SHAPE=[1,1,1]", "--gin.DCN_MESH_SHAPE=[2,1,1]",
                           "--gin.ACTIVATION_DTYPE='float32'",
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

    pair(tmp_path / "whole", 8, "whole")
    pair(tmp_path / "parts", 4, "first")
    item = tmp_path / "parts" / "checkpoints" / "4" / "data_iterator"
    assert sorted(p.name for p in item.glob("process_*")) == ["process_00000-of-00002",
                                                              "process_00001-of-00002"]
    logs = pair(tmp_path / "parts", 8, "second")
    for log in logs:
        assert "data: continuing at batch 4 from the saved iterator state" in log, log[-3000:]
    whole, parts = th.scalars(tmp_path / "whole"), th.scalars(tmp_path / "parts")
    for tag in ("weight_sum", "loss"):  # the same batches, so the same steps
        assert [v for s, v in whole[tag] if s > 4] == [v for s, v in parts[tag] if s > 4]
