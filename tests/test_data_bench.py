"""`python -m t5lite.data_bench`: both pipelines read the same documents and report
examples per second and per busy-core second; packed rows count the examples in them.

The three benchmarks (the comparison, --resume_rows, --formats) run through data_bench's
main one after another in one interpreter (`benches`): one import of TensorFlow and SeqIO,
and autograph converts the preprocessors they share once, not three times (measured: 79 ->
45 CPU seconds). The command's own `python -m` start, its argument checks and its one-line
errors, is test_data_bench_bad_arguments_are_one_line's real subprocess."""
import json

import pytest

import train_helpers as th
from data_helpers import vocabulary


@pytest.fixture(scope="module")
def benches(tmp_path_factory):
    """{"compare" | "resume" | "formats": (CompletedProcess, its work dir, its JSON)}: the
    three runs the slow tests read, by data_bench's main in one interpreter (th.run_mains)."""
    vocab = vocabulary(tmp_path_factory)
    root = tmp_path_factory.mktemp("data_bench")
    args = {
        "compare": ["--documents=200", "--batches=2", "--batch_size=8"],
        "resume": ["--documents=300", "--resume_rows=4", "--batches=12", "--mean_chars=600"],
        "formats": ["--formats", "--documents=120", "--mean_chars=500", "--batches=2",
                    "--batch_size=8", "--rounds=1"],
    }
    argvs = [[f"--vocabulary={vocab}", *a, f"--work_dir={root / name / 'work'}",
              f"--json_out={root / name / 'out.json'}"] for name, a in args.items()]
    procs = th.run_mains(argvs, module="t5lite.data_bench", timeout=1200)
    return {name: (proc, root / name / "work", json.loads((root / name / "out.json").read_text()))
            for name, proc in zip(args, procs)}


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_data_bench_compares_both_pipelines(benches):
    proc, work, result = benches["compare"]
    assert proc.returncode == 0, th.describe(proc)
    rows = result["rows"]
    keys = {(r["pipeline"], r["targets"], r["pack"]) for r in rows}
    assert keys == {(p, t, k) for p in ("t5lite", "plain seqio") for t in (114, 128)
                    for k in (False, True)}
    for r in rows:
        assert r["examples_per_s"] > 0 and r["examples_per_core_s"] > 0 and r["cpu_s"] > 0
        # unpacked: one example a row; packed: at least one per row
        assert r["examples"] == 16 if not r["pack"] else r["examples"] >= 16
    assert "| t5lite | 512 / 114 | no |" in proc.stdout
    text = (work / "documents.txt").read_text().splitlines()
    pile = (work / "pile" / "train" / "00.jsonl").read_text().splitlines()
    assert [json.loads(l)["text"] for l in pile] == text   # the same documents


def test_data_bench_bad_arguments_are_one_line(tmp_path):
    proc = th.run([th.sys.executable, "-m", "t5lite.data_bench",
                   f"--vocabulary={tmp_path / 'none.model'}"])
    th.assert_one_error(proc, "--vocabulary", "is not a file")
    proc = th.run([th.sys.executable, "-m", "t5lite.data_bench", "--vocabulary=x",
                   "--batches=0"])
    th.assert_one_error(proc, "--batches must be a positive integer")


@pytest.mark.slow
def test_data_bench_measures_a_resume(benches):
    """--resume_rows: the saved state's size and the restore time at two positions,
    with the records parsed meanwhile (equal: the cost does not grow with the position)."""
    proc, _, result = benches["resume"]
    assert proc.returncode == 0, th.describe(proc)
    early, late = result["batch_2"], result["batch_12"]
    for r in (early, late):
        assert r["state_bytes"] > 0 and r["restore_to_first_batch_s"] > 0
    assert late["records_parsed"] <= early["records_parsed"] + 64
    assert result["zstd_seek_bytes"] > 0 and result["zstd_seek_bytes_per_s"] > 0


@pytest.mark.slow
def test_data_bench_compares_the_file_formats(benches):
    """--formats: text_span_corruption on the same documents in each format, and the Pile
    reader on its Pile-layout shard, packed and not; each row reads its own file."""
    import gzip

    import pyarrow.parquet as pq
    import zstandard
    proc, work, result = benches["formats"]
    assert proc.returncode == 0, th.describe(proc)
    rows = result["rows"]
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
    readers = result["readers"]  # the reader alone, whole files
    assert [r["format"] for r in readers] == names[1:]
    for r in readers:
        assert r["documents"] == 120 and r["documents_per_core_s"] > 0
    assert len({round(r["text_mb"], 6) for r in readers}) == 1
    text = (work / "documents.txt").read_text().splitlines()
    assert len(text) == 120
    lines = {"jsonl": (work / "formats" / "docs.jsonl").read_bytes(),
             "jsonl.gz": gzip.decompress((work / "formats" / "docs.jsonl.gz").read_bytes()),
             "jsonl.zst": zstandard.ZstdDecompressor().decompressobj().decompress(
                 (work / "pile" / "train" / "00.jsonl.zst").read_bytes())}
    for data in lines.values():  # the same documents in every file
        assert [json.loads(l)["text"] for l in data.decode().splitlines()] == text
    assert pq.read_table(work / "formats" / "docs.parquet").column("text").to_pylist() == text
