"""A bad record in the middle of a data file (issue: hardening, class 1): the run ends
with one `error:` line naming the file and line, within seconds, every time: no
TensorFlow traceback, no hang at exit. A truncated .jsonl.zst is called truncated."""
import json
import subprocess
import sys

import pytest
import zstandard

import train_helpers as th
from data_helpers import vocabulary
from t5lite.data.files import demo_corpus
from t5lite.data.files import readers
from t5lite.errors import DataFormatError


def _lines(tmp_path, n=160):
    text = demo_corpus.write_text(str(tmp_path / "corpus.txt"), lines=n, seed=5)
    return [json.dumps({"text": line.strip()}) for line in open(text)]


def _write_pile(tmp_path, case):
    train = tmp_path / "pile" / "train"
    train.mkdir(parents=True)
    lines = _lines(tmp_path)
    if case == "not_json":
        bad = lines[:100] + ["{this is not json"] + lines[100:]
        (train / "00.jsonl").write_text("\n".join(bad) + "\n")
        return "00.jsonl:101: not JSON"
    if case == "no_text":
        bad = lines[:100] + [json.dumps({"content": "x"})] + lines[100:]
        (train / "00.jsonl").write_text("\n".join(bad) + "\n")
        return "00.jsonl:101: expected a JSON object with a 'text' string"
    data = zstandard.ZstdCompressor().compress(("\n".join(lines * 20) + "\n").encode())
    (train / "00.jsonl.zst").write_bytes(data[: len(data) * 2 // 3])
    return "00.jsonl.zst: truncated zstandard file"


def _argv(tmp_path, vocab):
    return ["--gin_file=models/t5_1_1/tiny.gin", "--gin_file=runs/pretrain.gin",
            '--gin.MIXTURE_OR_TASK_NAME="pile_span_corruption"',
            f'--gin.MODEL_DIR="{tmp_path / "run"}"', "--gin.TRAIN_STEPS=200",
            "--gin.BATCH_SIZE=4", "--gin.CHECKPOINT_PERIOD=1000",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
            f'--gin.PILE_DIR="{tmp_path / "pile"}"', f'--gin.VOCABULARY_PATH="{vocab}"']


def _assert_one_line(stderr, expected):
    assert "Traceback" not in stderr and "PyFunc" not in stderr, stderr[-3000:]
    errors = [l for l in stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], stderr[-3000:]
    assert len([l for l in stderr.splitlines() if "WARNING" in l or "W0000" in l]) == 0


def test_bad_record_mid_file_is_one_line_and_the_process_exits(tmp_path, tmp_path_factory):
    """A record that is not JSON, through the real command: one line, and the process
    exits (no hang at exit)."""
    expected = _write_pile(tmp_path, "not_json")
    cmd = [sys.executable, "-m", "t5lite.train", *_argv(tmp_path, vocabulary(tmp_path_factory))]
    # a hang at exit shows up as TimeoutExpired (the run itself takes ~15 s)
    proc = subprocess.run(cmd, cwd=th.REPO, env=th.env(devices=1), capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    _assert_one_line(proc.stderr, expected)


@pytest.mark.slow
def test_a_record_without_text_and_a_truncated_zst_are_one_line_each(tmp_path,
                                                                     tmp_path_factory):
    """The other two kinds of bad data, one after the other in one interpreter
    (th.run_mains; the real command's exit is the test above's)."""
    vocab = vocabulary(tmp_path_factory)
    cases = {}
    for case in ("no_text", "truncated_zst"):
        (tmp_path / case).mkdir()
        cases[case] = _write_pile(tmp_path / case, case)
    procs = th.run_mains([_argv(tmp_path / case, vocab) for case in cases], cwd=th.REPO,
                         timeout=240)
    for (case, expected), proc in zip(cases.items(), procs):
        assert proc.returncode == 2, (case, proc.stderr[-3000:])
        _assert_one_line(proc.stderr, expected)


def test_zst_reader_names_truncation_and_reads_whole_multi_frame_files(tmp_path):
    lines = _lines(tmp_path, 60)
    frame = zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode())
    (tmp_path / "two.jsonl.zst").write_bytes(frame + frame)
    assert len(list(readers.iter_jsonl_texts(str(tmp_path / "two.jsonl.zst")))) == 2 * len(lines)
    for cut in (20, len(frame) // 2, len(frame) + 40):
        (tmp_path / "cut.jsonl.zst").write_bytes((frame + frame)[:cut])
        with pytest.raises(DataFormatError, match="truncated zstandard file"):
            list(readers.iter_jsonl_texts(str(tmp_path / "cut.jsonl.zst")))
    # garbage after a valid frame start is corrupt, not "no records"
    (tmp_path / "bad.jsonl.zst").write_bytes(frame[:8] + b"\x00" * 200)
    with pytest.raises(DataFormatError, match="corrupt|truncated"):
        readers.check_jsonl(str(tmp_path / "bad.jsonl.zst"))
