"""A data stream restored from the state saved at ANY point continues the uninterrupted
stream exactly, across file ends and passes (the property a preempted run relies on).

Data: four Pile-style shards of different sizes: a many-frame .jsonl.zst whose frames
end inside lines, a plain .jsonl (an empty line, no newline at its end), a one-frame
.jsonl.zst, and another many-frame .jsonl.zst; and the reader's other formats (source
level): a many-member .json.gz (members ending inside lines, zero padding), a Parquet
file of 2-row groups, a one-member .jsonl.gz.

    source level    every element k of two passes and more (so saves exactly at each
                    file's end and each pass's end are among them), files in order and
                    shuffled, one shard, one of two shards (whole files), a shard of
                    records (more shards than files); the in-memory source too
    pipeline level  every batch k of span corruption (packed on process 1 of two; a
                    mixture with MNLI, unpacked on one process), of text_span_corruption
                    and text_lm on TEXT_FILES of the other formats (each pair of task,
                    packing and process count), and of a weighted blend of TEXT_FILES;
                    saved states whose reader is inside each file (the Pile shards and
                    the other formats in one stream), over more than two passes

Each restore builds the stream anew and first closes every file any reader pool holds
open, as a new process would start: in one process a restored pipeline was seen reading
through the saved run's pool, whose reader of a file can be at the very position
restored (the same record of a later pass), so it never reopened the file.
"""
from __future__ import annotations

import gc
import gzip
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from data_helpers import data_env, reset_data_settings, vocabulary

pytest.importorskip("seqio")

import seqio  # noqa: E402

from t5lite.data import pipeline, source_resolvers, sources, stream_errors  # noqa: E402
from t5lite.data.files import demo_corpus
from t5lite.data.files import jsonl_cursor, readers
from t5lite.data.sharding.layout import DataLayout  # noqa: E402

WORDS = ("red green blue black white stone river cloud field light house garden "
         "winter summer").split()
KINDS = {"00.jsonl.zst": "frames", "01.jsonl": "plain", "02.jsonl.zst": "one_frame",
         "03.jsonl.zst": "frames"}
SIZES = {"00.jsonl.zst": 5, "01.jsonl": 2, "02.jsonl.zst": 7, "03.jsonl.zst": 4}
# span corruption concatenates 128 documents at a time, within a pass: a stream's pass
# must hold more than that for the reader to stop inside files between batches
LARGE = {"00.jsonl.zst": 151, "01.jsonl": 91, "02.jsonl.zst": 121, "03.jsonl.zst": 110}
LARGE_OTHER = {"00.json.gz": 181, "01.parquet": 163, "02.jsonl.gz": 127}


def _docs(name: str, n: int):
    rng = random.Random(name)
    return [{"text": f"{name[:2]}x{i} " + " ".join(rng.choice(WORDS)
                                                  for _ in range(rng.randint(0, 2))),
             "meta": {"pile_set_name": "test"}} for i in range(n)]


def _write(path, docs, kind: str) -> None:
    lines = [json.dumps(d) + "\n" for d in docs]
    if kind.startswith("parquet"):  # row groups of 2 (or parquet_N: of N)
        pq.write_table(pa.Table.from_pylist(docs), path,
                       row_group_size=int(kind.partition("_")[2] or 2))
        return
    if kind == "gzip_one":
        path.write_bytes(gzip.compress("".join(lines).encode()))
        return
    if kind == "gzip":  # members of 50 bytes, most ending inside a line, then padding
        data = "".join(lines).encode()
        path.write_bytes(b"".join(gzip.compress(data[i:i + 50])
                                  for i in range(0, len(data), 50)) + b"\0" * 8)
        return
    if kind == "plain":  # an empty line (no record) and no newline at the end
        lines.insert(1, "\n")
        path.write_bytes("".join(lines).rstrip("\n").encode())
        return
    data = "".join(lines).encode()
    c = zstandard.ZstdCompressor()
    if kind == "one_frame":
        path.write_bytes(c.compress(data))
    else:  # frames of 50 bytes: most end inside a line
        path.write_bytes(b"".join(c.compress(data[i:i + 50]) for i in range(0, len(data), 50)))


