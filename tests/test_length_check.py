"""TASK_FEATURE_LENGTHS that cut sequences say so: training logs how many of the first
examples it cut (and the lengths that keep them whole) and writes the fractions to
TensorBoard; an evaluation whose targets length cannot hold the labels it compares is
refused in one line before anything is decoded."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("seqio")

import train_helpers as th  # noqa: E402
from data_helpers import data_env, reset_data_settings, vocabulary  # noqa: E402
from t5lite.data.files import demo_corpus  # noqa: E402

MODEL_FILE = "configs/models/t5_1_1/tiny.gin"
TRAIN, DEV = 40, 9


@pytest.fixture(scope="module")
def mnli(tmp_path_factory):
    root = tmp_path_factory.mktemp("length_check")
    demo_corpus.write_multinli(str(root / "multinli"), train=TRAIN, dev=DEV)
    return dict(vocab=vocabulary(tmp_path_factory), mnli=root / "multinli", root=root)


def _label_tokens(vocab_path, mnli_dir, name):
    """Tokens (EOS included) of each labelled record's gold label, counted here with the
    SentencePiece model itself."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(vocab_path))
    rows = [json.loads(l) for l in (Path(mnli_dir) / f"multinli_1.0_{name}.jsonl")
            .read_text().splitlines()]
    return [len(sp.encode(r["gold_label"])) + 1 for r in rows if r["gold_label"] != "-"]


def test_the_training_sample_counts_what_the_lengths_cut(mnli, monkeypatch, tmp_path):
    data_env(monkeypatch, tmp_path, mnli["vocab"], mnli_dir=mnli["mnli"])
    try:
        from t5lite.data import length_check, tasks
        labels = _label_tokens(mnli["vocab"], mnli["mnli"], "train")
        longest = max(labels)
        assert min(labels) < longest  # the labels differ in length: a cut in between
        cut_at = longest - 1
        cuts = length_check.sample_cuts(tasks.get_provider("mnli"), "train",
                                        {"inputs": 512, "targets": cut_at})
        assert cuts.examples == TRAIN
        assert cuts.cut == {"inputs": 0, "targets": sum(n > cut_at for n in labels)}
        assert cuts.longest["targets"] == longest and cuts.longest["inputs"] < 512
        whole = length_check.sample_cuts(tasks.get_provider("mnli"), "train",
                                         {"inputs": 512, "targets": longest})
        assert whole.cut == {"inputs": 0, "targets": 0}
        assert length_check.describe(whole, "mnli", "train") is None
        line = length_check.describe(cuts, "mnli", "train")
        assert f"cut to {cut_at}" in line and f"{{'targets': {longest}}}" in line
    finally:
        reset_data_settings()


def _train_argv(mnli, model_dir, *extra):
    """MNLI trained from scratch (runs/pretrain.gin with the task swapped in; the tiny T5
    cut to one layer a side, a 512-entry vocabulary): `t5lite.train`'s argv."""
    return [f"--gin_file={MODEL_FILE}", "--gin_file=configs/runs/pretrain.gin",
            f'--gin.MODEL_DIR="{model_dir}"', "--gin.MIXTURE_OR_TASK_NAME='mnli'",
            "--gin.EVAL_SPLIT='validation_matched'", "--gin.BATCH_SIZE=8",
            f'--gin.VOCABULARY_PATH="{mnli["vocab"]}"', f'--gin.MNLI_DIR="{mnli["mnli"]}"',
            "--gin.T5Config.vocab_size=512", "--gin.T5Config.num_encoder_layers=1",
            "--gin.T5Config.num_decoder_layers=1", *extra]


def test_a_run_that_cuts_says_so_and_an_evaluation_that_cannot_fit_its_labels_refuses(mnli, tmp_path):
    longest = max(_label_tokens(mnli["vocab"], mnli["mnli"], "train"))
    lengths = "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 2}"
    # both runs through `train.main` in one interpreter (th.run_mains)
    refused, trained = th.run_mains([
        _train_argv(mnli, tmp_path / "refused", lengths, "--gin.EVAL_PERIOD=2",
                    "--gin.TRAIN_STEPS=2"),
        _train_argv(mnli, tmp_path / "run", lengths, "--gin.EVAL_PERIOD=None",
                    "--gin.TRAIN_STEPS=1")])
    # with its evaluation on, the run stops before training: no label fits 2 tokens
    line = th.assert_one_error(refused, "TASK_FEATURE_LENGTHS['targets']=2 cuts the labels",
                               f"of the {DEV} examples of mnli validation_matched",
                               "no prediction could match them")
    assert refused.returncode == 2 and "to at least" in line
    assert not th.complete_steps(tmp_path / "refused")
    # without it, the run trains and says what its lengths cut
    assert trained.returncode == 0, th.describe(trained)
    assert (f"data: TASK_FEATURE_LENGTHS cut the inputs of {TRAIN} of {TRAIN} examples"
            in trained.stderr), th.tail(trained.stderr)
    assert f"the targets of {TRAIN} of {TRAIN} examples (the longest: {longest} tokens" \
        in trained.stderr
    scalars = th.scalars(tmp_path / "run")
    assert scalars["data/targets_cut_fraction"] == [(0, 1.0)]
    assert scalars["data/inputs_cut_fraction"] == [(0, 1.0)]
    assert scalars["data/length_check_examples"] == [(0, float(TRAIN))]
