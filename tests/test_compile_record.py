"""t5lite/runtime/process/compile_record.py: the line before the train step compiles,
with the compile time remembered from the last time for the same MODEL_DIR; a record that
cannot be read or written never fails a run. (The real command's line and record:
test_compilation_cache.py.)"""
import json
import logging

import pytest

from t5lite.runtime.process import compile_record


@pytest.fixture(autouse=True)
def _no_record_after():
    yield
    compile_record.use(None, writable=False)


def test_the_line_says_the_first_time_then_the_time_it_took(tmp_path, caplog):
    compile_record.use(str(tmp_path), writable=True)
    run = str(tmp_path / "run")
    with caplog.at_level(logging.INFO, logger=compile_record.__name__):
        first = compile_record.announce("the train step", "step_fn", run)
    assert first == "compiling the train step (jit(step_fn)); the first time for this MODEL_DIR"
    assert first in caplog.text
    compile_record.note("jit(init)", 9.0)  # not the announced program: not kept
    compile_record.note("jit(step_fn)", 4.26)
    compile_record.note("jit(step_fn)", 99.0)  # once an announcement
    assert json.loads((tmp_path / "compile_seconds.json").read_text()) == {
        f"{run}|jit(step_fn)": 4.26}
    assert compile_record.announce("the train step", "step_fn", run) == (
        "compiling the train step (jit(step_fn)); for this MODEL_DIR it compiled in 4 s last "
        "time")
    other = str(tmp_path / "other")
    assert compile_record.announce("the train step", "step_fn", other).endswith(
        "the first time for this MODEL_DIR")
    compile_record.note("jit(step_fn)", 12.0)
    assert compile_record.last_seconds("step_fn", other) == 12.0
    assert compile_record.last_seconds("step_fn", run) == 4.26
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".compile_seconds-")]


def test_the_record_keeps_the_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_record, "RECORD_SIZE", 3)
    compile_record.use(str(tmp_path), writable=True)
    for i in range(5):
        compile_record.announce("the train step", "step_fn", str(tmp_path / f"run{i}"))
        compile_record.note("jit(step_fn)", float(i))
    record = json.loads((tmp_path / "compile_seconds.json").read_text())
    assert list(record.values()) == [2.0, 3.0, 4.0]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"x|jit(step_fn)": "slow"}'])
def test_a_record_that_does_not_read_is_no_record(tmp_path, content):
    (tmp_path / "compile_seconds.json").write_text(content)
    compile_record.use(str(tmp_path), writable=True)
    assert compile_record.announce("the train step", "step_fn", "x").endswith(
        "the first time for this MODEL_DIR")
    compile_record.note("jit(step_fn)", 2.0)  # and is replaced by a good one
    assert compile_record.last_seconds("step_fn", "x") == 2.0


def test_no_cache_or_a_cache_it_cannot_write_keeps_no_record(tmp_path):
    compile_record.use(None, writable=True)
    assert compile_record.announce("the train step", "step_fn", "x").endswith("first time "
                                                                              "for this MODEL_DIR")
    compile_record.note("jit(step_fn)", 2.0)
    compile_record.use(str(tmp_path), writable=False)  # read only (or not process 0)
    compile_record.announce("the train step", "step_fn", "x")
    compile_record.note("jit(step_fn)", 2.0)
    assert list(tmp_path.iterdir()) == []
    gone = tmp_path / "gone"  # a directory removed under the run: no error, no record
    compile_record.use(str(gone), writable=True)
    compile_record.announce("the train step", "step_fn", "x")
    compile_record.note("jit(step_fn)", 2.0)
    assert not gone.exists()