def _write_shards(directory, sizes, kinds=None):
    for name, n in sizes.items():
        _write(directory / name, _docs(name, n), (kinds or KINDS)[name])
    return [str(directory / name) for name in sizes]


# C4's and FineWeb's formats: a many-member .json.gz, a Parquet file of 2-row groups, and
# a one-member .jsonl.gz (a resume inside it decompresses up to the position)
OTHER_KINDS = {"00.json.gz": "gzip", "01.parquet": "parquet", "02.jsonl.gz": "gzip_one"}
OTHER_SIZES = {"00.json.gz": 5, "01.parquet": 7, "02.jsonl.gz": 4}


@pytest.fixture(scope="module")
def other_formats(tmp_path_factory):
    directory = tmp_path_factory.mktemp("other_formats")
    return _write_shards(directory, OTHER_SIZES, OTHER_KINDS)


@pytest.fixture(scope="module")
def large_other_formats(tmp_path_factory):
    # row groups of 5: reads of 3 rows mostly stop inside a group
    return _write_shards(tmp_path_factory.mktemp("large_other_formats"), LARGE_OTHER,
                         {**OTHER_KINDS, "01.parquet": "parquet_5"})


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return _write_shards(tmp_path_factory.mktemp("shards"), SIZES)


@pytest.fixture(scope="module")
def large_shards(tmp_path_factory):
    return _write_shards(tmp_path_factory.mktemp("large_shards"), LARGE)


POOLS: list = []  # every reader pool made in a test


@pytest.fixture(autouse=True)
def _fine_reads(monkeypatch):
    monkeypatch.setattr(sources, "TEXTS_PER_CALL", 3)  # several reads per file
    made = jsonl_cursor.CursorPool.__init__

    def init(pool, *args, **kwargs):
        made(pool, *args, **kwargs)
        POOLS.append(pool)
    monkeypatch.setattr(jsonl_cursor.CursorPool, "__init__", init)
    yield
    POOLS.clear()
    reset_data_settings()


def _as_a_new_process():
    for pool in POOLS:
        pool.close()


def _open(build, state=None):
    """(the tf.data iterator, its numpy elements) of a new stream `build()`, restored to
    `state` if given. A reader's error parked inside tf.data is raised by the elements,
    as in training (t5lite/data/stream_errors.py)."""
    with stream_errors.stream_scope() as stream:
        iterator = iter(build())
    if state is not None:
        pipeline.restore_iterator(iterator, state)
    return iterator, stream_errors.numpy_iterator(iterator, stream)


def _check_every_save_point(build, total):
    """For every k < total: the stream restored from the state saved after k elements
    yields the uninterrupted stream's elements k..total-1. Returns the reference."""
    run, elements = _open(build)
    reference, states = [], []
    for _ in range(total):
        states.append(pipeline.save_iterator(run))
        reference.append(_value(next(elements)))
    for k, state in enumerate(states):
        _as_a_new_process()
        _, resumed = _open(build, state)
        for j in range(k, total):
            got = _value(next(resumed))
            assert got == reference[j], (f"restored after {k} elements, element {j} "
                                         f"differs: {got} != {reference[j]}")
    return reference


def _value(element):
    if isinstance(element, dict):
        return {k: _value(v) for k, v in element.items()}
    if isinstance(element, bytes):
        return element.decode()
    return element.item() if np.ndim(element) == 0 else element.tolist()


# -- source level --------------------------------------------------------------------------
# Shard 1 of 2 (files 1 and 3, whole) for whole-file sharding: shard 0 of 2 (files 0
# and 2) reads no kind of file, and takes its files no other way, than it and shard 0
# of 1 (every file) do.
CASES = [(shuffle, shard, count, 3) for shuffle in (False, True)
         for shard, count in ((0, 1), (1, 2), (3, 5))] + [(False, 0, 1, 1)]


@pytest.mark.parametrize("shuffle,shard,shards_n,per_call", CASES, ids=[
    f"{'shuffled' if c[0] else 'in_order'}-shard_{c[1]}_of_{c[2]}-{c[3]}_per_read"
    for c in CASES])
