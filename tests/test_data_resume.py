"""Resume without replay: a data iterator restored from its saved state continues the
uninterrupted stream batch for batch, and restoring at a late position parses no more
records than restoring at an early one (counted by the Pile reader, jsonl_cursor.STATS),
for packed and unpacked span corruption, one and two processes, mixtures and TFDS."""
import json

import numpy as np
import pytest

from t5lite.data.sharding.layout import DataLayout  # noqa: E402

from data_helpers import (data_env, mnli_squad_mixture, pile, pile_tfds,  # noqa: F401
                          restored_data_settings, vocabulary)

pytest.importorskip("seqio")

from t5lite.data.files import jsonl_cursor  # noqa: E402
from t5lite.data import pipeline, sources

EARLY, LATE, AFTER = 2, 60, 3
LENGTHS = {"inputs": 32, "targets": 8}


def _make(task="pile_span_corruption", batch_size=4, process_index=0, process_count=1,
          **kwargs):
    args = dict(split="train", feature_lengths=LENGTHS, pack=False,
                shuffle=True, seed=5, shuffle_buffer_size=16)
    args.update(kwargs)
    return pipeline.make_iterator(
        task, layout=DataLayout(batch_size, process_index, process_count), **args)


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _through_json(state):
    """A state as a checkpoint gives it back (JSON item + this process's bytes)."""
    iterator = state.get("iterator")
    out = json.loads(json.dumps({k: v for k, v in state.items() if k != "iterator"}))
    if iterator is not None:
        out["iterator"] = {"count": iterator["count"],
                           "states": {s: bytes(b) for s, b in iterator["states"].items()}}
    return out


def _resume_cost(make, state, expected):
    """Records the reader parses to restore `state` and read AFTER batches (checked
    against `expected`)."""
    before = jsonl_cursor.STATS["records_parsed"]
    it = make()
    it.set_state(_through_json(state))
    for want in expected:
        assert _same(next(it), want)
    return jsonl_cursor.STATS["records_parsed"] - before


# Unpacked on one process, and packed on process 1 of 2: a packed stream's state (its
# partial packs) and a process's data shard, each a case of its own before, restore in one
# (process 0 of 2 restoring its shard's state: tests/test_data_shards.py, 1 -> 2).
@pytest.mark.parametrize("pack,process,processes", [(False, 0, 1), (True, 1, 2)],
                         ids=["unpacked-1_process", "packed-process_1_of_2"])
def test_late_resume_costs_no_more_than_early_and_continues_the_stream(pile, pack, process,
                                                                       processes):
    """The states are saved by the uninterrupted run as it reads (as training saves,
    mid-stream), and a resume from each continues its batches."""
    run = _make(pack=pack, batch_size=4 * processes, process_index=process,
                process_count=processes)
    batches, states = [], {}
    for position in range(1, LATE + AFTER + 1):
        batches.append(next(run))
        if position in (EARLY, LATE):
            states[position] = run.get_state()
    run.close()  # its readers stop: they parse nothing while a resume is counted

    def make():
        return _make(pack=pack, batch_size=4 * processes, process_index=process,
                     process_count=processes)
    cost = {p: _resume_cost(make, s, batches[p:p + AFTER]) for p, s in states.items()}
    replay = _resume_cost(make, {k: v for k, v in states[LATE].items()
                                 if k != "iterator"}, batches[LATE:LATE + AFTER])
    # the saved state holds the shuffle buffer and the files' positions: a late resume
    # parses what the next batches need (plus what the prefetching reads ahead, two
    # chunks of each open file at most), like an early one; a replay parses it all
    slack = 2 * 4 * 3
    assert cost[LATE] <= cost[EARLY] + slack, (cost, replay)
    assert replay > 2 * cost[LATE], (cost, replay)


