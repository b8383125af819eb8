"""One global data stream, whatever the process count (issue 47, part 2): the stream cut
into DATA_SHARDS shards is the same batch for batch on one process and on two; each
process saves the states of the shards it begins, and a resume on another process count
(2 -> 1, 1 -> 2, with packing and with a mixture) reads exactly the batches the first
run would have read next, from those states (no replay); a process count that the
shards do not divide reads whole shards and keeps its rows; DATA_SHARDS set against
the checkpoint's is refused in one line. The checkpoint item stores a file per shard
and reads a checkpoint written before shards (one file per process) as shards.
(The two-process training run that moves between counts: tests/test_train_tasks.py.)"""
import json

import numpy as np
import pytest

from t5lite.data.sharding.layout import DataLayout
from t5lite.data.sharding.shards import ShardPlan, shards_for
from t5lite.errors import DataError

from data_helpers import mnli_squad_mixture, pile, restored_data_settings  # noqa: F401

pytest.importorskip("seqio")

from t5lite.data import pipeline, sources  # noqa: E402
from t5lite.data.files import jsonl_cursor  # noqa: E402

LENGTHS = {"inputs": 32, "targets": 8}


def test_the_plan_names_each_process_its_shards_and_rows():
    one = ShardPlan(8, count=2, start=0, stop=8)
    assert (list(one.shards), one.rows_per_shard, one.offset, one.read_factor) == \
        ([0, 1], 4, 0, 1.0)
    assert one.owns(0) and one.owns(1)
    second = ShardPlan(8, count=4, start=4, stop=8)  # process 1 of 2, 4 shards
    assert (list(second.shards), second.offset, [second.owns(s) for s in range(4)]) == \
        ([2, 3], 0, [False, False, True, True])
    grown = ShardPlan(8, count=1, start=4, stop=8)  # process 1 of 2, one shard
    assert (list(grown.shards), grown.offset, grown.read_factor, grown.owns(0)) == \
        ([0], 4, 2.0, False)
    odd = ShardPlan(12, count=4, start=4, stop=8)  # 3 rows a shard, rows 4-7 of 12
    assert (list(odd.shards), odd.offset) == ([1, 2], 1)
    with pytest.raises(ValueError, match="DATA_SHARDS=3 does not divide the batch size 8"):
        ShardPlan(8, count=3, start=0, stop=8)
    assert shards_for(DataLayout(8, 1, 2), 4) == range(2, 4)
    assert shards_for(DataLayout(8, 1, 2), 3) is None


def _make(process_index=0, process_count=1, task="pile_span_corruption", **kwargs):
    args = dict(split="train", feature_lengths=LENGTHS, pack=False, shuffle=True, seed=5,
                shuffle_buffer_size=16)
    args.update(kwargs)
    return pipeline.make_iterator(task, layout=DataLayout(8, process_index, process_count),
                                  **args)


