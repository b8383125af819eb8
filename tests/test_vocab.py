"""`python -m t5lite.vocab`: a T5-style SentencePiece model from local jsonl / jsonl.zst /
txt files, used with 100 extra ids."""
import json
import sys

import pytest

from t5lite import vocab
from t5lite.data.files import vocab_training
from t5lite.data.files import demo_corpus
from t5lite.data.files import readers
from t5lite.errors import DataFormatError

from data_helpers import VOCAB_SIZE, vocabulary

import train_helpers as th


def _corpus(tmp_path):
    pile = demo_corpus.write_pile(str(tmp_path / "pile"), train_files=1, docs_per_file=120,
                                  compress=True, seed=3)
    plain = demo_corpus.write_pile(str(tmp_path / "plain"), train_files=1, docs_per_file=60,
                                   compress=False, seed=4)
    text = demo_corpus.write_text(str(tmp_path / "notes.txt"), lines=200, seed=5)
    return pile["train"][0], plain["train"][0], text


def test_cli_trains_t5_special_ids_from_jsonl_zst_and_txt(tmp_path, capsys):
    import sentencepiece as spm
    zst, jsonl, txt = _corpus(tmp_path)
    out = tmp_path / "out" / "spm.model"
    rc = vocab.main([f"--input={zst},{jsonl}", f"--input={txt}", "--vocab_size=300",
                     f"--output={out}"])
    assert rc == 0
    said = capsys.readouterr()
    assert "VOCABULARY_PATH" in said.out and said.err == ""  # no bar off a terminal
    sp = spm.SentencePieceProcessor(model_file=str(out))
    assert sp.get_piece_size() == 300
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    text = "Ada the engineer built a small boat near the harbour."
    assert sp.decode(sp.encode(text)) == text


def test_on_a_terminal_a_bar_counts_the_sentences_read_then_a_line_says_training(
        tmp_path, monkeypatch, capsys):
    import io
    import re
    zst, jsonl, txt = _corpus(tmp_path)
    sentences = sum(1 for _ in vocab_training.iter_sentences([zst, txt]))
    terminal = type("Terminal", (io.StringIO,), {"isatty": lambda self: True})()
    monkeypatch.setattr(sys, "stderr", terminal)
    rc = vocab.main([f"--input={zst},{txt}", "--vocab_size=300",
                     f"--output={tmp_path / 'spm.model'}"])
    assert rc == 0, terminal.getvalue()
    shown = terminal.getvalue()
    assert re.search(rf"reading sentences: {sentences}it\b", shown), shown[-500:]
    assert f"training a 300-piece unigram vocabulary on {sentences:,} sentences" in shown


def test_seqio_vocabulary_has_100_extra_ids_at_the_top(tmp_path_factory):
    pytest.importorskip("seqio")
    from t5lite.data import vocabularies
    path = vocabulary(tmp_path_factory)
    v = vocabularies.get_vocabulary(path)
    assert v.vocab_size == VOCAB_SIZE + 100
    assert (v.pad_id, v.eos_id, v.unk_id) == (0, 1, 2)
    assert v.encode("<extra_id_0>") == [VOCAB_SIZE + 99]  # sentinels count down from the top
    assert v.encode("<extra_id_99>") == [VOCAB_SIZE]
    text = "In 1901, Grace painted 12 lamps by the lake."
    ids = v.encode(text)
    assert all(3 <= i < VOCAB_SIZE for i in ids)
    assert v.decode(ids) == text
    assert v.decode(v.encode_tf(text).numpy().tolist()) == text


def test_max_sentences_limits_what_is_read(tmp_path):
    _, jsonl, txt = _corpus(tmp_path)
    assert len(list(vocab_training.iter_sentences([jsonl, txt], max_sentences=7))) == 7
    long_line = " ".join(["word"] * 3000)  # 14999 characters: split at spaces
    (tmp_path / "long.txt").write_text(long_line + "\n")
    pieces = list(vocab_training.iter_sentences([str(tmp_path / "long.txt")]))
    assert len(pieces) == 4 and all(len(p) <= vocab_training.MAX_CHARS_PER_SENTENCE for p in pieces)
    assert " ".join(pieces) == long_line


def test_cli_errors_name_the_input(tmp_path, capsys):
    assert vocab.main([f"--input={tmp_path}/nothing*.jsonl", "--output=x.model"]) == 2
    assert "names no file" in capsys.readouterr().err
    (tmp_path / "data.csv").write_text("a,b\n")
    assert vocab.main([f"--input={tmp_path}/data.csv", "--output=x.model"]) == 2
    assert "unknown file type" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text(json.dumps({"content": "no text field"}) + "\n")
    assert vocab.main([f"--input={tmp_path}/bad.jsonl", "--output=x.model"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "'text'" in err
    (tmp_path / "fake.jsonl.zst").write_text('{"text": "not compressed"}\n')
    with pytest.raises(DataFormatError, match="not a zstandard file"):
        list(readers.iter_texts(str(tmp_path / "fake.jsonl.zst")))
    # A corpus too small for the requested size says so, with SentencePiece's limit.
    small = demo_corpus.write_text(str(tmp_path / "small.txt"), lines=20)
    assert vocab.main([f"--input={small}", "--vocab_size=5000", "--output=x.model"]) == 2
    assert "Vocabulary size too high" in capsys.readouterr().err


def test_vocab_cli_imports_no_tensorflow():
    code = ("import t5lite.vocab, t5lite.data, t5lite.data.synthetic, t5lite.data.files.readers, "
            "t5lite.data.settings, t5lite.data.files.demo_corpus")
    _, imported = th.imports_after(code, ("tensorflow", "seqio", "t5", "tensorflow_datasets"))
    assert imported == []


def test_a_tokenizer_without_eos_is_refused_in_one_line(tmp_path):
    """Every task sequence ends in the vocabulary's EOS; one without (or with EOS at the
    padding id 0) cannot train. Other special ids are fine (tests/test_llama_tokenizer.py)."""
    import io
    import sentencepiece as spm
    from t5lite.data import vocabularies
    from t5lite.errors import VocabularyError
    text = demo_corpus.write_text(str(tmp_path / "notes.txt"), lines=400, seed=3)
    messages = []
    for name, ids in (("no_eos", dict(eos_id=-1)),
                      ("eos_0", dict(eos_id=0, unk_id=1, bos_id=2))):
        model = io.BytesIO()
        with open(text) as f:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(f.read().splitlines()),
                                           model_writer=model, vocab_size=200, minloglevel=2,
                                           **ids)
        path = tmp_path / f"{name}.model"
        path.write_bytes(model.getvalue())
        with pytest.raises(VocabularyError) as e:
            vocabularies.get_vocabulary(str(path))
        messages.append(str(e.value))
    assert all("\n" not in m and "EOS above 0" in m for m in messages), messages
    assert "no EOS piece" in messages[0] and "EOS at id 0" in messages[1], messages