def test_the_pile_reader_resumes_exactly_from_every_element(shards, monkeypatch, shuffle,
                                                            shard, shards_n, per_call):
    """With 3 texts a read, the read that returns a file's last texts also finds its end
    (SIZES are not multiples of 3); with 1, another read does."""
    _check_reader(shards, SIZES, monkeypatch, shuffle, shard, shards_n, per_call)


OTHER_CASES = [(False, 0, 1, 3), (True, 1, 2, 3), (False, 0, 1, 1), (False, 3, 4, 3)]


@pytest.mark.parametrize("shuffle,shard,shards_n,per_call", OTHER_CASES)
def test_the_reader_resumes_exactly_in_gzip_and_parquet_files(other_formats, monkeypatch,
                                                              shuffle, shard, shards_n,
                                                              per_call):
    _check_reader(other_formats, OTHER_SIZES, monkeypatch, shuffle, shard, shards_n,
                  per_call)


def _check_reader(files, sizes, monkeypatch, shuffle, shard, shards_n, per_call):
    """The reader over `files`, restored after every element of two passes and more."""
    monkeypatch.setattr(sources, "TEXTS_PER_CALL", per_call)
    source = sources.TextFilesSource({"train": files})
    info = seqio.ShardInfo(index=shard, num_shards=shards_n)

    def build(epochs=None):
        return source.get_dataset("train", shuffle=shuffle, seed=3,
                                  shard_info=info).repeat(epochs)

    one_pass = [e["text"] for e in map(_value, _open(lambda: build(1))[1])]
    per_pass = len(one_pass)
    total = 2 * per_pass + 3
    reference = [e["text"] for e in _check_every_save_point(build, total)]
    assert reference[:per_pass] == reference[per_pass:2 * per_pass] == one_pass
    if not shuffle:
        # the saves exactly at a file's end (after its last record) and at a pass's end
        # are among those checked: name them, so that the test says it
        file_of = [t[:2] for t in one_pass]
        file_ends = [k + 1 for k in range(per_pass - 1) if file_of[k] != file_of[k + 1]]
        assert len(file_ends) == len(set(file_of)) - 1 >= 1
        assert all(k < total for k in file_ends + [per_pass, 2 * per_pass])
    if not shuffle and shards_n == 1:  # the files one after the other, whole
        assert [t.split()[0] for t in one_pass] == [
            f"{i:02d}x{d}" for i, n in enumerate(sizes.values()) for d in range(n)]


def test_the_in_memory_source_resumes_exactly_from_every_element(tmp_path):
    files = demo_corpus.write_multinli(str(tmp_path / "mnli"), train=11, dev=3)
    source = sources.ExamplesSource({"train": files["train"]}, readers.read_mnli,
                                    source_resolvers.MNLI_SIGNATURE)
    for shard, count in ((0, 1), (1, 2)):
        info = seqio.ShardInfo(index=shard, num_shards=count)
        per_pass = len(source.get_dataset("train", seed=2, shard_info=info))
        reference = _check_every_save_point(
            lambda: source.get_dataset("train", seed=2, shard_info=info).repeat(),
            2 * per_pass + 2)
        assert [r["idx"] for r in reference[:per_pass]] == \
            [r["idx"] for r in reference[per_pass:2 * per_pass]]


# -- pipeline level --------------------------------------------------------------------------
TASK = "t5lite_test_four_shards"


def _register(name, files):
    """pile_span_corruption's preprocessing over `files`."""
    pile = seqio.TaskRegistry.get("pile_span_corruption")
    seqio.TaskRegistry.add(name, source=sources.TextFilesSource({"train": files}),
                           preprocessors=pile.preprocessors,
                           output_features=pile.output_features)


@pytest.fixture
def task(shards, tmp_path, monkeypatch, tmp_path_factory):
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory))
    _register(TASK, shards)
    yield TASK
    seqio.TaskRegistry.remove(TASK)