def _joined(batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _saved(states):
    """The processes' states as a checkpoint gives them back: the JSON item (written by
    process 0) with the shard states every process wrote, through JSON."""
    merged = {"count": states[0]["iterator"]["count"], "states": {}}
    for state in states:
        assert state["iterator"]["count"] == merged["count"]
        merged["states"].update(state["iterator"]["states"])
    out = json.loads(json.dumps({k: v for k, v in states[0].items() if k != "iterator"}))
    return {**out, "iterator": merged}


def _before(make, n, steps=5, after=3, expected=None):
    """Train `steps` batches on n processes (n = 1: DATA_SHARDS=2) and save: returns
    (the first steps + after batches of one uninterrupted process, the saved states, the
    records that process parsed). It is read first and alone, so its count (the Pile
    reader's) is what a replay of those batches parses. On one process it is the run
    that saves (as training does, mid-stream: a resume must then continue its batches);
    two processes are read beside it and must give its batches. `expected`: those
    batches, read before (then no count)."""
    assert expected is None or n != 1
    first, replay = [], None
    if expected is None:
        parsed = jsonl_cursor.STATS["records_parsed"]
        whole = make(0, 1, data_shards=2)
        expected = [next(whole) for _ in range(steps)]
        if n == 1:
            first = [whole]
            saved = _saved([whole.get_state()])
        expected += [next(whole) for _ in range(after)]
        replay = jsonl_cursor.STATS["records_parsed"] - parsed
        whole.close()  # its readers stop: they parse nothing while a resume is counted
    if n != 1:
        first = [make(i, n) for i in range(n)]
        for t in range(steps):
            assert _same(_joined([next(p) for p in first]), expected[t]), t
        saved = _saved([p.get_state() for p in first])
    for p in first:
        p.close()
    return expected, saved, replay


def _resume(make, n, saved, expected, steps=5):
    """Resume `saved` on n processes: their rows, joined, are expected[steps:]. Returns
    the records the resumed processes parsed."""
    parsed = jsonl_cursor.STATS["records_parsed"]
    resumed = [make(i, n) for i in range(n)]
    for p in resumed:
        p.set_state(saved)
    for t in range(steps, len(expected)):
        assert _same(_joined([next(p) for p in resumed]), expected[t]), t
    return jsonl_cursor.STATS["records_parsed"] - parsed


@pytest.mark.parametrize("counts,pack", [((2, 1), True), ((1, 2), False)],
                         ids=["2_to_1-packed", "1_to_2-unpacked"])
def test_a_resume_on_another_process_count_reads_the_batches_one_process_would(
        pile, pack, counts, caplog):
    """Two processes (2 data shards by default) and one with DATA_SHARDS=2 read the
    same batches; the states saved on one count resume on the other from the shards'
    states: the resumed processes parse fewer records than a replay of the stream (the
    one process reading those batches from the start, as a replay does)."""
    def before(i, n, data_shards=None):
        return _make(i, n, pack=pack, data_shards=2 if n == 1 else data_shards)

    def after(i, n):
        return _make(i, n, pack=pack)  # DATA_SHARDS unset: the checkpoint's 2

    expected, saved, replayed = _before(before, counts[0])
    with caplog.at_level("INFO", logger="t5lite"):
        parsed = _resume(after, counts[1], saved, expected)
    assert "rebuilding the stream" not in caplog.text
    assert f"from the saved iterator state of {2 // counts[1]} shard(s)" in caplog.text
    assert parsed < replayed, (parsed, replayed)


def test_a_mixture_moves_between_process_counts(tmp_path, monkeypatch, tmp_path_factory):
    """2 -> 1 and 1 -> 2 from one uninterrupted one-process stream (DATA_SHARDS=2)."""
    lengths = {"inputs": 128, "targets": 16}
    with mnli_squad_mixture(tmp_path, monkeypatch, tmp_path_factory,
                            "t5lite_test_shards_mnli_squad") as name:
        def make(i, n, data_shards=None):
            return _make(i, n, task=name, feature_lengths=lengths,
                         data_shards=2 if n == 1 else data_shards)
        expected, by_one, _ = _before(make, 1, steps=4, after=2)
        _, by_two, _ = _before(make, 2, steps=4, after=2, expected=expected)
        _resume(make, 1, by_two, expected, steps=4)
        _resume(make, 2, by_one, expected, steps=4)


def test_two_processes_on_one_shard_read_it_whole_and_keep_their_rows(pile, caplog):
    """A stream begun on one process without DATA_SHARDS has one shard: resumed on two,
    each reads it whole and keeps its half (twice the reading, said once)."""
    one = _make()  # the uninterrupted stream, saved after 3 batches (mid-stream)
    batches = [next(one) for _ in range(3)]
    saved = _saved([one.get_state()])
    batches += [next(one) for _ in range(4)]
    one.close()
    resumed = [_make(i, 2) for i in range(2)]
    with caplog.at_level("INFO", logger="t5lite"):
        for p in resumed:
            p.set_state(saved)
        for t in range(3, 6):
            assert _same(_joined([next(p) for p in resumed]), batches[t]), t
    assert caplog.text.count("DATA_SHARDS=1 for 2 data feeds") == 2
    assert "(2.0x the reading)" in caplog.text
    states = [p.get_state() for p in resumed]  # only process 0 begins shard 0
    assert list(states[0]["iterator"]["states"]) == [0] and states[1]["iterator"]["states"] == {}
    again = _make()  # and back on one process
    again.set_state(_saved(states))
    assert _same(next(again), batches[6])


def test_data_shards_set_against_the_checkpoint_is_refused_in_one_line(pile):
    run = _make(data_shards=2)
    next(run)
    saved = _saved([run.get_state()])
    with pytest.raises(DataError, match="another data stream: data_shards 2 -> 4") as e:
        _make(data_shards=4).set_state(saved)
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="DATA_SHARDS=3 does not divide the batch size 8"):
        _make(data_shards=3)
    legacy = {**saved, "process_count": 2}  # a state written before DATA_SHARDS
    del legacy["data_shards"]
    resumed = _make()
    resumed.set_state(legacy)
    assert resumed.plan.count == 2 and _same(next(resumed), next(run))  # run's batch 1


# ----------------------------------------------------------------------------- the item
def test_the_item_stores_a_file_a_shard_and_reads_an_older_one_as_shards(tmp_path,
                                                                         monkeypatch):
    from etils import epath
    from t5lite.runtime.checkpointing import data_iterator_item as item
    handler = item.DataIteratorHandler()
    directory = epath.Path(tmp_path / "7" / item.ITEM)
    directory.mkdir(parents=True)
    for process, shards in enumerate([{0: b"zero", 1: b"one"}, {2: b"two", 3: b"three"}]):
        monkeypatch.setattr(item.jax, "process_index", lambda p=process: p)
        handler.save(directory, item.DataIteratorSave({"count": 4, "states": shards}))
    assert sorted(p.name for p in directory.iterdir() if not p.name.endswith(".sha256")) == [
        "shard_00000-of-00004.process_00000", "shard_00001-of-00004.process_00000",
        "shard_00002-of-00004.process_00001", "shard_00003-of-00004.process_00001"]
    everything = handler.restore(directory)
    assert everything == {"count": 4, "states": {0: b"zero", 1: b"one", 2: b"two",
                                                 3: b"three"}}
    wanted = handler.restore(directory, item.DataIteratorRestore(
        lambda count: shards_for(DataLayout(8, 1, 2), count)))
    assert wanted == {"count": 4, "states": {2: b"two", 3: b"three"}}
    older = epath.Path(tmp_path / "9" / item.ITEM)
    older.mkdir(parents=True)
    for i in range(2):
        (older / f"process_{i:05d}-of-00002").write_bytes(b"process %d" % i)
    assert handler.restore(older, item.DataIteratorRestore(
        lambda count: shards_for(DataLayout(8, 0, 1), count))) == \
        {"count": 2, "states": {0: b"process 0", 1: b"process 1"}}
