"""Input-pipeline throughput by corpus format: `text_span_corruption` reading the same
documents as .jsonl, .jsonl.gz (one gzip member, as a C4 shard), .jsonl.zst (one zstd
frame, as a Pile shard) and .parquet (a `text` column in row groups), against the Pile
reader itself (`pile_span_corruption` on a Pile-layout .jsonl.zst shard).

Every row builds the same examples from the same documents (tests/test_tasks.py proves
the equality); only the file format and its reader differ, so the rows' examples per
busy-core second are the format's cost. The measurement is `throughput.measure`'s.
"""
from __future__ import annotations

import gzip
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from t5lite.data import edge
from t5lite.tools import data_throughput as throughput

FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")
PILE_ROW = "pile reader (.jsonl.zst)"


def write_formats(directory: str, documents: int, seed: int = 0,
                  mean_chars: Optional[int] = None,
                  row_group_rows: int = 1000) -> Dict[str, str]:
    """The documents of `throughput.write_corpus` (its Pile-layout .jsonl.zst shard is
    the baseline) in every format of FORMATS: {"pile_dir": ..., format: path}."""
    corpus = throughput.write_corpus(directory, documents, seed=seed, mean_chars=mean_chars,
                                     compress=True)
    with open(corpus["text_file"]) as f:
        docs = [line.rstrip("\n") for line in f]
    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    out = {"pile_dir": corpus["pile_dir"], "jsonl.zst": corpus["pile_file"]}
    base = os.path.join(directory, "formats", "docs")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    with open(base + ".jsonl", "wb") as f:
        f.write(data)
    with open(base + ".jsonl.gz", "wb") as f:
        f.write(gzip.compress(data, compresslevel=6))
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": docs}), base + ".parquet",
                   row_group_size=row_group_rows)
    out.update({"jsonl": base + ".jsonl", "jsonl.gz": base + ".jsonl.gz",
                "parquet": base + ".parquet"})
    return out


def _batches(task: str, lengths: Mapping[str, int], batch_size: int, pack: bool):
    return edge.make_iterator(task, split="train", feature_lengths=dict(lengths),
                              layout=edge.DataLayout(batch_size), pack=pack, shuffle=True,
                              seed=0)


def compare_formats(files: Mapping[str, str], vocabulary_path: str,
                    lengths: Mapping[str, int], packs=(False, True), batch_size: int = 64,
                    n_batches: int = 20, rounds: int = 3) -> List[Dict[str, Any]]:
    """One row for the Pile reader and one per format, for each of `packs`, each task
    configured on its own file only. Every row is measured `rounds` times, the order of
    the rows rotated each round (so no reader always runs first, just after start-up);
    a row gives the median round's figures and every round's examples per core-second."""
    names = (PILE_ROW,) + FORMATS
    rows = []
    for pack in packs:
        runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                runs[name].append(_measure(files, name, vocabulary_path, lengths,
                                           batch_size, pack, n_batches))
        for name in names:
            ordered = sorted(runs[name], key=lambda m: m["examples_per_core_s"])
            path = files["jsonl.zst"] if name == PILE_ROW else files[name]
            rows.append({"pipeline": name, "task": _task(name),
                         "file_bytes": os.path.getsize(path), "inputs": lengths["inputs"],
                         "targets": lengths["targets"], "pack": pack,
                         "batch_size": batch_size, **ordered[len(ordered) // 2],
                         "rounds_examples_per_core_s": [
                             m["examples_per_core_s"] for m in runs[name]]})
    return rows


def _task(name: str) -> str:
    return "pile_span_corruption" if name == PILE_ROW else "text_span_corruption"


def _measure(files, name, vocabulary_path, lengths, batch_size, pack, n_batches):
    pile = name == PILE_ROW
    edge.import_tasks(edge.DataSettings(
        pile_dir=files["pile_dir"] if pile else None,
        text_files=None if pile else files[name], vocabulary_path=vocabulary_path))
    return throughput.measure(lambda: _batches(_task(name), lengths, batch_size, pack),
                              n_batches)


def report(files: Mapping[str, str], vocabulary_path: str, lengths: Mapping[str, int],
           **kwargs) -> Tuple[str, Dict[str, Any]]:
    """(the two tables, {"rows": compare_formats' rows, "readers": reader_rates' rows})."""
    rows = compare_formats(files, vocabulary_path, lengths, **kwargs)
    readers = reader_rates(files)
    return (format_table(rows) + "\n\n" + format_reader_table(readers),
            {"rows": rows, "readers": readers})


def reader_rates(files: Mapping[str, str], rounds: int = 3,
                 per_read: int = 64) -> List[Dict[str, Any]]:
    """The reader alone (jsonl_cursor.iter_texts: a CursorPool read `per_read` texts a
    call, as TextFilesSource reads) through each format's whole file, the fastest of `rounds` reads: the
    documents and MB of text per second of one busy core (it runs in one thread)."""
    jsonl_cursor = edge.jsonl_cursor
    rows = []
    for name in FORMATS:
        best = None
        for _ in range(rounds):
            documents, chars, t = 0, 0, throughput.cpu_seconds()
            for text in jsonl_cursor.iter_texts(files[name], chunk=per_read):
                documents, chars = documents + 1, chars + len(text)
            seconds = throughput.cpu_seconds() - t
            best = seconds if best is None else min(best, seconds)
        rows.append({"format": name, "documents": documents, "text_mb": chars / 1e6,
                     "cpu_s": best, "documents_per_core_s": documents / best,
                     "text_mb_per_core_s": chars / 1e6 / best})
    return rows


def format_reader_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| format | documents | text MB | documents / core-s | text MB / core-s |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['format']} | {r['documents']:,} | {r['text_mb']:.1f} | "
              f"{r['documents_per_core_s']:,.0f} | {r['text_mb_per_core_s']:.0f} |"
              for r in rows]
    return "\n".join(lines)


def format_table(rows: List[Dict[str, Any]]) -> str:
    """A markdown table; the last column is each row's median examples per core-second
    over the Pile reader's with the same packing."""
    pile = {r["pack"]: r["examples_per_core_s"] for r in rows if r["pipeline"] == PILE_ROW}
    lines = ["| reader | file MB | packed | examples/s | busy cores | examples / core-s "
             "(rounds' range) | vs Pile reader |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        spread = r["rounds_examples_per_core_s"]
        lines.append(f"| {r['pipeline']} | {r['file_bytes'] / 1e6:.1f} | "
                     f"{'yes' if r['pack'] else 'no'} | {r['examples_per_s']:,.0f} | "
                     f"{r['busy_cores']:.2f} | {r['examples_per_core_s']:,.0f} "
                     f"({min(spread):,.0f}-{max(spread):,.0f}) | "
                     f"{r['examples_per_core_s'] / pile[r['pack']]:.2f} |")
    return "\n".join(lines)