class _ReadLog:
    """What the reader did: how many times it began a file, and the positions inside
    files that it reopened a file at (after a restore)."""

    def __init__(self, monkeypatch):
        self.starts, self.reopened = 0, []
        real_read, real_open = jsonl_cursor.CursorPool.read, jsonl_cursor.CursorPool._open_at

        def read(pool, path, position, n):
            self.starts += tuple(position)[:4] == jsonl_cursor.START[:4]
            return real_read(pool, path, position, n)

        def open_at(pool, path, position):
            if tuple(position)[:4] != jsonl_cursor.START[:4]:
                self.reopened.append((path, tuple(int(p) for p in position[:4])))
            return real_open(pool, path, position)
        monkeypatch.setattr(jsonl_cursor.CursorPool, "read", read)
        monkeypatch.setattr(jsonl_cursor.CursorPool, "_open_at", open_at)


def _same_batch(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _check_restores(make, states, reference):
    """Each (k, state): a new stream restored from it yields reference[k:]."""
    for k, state in states:
        _as_a_new_process()
        resumed = make()
        resumed.set_state(state)
        for j in range(k, len(reference)):
            assert _same_batch(next(resumed), reference[j]), \
                f"restored at batch {k}: batch {j} differs from the uninterrupted run's"


def _check_every_batch(make, monkeypatch, files_per_stream, least=4, most=12):
    """Every batch k of the stream, for at least `least` batches and until its reader
    has begun a third pass over its files: the stream restored at k yields the
    uninterrupted stream's batches from k on, to the end. (Span corruption concatenates
    the documents of a pass 128 at a time, so with these small files the reader reads a
    whole pass at once; the source-level tests above cover every reader position, and
    the next test a reader restored inside its files.)"""
    log = _ReadLog(monkeypatch)
    run = make()
    reference, states = [], []
    while len(reference) < least or log.starts <= 2 * files_per_stream:
        assert len(reference) < most, f"{most} batches, {log.starts} file starts"
        reference.append(next(run))
        states.append((len(reference), run.get_state()))
    reference += [next(run) for _ in range(2)]
    _check_restores(make, states, reference)


LENGTHS = {"inputs": 32, "targets": 8}


def test_the_pipeline_resumes_exactly_from_every_batch(task, monkeypatch):
    """Packed, on process 1 of two, as in the text-files test below: process 0's shard is
    the same code path and the same restore (at a pass's end: these small files are read
    a pass at once) over the other two files, which one process reads as well. The same
    stream unpacked on one process is the mixture's below (it restores this task's
    stream with MNLI's); unpacked on process 1 of 2 and packed on one process, the
    text-files test's."""
    def make():
        return pipeline.make_iterator(task, split="train", feature_lengths=LENGTHS,
                                      layout=DataLayout(8, 1, 2), pack=True,
                                      seed=1, shuffle_buffer_size=4)
    _check_every_batch(make, monkeypatch, 4 // 2)


def test_a_mixture_resumes_exactly_from_every_batch(task, tmp_path, monkeypatch,
                                                    tmp_path_factory):
    """The Pile-style shards' task, unpacked on one process, and MNLI: each source's
    stream and the schedule's position restore together."""
    demo_corpus.write_multinli(str(tmp_path / "mnli"), train=20, dev=3)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), mnli_dir=tmp_path / "mnli")
    name = "t5lite_test_shards_and_mnli"
    seqio.MixtureRegistry.add(name, [(task, 1.0), ("mnli", 1.0)])
    try:
        def make():
            return pipeline.make_iterator(name, split="train", feature_lengths=LENGTHS,
                                          layout=DataLayout(8), seed=1, shuffle_buffer_size=4)
        _check_every_batch(make, monkeypatch, 4)
    finally:
        seqio.MixtureRegistry.remove(name)


# Each pair of a task, packing or not and a process count, once (the restore of a task's
# preprocessing, of partial packs and of a process's shard do not depend on one another:
# all eight combinations proved the same thing twice over)
TEXT_CASES = [("text_span_corruption", LENGTHS, "encoder_decoder", False, 0, 1),
              ("text_span_corruption", LENGTHS, "encoder_decoder", True, 1, 2),
              ("text_lm", {"targets": 16}, "decoder_only", False, 1, 2),
              ("text_lm", {"targets": 16}, "decoder_only", True, 0, 1)]