def test_the_state_is_per_process_and_names_its_stream(pile):
    a, b = (_make(batch_size=8, process_index=i, process_count=2) for i in range(2))
    next(a), next(b)
    sa, sb = a.get_state(), b.get_state()
    assert sa["iterator"]["states"].keys() == {0} and sb["iterator"]["states"].keys() == {1}
    # the inputs (vocabulary, every file of the split) are the stream's, not the shard's
    assert sa["inputs"] == sb["inputs"] and len(sa["inputs"]["files"]) == 3
    assert sa["inputs"]["vocabulary"]["extra_ids"] == 100
    assert {k: v for k, v in sa.items() if k not in ("iterator", "inputs")} == {
        "position": 1, "task": "pile_span_corruption", "split": "train", "seed": 5,
        "batch_size": 8, "data_shards": 2, "pack": False, "feature_lengths": LENGTHS,
        "bos_id": 0, "iterator_format": pipeline.ITERATOR_FORMAT}


def test_an_earlier_iterator_format_is_replayed_not_restored(pile, caplog):
    """A state whose readers' layout is not this t5lite's (an earlier checkpoint: the
    Pile reader's positions were four integers) would restore positions the readers
    cannot take: it is replayed, exactly."""
    run = _make()  # saved after 4 batches, mid-stream
    batches = [next(run) for _ in range(4)]
    state = _through_json(run.get_state())
    batches += [next(run) for _ in range(2)]
    del state["iterator_format"]
    resumed = _make()
    with caplog.at_level("INFO", logger="t5lite"):
        resumed.set_state(state)
        assert all(_same(next(resumed), b) for b in batches[4:])
    assert "written by an earlier t5lite" in caplog.text
    assert "rebuilding the stream and skipping the 4 batches" in caplog.text


def test_a_mixture_of_in_memory_tasks_resumes_from_its_state(tmp_path, monkeypatch,
                                                             tmp_path_factory):
    lengths = {"inputs": 128, "targets": 16}
    with mnli_squad_mixture(tmp_path, monkeypatch, tmp_path_factory,
                            "t5lite_test_mnli_squad") as name:
        run = _make(name, feature_lengths=lengths)  # saved after 7 batches, mid-stream
        batches = [next(run) for _ in range(7)]
        state = _through_json(run.get_state())
        batches += [next(run) for _ in range(5)]
        resumed = _make(name, feature_lengths=lengths)
        resumed.set_state(state)
        assert all(_same(next(resumed), b) for b in batches[7:])


def test_a_tfds_source_resumes_from_its_state(tmp_path, monkeypatch, tmp_path_factory):
    tfds_dir = tmp_path / "tfds"
    pile_tfds(str(tfds_dir), {"train": 40, "validation": 4, "test": 4})
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), tfds_data_dir=tfds_dir)
    run = _make()  # saved after 6 batches, mid-stream
    batches = [next(run) for _ in range(6)]
    state = _through_json(run.get_state())
    batches += [next(run) for _ in range(4)]
    resumed = _make()
    resumed.set_state(state)
    assert all(_same(next(resumed), b) for b in batches[6:])


def test_a_stream_tf_data_cannot_save_falls_back_to_replay(pile, monkeypatch, caplog):
    """A task whose source is a Python generator cannot be saved by tf.data: no state
    is stored (never one that would restore another stream) and a resume replays."""
    import tensorflow as tf
    real = sources.TextFilesSource.get_dataset

    def through_a_generator(self, *args, **kwargs):
        texts = [t["text"] for t in real(self, *args, **kwargs).as_numpy_iterator()]
        return tf.data.Dataset.from_generator(
            lambda: ({"text": t} for t in texts),
            output_signature={"text": tf.TensorSpec([], tf.string)})

    monkeypatch.setattr(sources.TextFilesSource, "get_dataset", through_a_generator)
    run = _make()  # saved after 4 batches, mid-stream: the run reads on
    batches = [next(run) for _ in range(4)]
    with caplog.at_level("WARNING"):
        state = run.get_state()
    assert "iterator" not in state and "cannot be saved" in caplog.text
    batches += [next(run) for _ in range(2)]
    resumed = _make()
    resumed.set_state(_through_json(state))
    assert all(_same(next(resumed), b) for b in batches[4:])
