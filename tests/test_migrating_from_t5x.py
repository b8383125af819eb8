"""Every `python -m t5lite...` command of docs/migrating_from_t5x.md runs as written, on
a tiny model and small local data: the documented paths are swapped for the test's
(T5X checkpoint, MNLI, C4 in TFDS, vocabulary, run directories), the model gin for
tiny.gin, and the step counts and lengths cut down; every flag and macro the page
gives is kept, T5X's EVAL_OUTPUT_DIR included."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorflow_datasets")

from t5lite.data import tasks  # noqa: E402,F401  (t5's gin configurables first)
from t5lite.data.files import demo_corpus

import t5x_helpers as tx  # noqa: E402
from data_helpers import (VOCAB_SIZE, c4_tfds, data_env, reset_data_settings,  # noqa: E402
                          vocabulary)

DOC = Path(__file__).resolve().parent.parent / "docs" / "migrating_from_t5x.md"
T5X_STEP = 1000


def doc_commands():
    """The t5lite commands of the page's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    commands = []
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            if command.strip().startswith("python -m t5lite."):
                commands.append(shlex.split(command))
    return commands


@pytest.fixture
def env(tmp_path, monkeypatch, tmp_path_factory):
    demo_corpus.write_multinli(str(tmp_path / "multinli"), train=16, dev=4)
    c4_tfds(str(tmp_path / "tfds"))
    vocab = vocabulary(tmp_path_factory)
    data_env(monkeypatch, tmp_path, vocab, mnli_dir=tmp_path / "multinli",
             tfds_data_dir=tmp_path / "tfds")
    yield dict(vocab=vocab, mnli=tmp_path / "multinli", tfds=tmp_path / "tfds")
    reset_data_settings()


def test_every_command_of_the_migration_guide_runs(env, tmp_path, capsys):
    from t5lite import convert, eval as evaluate, train
    from t5lite.models.common import param_paths
    vocab = VOCAB_SIZE + 100
    torch.manual_seed(7)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=vocab, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    target = tx.t5x_tree_from_hf(hf.state_dict(), 1)
    slots = tx.adafactor_slots(param_paths.flatten(target), np.random.default_rng(0))
    t5x = tx.write_t5x_checkpoint(tmp_path / "t5x" / f"checkpoint_{T5X_STEP}", target,
                                  step=T5X_STEP, param_states=tx.param_states(slots))
    model_gin = tmp_path / "tiny.gin"
    # one layer a side (tiny.gin's two only cost compile time: what is under test is that
    # each command of the page runs)
    model_gin.write_text(f"include 'models/t5_1_1/tiny.gin'\nT5Config.vocab_size = {vocab}\n"
                         "T5Config.num_encoder_layers = 1\nT5Config.num_decoder_layers = 1\n")
    data = {"MNLI_DIR": env["mnli"], "TFDS_DATA_DIR": env["tfds"],
            "VOCABULARY_PATH": env["vocab"]}
    places = {}  # a documented /ckpt or /runs path -> this test's

    def place(path):
        if path.startswith("/ckpt/t5x/"):
            return str(t5x)
        return places.setdefault(path, str(tmp_path / "out" / path.strip("/").replace("/", "_")))

    commands = doc_commands()
    kinds = [c[2] for c in commands]
    assert kinds.count("t5lite.train") >= 4 and "t5lite.eval" in kinds, kinds
    assert sum("--from=t5x" in c for c in commands) == 1, "the page lost its convert command"
    for command in commands:
        args = []
        continuing = any("INITIAL_CHECKPOINT_STATE" in a and "train_state" in a for a in command)
        for arg in command[3:]:
            name, _, value = arg.partition("=")
            macro = name[len("--gin."):] if name.startswith("--gin.") else None
            if arg == "--gin_file=configs/models/t5_1_1/base.gin":
                arg = f"--gin_file={model_gin}"
            elif macro in data:
                arg = f'{name}="{data[macro]}"'
            elif macro in ("TRAIN_STEPS", "BATCH_SIZE", "TASK_FEATURE_LENGTHS"):
                continue  # cut down below
            elif value.strip('"').startswith(("/ckpt", "/runs")) or name == "--output":
                arg = f'{name}="{place(value.strip(chr(34)))}"' if macro else \
                    f"{name}={place(value)}"
            args.append(arg)
        if command[2] == "t5lite.train":
            args += [f"--gin.TRAIN_STEPS={T5X_STEP + 2 if continuing else 2}",
                     "--gin.BATCH_SIZE=8", "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
                     "--gin.CHECKPOINT_PERIOD=2", "--gin.CheckpointSettings.async_save=False",
                     "--gin.EVAL_PERIOD=None"]
        elif command[2] == "t5lite.eval":
            # targets 16: the test vocabulary's labels take up to 10 tokens with EOS, and an
            # evaluation whose targets cannot hold them is refused
            args += ["--gin.BATCH_SIZE=8", "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 16}"]
        main = {"t5lite.train": train.main, "t5lite.convert": convert.main,
                "t5lite.eval": evaluate.main}[command[2]]
        code = main(args)
        err = capsys.readouterr().err
        assert code == 0, (command, args, err[-3000:])
        if continuing:
            assert f"at step {T5X_STEP}" in err
    evaluated = Path(places["/runs/base_mnli_eval"])  # EVAL_OUTPUT_DIR reached OUTPUT_DIR
    assert any(evaluated.iterdir())
