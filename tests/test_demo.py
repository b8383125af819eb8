"""The embedded demo (README's first command): `python -m t5lite.train` with no --gin_file
writes its own corpus and vocabulary, pretrains a tiny T5 with span corruption and
learns; `configs/demo_finetune.gin` finetunes that checkpoint on the generated MNLI task
and its inference evaluation beats chance; `demo_eval.gin` and `demo_infer.gin` use it.
All of it as shipped, checking the numbers in the docs."""
from __future__ import annotations

import json
import os
import sys

import pytest

import train_helpers as th

pytest.importorskip("seqio")

CHANCE = 100.0 / 3


def _pretrain(cwd, *extra):
    return th.run([sys.executable, "-m", "t5lite.train", *extra], cwd=cwd, timeout=600,
                  extra_env=th.optimized())


def _losses(model_dir):
    return [v for _, v in th.scalars(model_dir)["loss_per_token"]]


def test_incomplete_demo_data_dir_is_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("t5")
    from t5lite import train
    data = tmp_path / "t5lite_demo" / "data"
    data.mkdir(parents=True)
    (data / "stray.txt").write_text("not a corpus")
    monkeypatch.chdir(tmp_path)
    assert train.main(["--gin.TRAIN_STEPS=2"]) != 0
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1
    assert all(n in lines[0] for n in (str(data), "no complete demo corpus", "DEMO_DATA_DIR"))
    assert sorted(p.name for p in data.iterdir()) == ["stray.txt"]
    assert (data / "stray.txt").read_text() == "not a corpus"


def test_demo_as_shipped(tmp_path):
    """The README's first command and the demo's finetune / eval / infer configs, as
    shipped, with the numbers quoted in README.md / docs/quickstart.md (within
    tolerance). The README's command runs as a user runs it; the four commands after it
    run one after another in one interpreter (th.run_mains: each through its `main`, as
    `python -m` runs it), which saves four TensorFlow imports and task registrations."""
    proc = _pretrain(tmp_path)
    assert proc.returncode == 0, th.describe(proc)
    assert "running the demo" in proc.stderr
    demo = tmp_path / "t5lite_demo"
    data = demo / "data"
    assert (data / "COMPLETE").exists() and (data / "spm.model").exists()
    mtime = (data / "spm.model").stat().st_mtime_ns
    assert sorted(p.name for p in (data / "pile" / "train").iterdir()) == [
        "00.jsonl.zst", "01.jsonl.zst"]
    assert th.complete_steps(demo / "pretrain") == [200, 300]  # every 100, the last 2 kept
    losses = _losses(demo / "pretrain")
    assert len(losses) == 6  # every 50 steps
    # span corruption loss per target token falls
    assert losses[0] > 2.6 and losses[-1] < 2.4 and losses[-1] < losses[0] - 0.5, losses

    inputs = tmp_path / "inputs.txt"
    inputs.write_text("mnli hypothesis: Ada never built any boat. premise: Ada the pilot "
                      "built a red boat by the lake.\n")
    finetune, evaluate, infer, again = th.run_mains(
        [["--gin_file=configs/demo_finetune.gin"], ["--gin_file=configs/demo_eval.gin"],
         ["--gin_file=configs/demo_infer.gin", f'--gin.INPUT_FILE="{inputs}"'], []],
        module=["t5lite.train", "t5lite.eval", "t5lite.infer", "t5lite.train"],
        cwd=tmp_path, timeout=900, extra_env=th.optimized())

    assert finetune.returncode == 0, th.describe(finetune)
    assert "initial:t5lite_demo/pretrain" in finetune.stderr  # from the demo checkpoint
    acc = th.scalars(demo / "mnli", "inference_eval")["mnli/accuracy"]
    assert [s for s, _ in acc] == [100, 200, 300]
    assert acc[0][1] > CHANCE + 15 and acc[-1][1] > 70.0, acc
    for step, value in acc:  # each accuracy is that of the predictions written with it
        rows = [json.loads(l) for l in
                (demo / "mnli" / "inference_eval" / f"mnli_{step}_predictions.jsonl").open()]
        assert len(rows) == 150
        assert value == pytest.approx(
            100.0 * sum(r["postprocessed"] == r["target"] for r in rows) / len(rows))

    # t5lite.eval with configs/demo_eval.gin on the finetuned MODEL_DIR (its step 300)
    # reproduces the in-training evaluation.
    assert evaluate.returncode == 0, th.describe(evaluate)
    summary = json.loads((demo / "mnli_eval" / "metrics.json").read_text())
    assert summary["step"] == 300
    assert summary["metrics"]["mnli"]["accuracy"] == pytest.approx(acc[-1][1])

    assert infer.returncode == 0, th.describe(infer)
    rows = [json.loads(l) for l in (demo / "infer" / "predictions.jsonl").open()]
    assert [r["prediction"] for r in rows] == ["contradiction"]

    # The README's command again: it reuses the corpus (no rewrite) and finds the run
    # complete at its saved step.
    assert again.returncode == 0, th.describe(again)
    assert "writing the demo corpus" not in again.stderr and "already complete" in again.stderr
    assert (data / "spm.model").stat().st_mtime_ns == mtime


def test_interrupted_corpus_write_leaves_nothing(tmp_path, monkeypatch):
    from t5lite.data.files import demo_corpus
    real = demo_corpus.write_pile

    def crash(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt  # e.g. Ctrl-C while the corpus is being written

    monkeypatch.setattr(demo_corpus, "write_pile", crash)
    with pytest.raises(KeyboardInterrupt):
        demo_corpus.ensure(str(tmp_path / "data"))
    assert list(tmp_path.iterdir()) == []  # neither the directory nor a temporary sibling
    monkeypatch.setattr(demo_corpus, "write_pile", real)
    paths = demo_corpus.ensure(str(tmp_path / "data"))
    assert (tmp_path / "data" / "COMPLETE").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    assert all(os.path.exists(v) for v in paths.values())


def test_demo_data_command_writes_the_corpus_and_refuses_a_used_directory(tmp_path, capsys):
    from t5lite import demo_data
    from t5lite.data.files import readers
    out = tmp_path / "corpus"
    assert demo_data.main([f"--output_dir={out}", "--docs_per_file=20", "--vocab_size=300"]) == 0
    exports = dict(line.split()[1].split("=", 1) for line in capsys.readouterr().out.splitlines()
                   if line.startswith("  export "))
    assert exports == {"T5LITE_VOCABULARY_PATH": str(out / "spm.model"),
                       "T5LITE_PILE_DIR": str(out / "pile"),
                       "T5LITE_MNLI_DIR": str(out / "multinli_1.0"),
                       "T5LITE_SQUAD_DIR": str(out / "squad"),
                       "T5LITE_LAMBADA_DIR": str(out / "lambada"),
                       "T5LITE_BOOLQ_DIR": str(out / "boolq")}
    assert len(list(readers.iter_texts(str(out / "pile" / "train" / "01.jsonl.zst")))) == 20
    assert (out / "lambada" / "lambada_test.jsonl").exists()
    assert (out / "boolq" / "dev.jsonl").exists()
    assert (out / "glue" / "MNLI" / "dev_matched.tsv").exists()
    assert demo_data.main([f"--output_dir={out}"]) == 0  # complete: left as it is
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    assert demo_data.main([f"--output_dir={used}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(used) in err[0]
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
