"""`python -m t5lite.data_bench`: both pipelines read the same documents and report
examples per second and per busy-core second; packed rows count the examples in them."""
import json

import pytest

import train_helpers as th
from data_helpers import vocabulary


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_data_bench_compares_both_pipelines(tmp_path, tmp_path_factory):
    out = tmp_path / "bench.json"
    proc = th.run([th.sys.executable, "-m", "t5lite.data_bench",
                   f"--vocabulary={vocabulary(tmp_path_factory)}", "--documents=200",
                   "--batches=2", "--batch_size=8", f"--work_dir={tmp_path / 'work'}",
                   f"--json_out={out}"], timeout=600)
    assert proc.returncode == 0, th.describe(proc)
    rows = json.loads(out.read_text())["rows"]
    keys = {(r["pipeline"], r["targets"], r["pack"]) for r in rows}
    assert keys == {(p, t, k) for p in ("t5lite", "plain seqio") for t in (114, 128)
                    for k in (False, True)}
    for r in rows:
        assert r["examples_per_s"] > 0 and r["examples_per_core_s"] > 0 and r["cpu_s"] > 0
        # unpacked: one example a row; packed: at least one per row
        assert r["examples"] == 16 if not r["pack"] else r["examples"] >= 16
    assert "| t5lite | 512 / 114 | no |" in proc.stdout
    text = (tmp_path / "work" / "documents.txt").read_text().splitlines()
    pile = (tmp_path / "work" / "pile" / "train" / "00.jsonl").read_text().splitlines()
    assert [json.loads(l)["text"] for l in pile] == text   # the same documents


def test_data_bench_bad_arguments_are_one_line(tmp_path):
    proc = th.run([th.sys.executable, "-m", "t5lite.data_bench",
                   f"--vocabulary={tmp_path / 'none.model'}"])
    th.assert_one_error(proc, "--vocabulary", "is not a file")
    proc = th.run([th.sys.executable, "-m", "t5lite.data_bench", "--vocabulary=x",
                   "--batches=0"])
    th.assert_one_error(proc, "--batches must be a positive integer")


@pytest.mark.slow
def test_data_bench_measures_a_resume(tmp_path, tmp_path_factory):
    """--resume_rows: the saved state's size and the restore time at two positions,
    with the records parsed meanwhile (equal: the cost does not grow with the position)."""
    out = tmp_path / "resume.json"
    proc = th.run([th.sys.executable, "-m", "t5lite.data_bench",
                   f"--vocabulary={vocabulary(tmp_path_factory)}", "--documents=300",
                   "--resume_rows=4", "--batches=12", "--mean_chars=600",
                   f"--work_dir={tmp_path / 'work'}", f"--json_out={out}"], timeout=600)
    assert proc.returncode == 0, th.describe(proc)
    result = json.loads(out.read_text())
    early, late = result["batch_2"], result["batch_12"]
    for r in (early, late):
        assert r["state_bytes"] > 0 and r["restore_to_first_batch_s"] > 0
    assert late["records_parsed"] <= early["records_parsed"] + 64
    assert result["zstd_seek_bytes"] > 0 and result["zstd_seek_bytes_per_s"] > 0


@pytest.mark.slow
def test_data_bench_compares_the_file_formats(tmp_path, tmp_path_factory):
    """--formats: text_span_corruption on the same documents in each format, and the Pile
    reader on its Pile-layout shard, packed and not; each row reads its own file."""
    import gzip

    import pyarrow.parquet as pq
    import zstandard
    out = tmp_path / "formats.json"
    proc = th.run([th.sys.executable, "-m", "t5lite.data_bench",
                   f"--vocabulary={vocabulary(tmp_path_factory)}", "--formats",
                   "--documents=120", "--mean_chars=500", "--batches=2", "--batch_size=8",
                   "--rounds=1",
                   f"--work_dir={tmp_path / 'work'}", f"--json_out={out}"], timeout=600)
    assert proc.returncode == 0, th.describe(proc)
    rows = json.loads(out.read_text())["rows"]
    names = ["pile reader (.jsonl.zst)", "jsonl", "jsonl.gz", "jsonl.zst", "parquet"]
    assert [(r["pipeline"], r["pack"]) for r in rows] == \
        [(n, p) for p in (False, True) for n in names]
    for r in rows:
        assert r["examples_per_core_s"] > 0 and r["file_bytes"] > 0
        assert r["task"] == ("pile_span_corruption" if r["pipeline"] == names[0]
                             else "text_span_corruption")
        assert r["examples"] == 16 if not r["pack"] else r["examples"] >= 16
        assert r["rounds_examples_per_core_s"] == [r["examples_per_core_s"]]  # one round
    assert "| parquet |" in proc.stdout and "vs Pile reader" in proc.stdout
    readers = json.loads(out.read_text())["readers"]  # the reader alone, whole files
    assert [r["format"] for r in readers] == names[1:]
    for r in readers:
        assert r["documents"] == 120 and r["documents_per_core_s"] > 0
    assert len({round(r["text_mb"], 6) for r in readers}) == 1
    work = tmp_path / "work"
    text = (work / "documents.txt").read_text().splitlines()
    assert len(text) == 120
    lines = {"jsonl": (work / "formats" / "docs.jsonl").read_bytes(),
             "jsonl.gz": gzip.decompress((work / "formats" / "docs.jsonl.gz").read_bytes()),
             "jsonl.zst": zstandard.ZstdDecompressor().decompressobj().decompress(
                 (work / "pile" / "train" / "00.jsonl.zst").read_bytes())}
    for data in lines.values():  # the same documents in every file
        assert [json.loads(l)["text"] for l in data.decode().splitlines()] == text
    assert pq.read_table(work / "formats" / "docs.parquet").column("text").to_pylist() == text
