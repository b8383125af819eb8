"""t5lite.data.files.jsonl_cursor: reading a .jsonl / .jsonl.zst / .jsonl.gz from a saved
position gives exactly the records that follow it (zstd frames and gzip members that
split lines, shards by record), at a cost that does not depend on how much was read
before; missing shards are named; a gzip file that is cut short, corrupt or not gzip at
all is one error naming it."""
import gzip
import json
import os
import random
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from t5lite.data.files import jsonl_cursor as jc
from t5lite.data.files import readers
from t5lite.errors import DataError, DataFormatError, DataNotFoundError


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cursor")
    rng = random.Random(0)
    lines = [json.dumps({"text": f"doc {i} " + "é" * rng.randint(0, 2000)}) + "\n"
             for i in range(300)]
    lines.insert(7, "\n")  # an empty line is no record
    data = "".join(lines).encode()
    (d / "plain.jsonl").write_bytes(data)
    (d / "one_frame.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    c = zstandard.ZstdCompressor()
    (d / "frames.jsonl.zst").write_bytes(b"".join(  # frames that end inside lines
        c.compress(data[i:i + 7777]) for i in range(0, len(data), 7777)))
    (d / "c4-train.00000-of-01024.json.gz").write_bytes(gzip.compress(data))  # allenai/c4
    (d / "members.jsonl.gz").write_bytes(b"".join(  # bgzip-style blocks, then padding
        gzip.compress(data[i:i + 7777]) for i in range(0, len(data), 7777)) + b"\0" * 64)
    texts = [json.loads(line)["text"] for line in lines if line.strip()]
    table = pa.table({"id": list(range(len(texts))), "text": texts})  # FineWeb-style
    pq.write_table(table, d / "rows.parquet", row_group_size=37)
    return {p.name: str(p) for p in d.iterdir()}


def _reads(pool, path, position, n):
    """Every (texts, position) a pool returns reading `path` from `position` to its end
    (the last read returns no texts)."""
    out = []
    while True:
        texts, position = pool.read(path, position, n)
        out.append((texts, position))
        if not texts:
            return out


NAMES = ["plain.jsonl", "one_frame.jsonl.zst", "frames.jsonl.zst",
         "c4-train.00000-of-01024.json.gz", "members.jsonl.gz", "rows.parquet"]
MANY_FRAMES = ["frames.jsonl.zst", "members.jsonl.gz"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shard,shards", [(0, 1), (1, 3)])
def test_reading_from_any_saved_position_continues_the_file(files, name, shard, shards):
    """From every position the reader returned, a new pool (a restored run) reads the
    same texts AND returns the same positions to the end of the file, so that a state
    saved after a restore restores again (a reopened .jsonl.zst file once reported
    positions its skipped bytes too far: restores died at the file's end)."""
    path = files[name]
    everything = [json.loads(l)["text"] for l in open(files["plain.jsonl"]) if l.strip()]
    reads = _reads(jc.CursorPool("text", shard, shards), path, jc.START, 7)
    assert [t for texts, _ in reads for t in texts] == everything[shard::shards]
    size = os.path.getsize(path)
    assert all(p[4] == size and p[5] > 0 for _, p in reads)  # the file's identity
    for i, (_, saved) in enumerate(reads):
        assert _reads(jc.CursorPool("text", shard, shards), path, saved, 7) == reads[i + 1:] \
            or (i == len(reads) - 1)


def test_the_read_that_finds_the_end_reopens_nothing(files):
    for path in files.values():
        pool, position = jc.CursorPool(), jc.START
        texts, position = pool.read(path, position, 10 ** 6)  # the whole file, and its end
        before = dict(jc.STATS)
        assert pool.read(path, position, 5) == ([], position)
        assert jc.STATS["reopened"] == before.get("reopened", 0)
        assert jc.STATS["bytes_skipped"] == before.get("bytes_skipped", 0)


def test_a_closed_pool_reopens_each_file_where_it_was(files):
    """close(): as a new process would, the next read of each file reopens it at the
    position asked for and reads on exactly as before."""
    pool = jc.CursorPool()
    first = {n: pool.read(files[n], jc.START, 5) for n in NAMES}
    pool.close()
    reopened = jc.STATS["reopened"]
    for name in NAMES:
        expected = jc.CursorPool().read(files[name], first[name][1], 5)
        assert pool.read(files[name], first[name][1], 5) == expected
    assert jc.STATS["reopened"] - reopened == 2 * len(NAMES)  # ours and the fresh pool's


def _positions(path):
    return [p for _, p in _reads(jc.CursorPool(), path, jc.START, 5)]


@pytest.mark.parametrize("name", NAMES)
def test_a_changed_file_is_told_from_a_position_that_does_not_fit(files, tmp_path, name):
    path = tmp_path / name
    shutil.copyfile(files[name], path)
    saved = _positions(str(path))[10]
    # a copy (another modification time, the same bytes) is the same file
    texts, _ = jc.CursorPool().read(str(path), saved, 3)
    assert len(texts) == 3
    # a position that does not fit the unchanged file is our bug, and says so
    frame, offset = saved[:2]
    bad = [(frame, offset + 1) + saved[2:], (frame, offset + 10 ** 7) + saved[2:]]
    if name == "rows.parquet":  # (a row of another row group than the line says, too)
        bad += [(frame + 1, offset) + saved[2:], (10 ** 3, 0) + saved[2:]]
    if name in MANY_FRAMES:
        bad.append((frame + 1, 0) + saved[2:])  # no frame / member starts there
    for position in bad:
        with pytest.raises(DataError, match=r"does not fit the file .*which is the file "
                                            r"the position was saved in.*t5lite bug.*"
                                            r"delete the data_iterator directory"):
            jc.CursorPool().read(str(path), position, 3)
    # another file under the same name: the change is named, with both sizes
    data = path.read_bytes()
    path.write_bytes(data + data[:100] if name == "plain.jsonl" else data[:-100])
    with pytest.raises(DataError, match=rf"{name}: the file changed since the checkpoint "
                                        rf"was written \(it was {len(data)} bytes"):
        jc.CursorPool().read(str(path), saved, 3)
    with pytest.raises(DataError, match="changed since"):
        jc.CursorPool().read(str(path), saved[:4] + (len(data), saved[5] ^ 1), 3)


@pytest.mark.parametrize("name", MANY_FRAMES)
def test_resuming_in_a_many_frame_file_skips_at_most_one_frame(files, name):
    path = files[name]
    pool, position = jc.CursorPool(), jc.START
    for _ in range(60):
        _, position = pool.read(path, position, 4)
    assert position[0] > 0  # the position names a later frame
    before = dict(jc.STATS)
    jc.CursorPool().read(path, position, 1)
    assert jc.STATS["bytes_skipped"] - before.get("bytes_skipped", 0) < 7777
    assert jc.STATS["records_parsed"] - before.get("records_parsed", 0) == 1


def test_the_cursor_reads_what_the_plain_reader_reads(files):
    for path in files.values():
        assert list(jc.iter_texts(path)) == list(readers.iter_jsonl_texts(path))


def test_a_bad_record_comes_after_the_good_ones_before_it(tmp_path):
    good = [json.dumps({"text": f"t{i}"}) for i in range(5)]
    (tmp_path / "bad.jsonl").write_text("\n".join(good + ["{oops"] + good) + "\n")
    pool = jc.CursorPool()
    texts, position = pool.read(str(tmp_path / "bad.jsonl"), jc.START, 10)
    assert texts == [f"t{i}" for i in range(5)]
    with pytest.raises(DataFormatError, match=r"bad.jsonl:6: not JSON"):
        pool.read(str(tmp_path / "bad.jsonl"), position, 10)


def test_a_file_gone_since_listing_is_named(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"00.jsonl.zst: the file is gone"):
        jc.CursorPool().read(str(tmp_path / "00.jsonl.zst"), jc.START, 1)


def test_a_missing_pile_shard_is_named(tmp_path):
    pytest.importorskip("seqio")
    from t5lite.data import source_resolvers
    names = [str(tmp_path / f"{i:02d}.jsonl.zst") for i in (0, 1, 3, 4)]
    with pytest.raises(DataNotFoundError, match=r"shard 02.jsonl.zst is missing"):
        source_resolvers.check_numbered_shards(names)
    source_resolvers.check_numbered_shards(names[:2])  # a prefix 00-01 is a valid subset
    source_resolvers.check_numbered_shards([str(tmp_path / "val.jsonl.zst")])


@pytest.mark.parametrize("damage,message", [
    (lambda data: data[:len(data) // 2], r"truncated gzip file \(it ends inside a compressed "
                                        r"member\): the file was cut short"),
    (lambda data: data[:100] + bytes(b ^ 0x5A for b in data[100:200]) + data[200:],
     r"corrupt gzip data"),
    (lambda data: b"not gzip at all\n", r"not a gzip file \(a .gz file must start with the "
                                        r"gzip magic bytes\)"),
])
def test_a_damaged_gzip_file_is_one_error_naming_it(files, tmp_path, damage, message):
    path = tmp_path / "c4-train.00001-of-01024.json.gz"
    path.write_bytes(damage(open(files["c4-train.00000-of-01024.json.gz"], "rb").read()))
    with pytest.raises(DataFormatError, match=rf"c4-train.00001-of-01024.json.gz: {message}"):
        list(jc.iter_texts(str(path)))


def test_resuming_in_a_parquet_file_reads_one_row_group(files):
    path = files["rows.parquet"]
    pool, position = jc.CursorPool(), jc.START
    for _ in range(30):
        _, position = pool.read(path, position, 4)
    assert position[0] == 3  # row group 3 of 37-row groups
    before = dict(jc.STATS)
    texts, _ = jc.CursorPool().read(path, position, 2)
    assert len(texts) == 2
    assert jc.STATS["row_groups_read"] - before.get("row_groups_read", 0) == 1


def _parquet(path, **columns):
    pq.write_table(pa.table(columns), path, row_group_size=2)
    return str(path)


@pytest.mark.parametrize("columns,field,message", [
    ({"content": ["a", "b"]}, "text", r"no column 'text' \(its columns: content\); set "
                                      r"TEXT_FIELD"),
    ({"text": [1, 2]}, "text", r"column 'text' holds int64, not text"),
    ({"text": ["a", "b", None]}, "text", r"row 3: the 'text' column is null"),
])
def test_a_parquet_file_without_its_texts_is_one_error_naming_it(tmp_path, columns, field,
                                                                  message):
    path = _parquet(tmp_path / "shard-00.parquet", **columns)
    with pytest.raises(DataFormatError, match=rf"shard-00.parquet: {message}"):
        list(jc.iter_texts(path, field))


@pytest.mark.parametrize("damage", [lambda data: data[:len(data) // 2],
                                    lambda data: b"not parquet\n" * 10])
def test_a_damaged_parquet_file_is_one_error_naming_it(tmp_path, damage):
    path = _parquet(tmp_path / "shard-01.parquet", text=["a", "b", "c"])
    (tmp_path / "shard-01.parquet").write_bytes(damage((tmp_path / "shard-01.parquet")
                                                       .read_bytes()))
    with pytest.raises(DataFormatError, match=r"shard-01.parquet: not a readable Parquet "
                                              r"file \("):
        list(jc.iter_texts(path))