@pytest.mark.parametrize("name,lengths,kind,pack,process,processes", TEXT_CASES, ids=[
    f"{'1_process' if c[5] == 1 else 'process_1_of_2'}-{'packed' if c[3] else 'unpacked'}"
    f"-{'lm' if c[0] == 'text_lm' else 'span_corruption'}" for c in TEXT_CASES])
def test_text_files_resume_exactly_from_every_batch(other_formats, tmp_path, monkeypatch,
                                                    tmp_path_factory, name, lengths, kind,
                                                    pack, process, processes):
    """The text tasks as a user runs them: TEXT_FILES naming a many-member .json.gz, a
    Parquet file of 2-row groups and a one-member .jsonl.gz."""
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory),
             text_files=":".join(other_formats))

    def make():
        return pipeline.make_iterator(name, split="train", feature_lengths=lengths,
                                      layout=DataLayout(8, process, processes), pack=pack,
                                      model_kind=kind, seed=1, shuffle_buffer_size=4)
    # with 2 processes and 3 files, process 1 reads file 1 (whole files: file i, i+2, ...)
    _check_every_batch(make, monkeypatch, len(other_formats[process::processes]))


def test_a_weighted_text_blend_resumes_exactly_from_every_batch(
        other_formats, shards, tmp_path, monkeypatch, tmp_path_factory):
    """TEXT_FILES as a blend (t5lite/data/blend.py): the Pile-style shards at 0.7 and the
    other formats at 0.3, each converted on its own, then blended row by row: the
    schedule's position and every source's readers restore together. On process 1 of 2
    (each source's shard of records); a blend restored on one process is the mixture's
    above (a SeqIO mixture is blended by the same code)."""
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory),
             text_files=json.dumps([[shards[0], 0.7], [other_formats[1], 0.3]]))

    def make():
        return pipeline.make_iterator("text_lm", split="train", feature_lengths={"targets": 16},
                                      layout=DataLayout(8, 1, 2),
                                      model_kind="decoder_only", seed=1, shuffle_buffer_size=4)
    _check_every_batch(make, monkeypatch, 2)


def test_a_pipeline_restored_inside_its_files_reads_on_past_their_ends(
        large_shards, large_other_formats, tmp_path, monkeypatch, tmp_path_factory):
    """Passes of 944 documents (TEXT_FILES naming the Pile-style shards, zstd and jsonl,
    and the other formats, gzip and Parquet: one stream for both, where each had its
    own), read 128 at a time by span corruption: the reader stops inside files between
    batches. The stream restored from every batch of 12 (the saved run stopped first, its
    reader by then past two passes) reopens every file inside it, Parquet inside a row
    group, and reads on through the files' ends and into the next pass exactly as the
    uninterrupted stream does. (12 batches, each restore reading on to batch 16: the
    reader begins a pass about every 7 batches, its 7 files side by side (interleaved),
    so the restores from the middle of a pass reopen every file or nearly; with save
    points over more than a whole pass, which of them does so does not hang on where the
    reader threads stood at each save (8 batches did in 5 runs of 5, a margin too thin
    for an assertion on thread timing).)"""
    files = large_shards + large_other_formats
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), text_files=":".join(files))

    def make():
        return pipeline.make_iterator("text_span_corruption", split="train",
                                      layout=DataLayout(8), seed=1,
                                      feature_lengths={"inputs": 128, "targets": 32},
                                      shuffle_buffer_size=4)
    log = _ReadLog(monkeypatch)
    run = make()
    reference, states = [], []
    for _ in range(12):  # the reader runs ahead: past two passes
        reference.append(next(run))
        states.append((len(reference), run.get_state()))
    assert log.starts > 2 * len(files)
    reference += [next(run) for _ in range(4)]
    del run  # its reader threads stop: every reopening below is a restore's
    gc.collect()
    _check_restores(make, states, reference)
    reopened = {path for path, _ in log.reopened}
    assert reopened == set(files), f"no restore reopened {set(files) - reopened}"
    # a Parquet position inside a row group
    assert any(path.endswith(".parquet") and position[1] > 0
               for path, position in log.reopened), log.reopened
