"""t5lite.data.jsonl_cursor: reading a .jsonl / .jsonl.zst from a saved position gives
exactly the records that follow it (frames that split lines, shards by record), at a
cost that does not depend on how much was read before; missing shards are named."""
import json
import random

import pytest
import zstandard

from t5lite.data import jsonl_cursor as jc
from t5lite.data import readers
from t5lite.errors import DataFormatError, DataNotFoundError


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
    return {p.name: str(p) for p in d.iterdir()}


@pytest.mark.parametrize("name", ["plain.jsonl", "one_frame.jsonl.zst", "frames.jsonl.zst"])
@pytest.mark.parametrize("shard,shards", [(0, 1), (1, 3)])
def test_reading_from_any_saved_position_continues_the_file(files, name, shard, shards):
    path = files[name]
    everything = [json.loads(l)["text"] for l in open(files["plain.jsonl"]) if l.strip()]
    expected = everything[shard::shards]
    pool, position, seen = jc.CursorPool("text", shard, shards), jc.START, []
    positions = []
    while True:
        positions.append((position, len(seen)))
        texts, position = pool.read(path, position, 3)
        if not texts:
            break
        seen += texts
    assert seen == expected
    for saved, k in positions[::5]:
        texts, _ = jc.CursorPool("text", shard, shards).read(path, saved, 4)
        assert texts == expected[k:k + 4]


def test_resuming_in_a_many_frame_file_skips_at_most_one_frame(files):
    path = files["frames.jsonl.zst"]
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
    from t5lite.data import sources
    names = [str(tmp_path / f"{i:02d}.jsonl.zst") for i in (0, 1, 3, 4)]
    with pytest.raises(DataNotFoundError, match=r"shard 02.jsonl.zst is missing"):
        sources.check_numbered_shards(names)
    sources.check_numbered_shards(names[:2])  # a prefix 00-01 is a valid subset
    sources.check_numbered_shards([str(tmp_path / "val.jsonl.zst")])
