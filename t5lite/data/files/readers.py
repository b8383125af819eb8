"""Readers of the raw file formats the tasks use, in plain Python (no TensorFlow).

    the Pile     one JSON object a line, {"text": ..., "meta": {...}}; .jsonl or .jsonl.zst
    MultiNLI     multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl
                 (sentence1, sentence2, gold_label, pairID, genre, ...)
    GLUE MNLI    MNLI/{train,dev_matched,dev_mismatched}.tsv, a header line naming the
                 columns (index, promptID, pairID, genre, ..., sentence1, sentence2, ...,
                 gold_label)
    SQuAD v1.1   train-v1.1.json / dev-v1.1.json:
                 {"data": [{"title", "paragraphs": [{"context",
                            "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}
    plain text   .txt (one sentence or paragraph a line), for training vocabularies

Every format problem raises `DataFormatError` naming the file (and line) and what was
expected there. Used by the SeqIO sources (t5lite/data/sources.py) and by the vocabulary
trainer (t5lite/vocab.py).
"""
from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import os
from typing import Dict, Iterator, List, Optional, Sequence

from t5lite.data.files import jsonl_cursor
from t5lite.data.files.compressed import PILE_FORMAT, compression
from t5lite.errors import DataFormatError, DataNotFoundError

MNLI_LABELS = ("entailment", "neutral", "contradiction")  # TFDS glue/mnli label order
TEXT_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.gz", ".json.gz", ".txt", ".txt.zst",
                 ".txt.gz")


# -- opening files ---------------------------------------------------------------------
class _ChunkStream(io.RawIOBase):
    """A readable binary stream over an iterator of bytes chunks."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._rest:
            self._rest = next(self._chunks, b"")
            if not self._rest:
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n], self._rest = self._rest[:n], self._rest[n:]
        return n


@contextlib.contextmanager
def open_text(path: str):
    """A text stream (UTF-8) of `path`, decompressing `.zst` and `.gz` files on the fly (a
    truncated or corrupt one raises DataFormatError when the reading gets there)."""
    compressed = compression(path)
    if compressed:
        _, check_magic, decompressed, _ = compressed
        with open(path, "rb") as raw:
            check_magic(path, raw)
            raw.seek(0)
            chunks = (data for _, data in decompressed(path, raw))
            binary = io.BufferedReader(_ChunkStream(chunks), 1 << 20)
            with io.TextIOWrapper(binary, encoding="utf-8", newline="") as text:
                yield text
    else:
        with open(path, "r", encoding="utf-8", newline="") as text:
            yield text


def _lines(path: str) -> Iterator[str]:
    with open_text(path) as f:
        try:
            yield from f
        except UnicodeDecodeError as e:
            raise DataFormatError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") \
                from None


# -- the Pile (and any jsonl with a text field) ------------------------------------------
def iter_jsonl_texts(path: str, field: str = "text", shard_index: int = 0,
                     num_shards: int = 1) -> Iterator[str]:
    """The `field` string of the non-empty lines of a .jsonl / .jsonl.zst / .jsonl.gz file; with
    num_shards > 1 only records k with k % num_shards == shard_index (others are not
    decoded). Streamed by t5lite/data/files/jsonl_cursor.py, the training pipeline's reader."""
    return jsonl_cursor.iter_texts(path, field, shard_index, num_shards)


def check_jsonl(path: str, field: str = "text") -> None:
    """Raise DataFormatError unless the first non-empty line of `path` is a JSON object
    with a `field` string (a cheap check made before a pipeline starts)."""
    for _ in iter_jsonl_texts(path, field):
        return
    raise DataFormatError(f"{path}: no records; expected {PILE_FORMAT}")


def iter_texts(path: str, field: str = "text") -> Iterator[str]:
    """Texts of a file for vocabulary training: jsonl / jsonl.zst records, or txt lines."""
    if path.endswith((".jsonl", ".jsonl.zst", ".json.zst", ".jsonl.gz", ".json.gz")):
        yield from iter_jsonl_texts(path, field)
    elif path.endswith((".txt", ".txt.zst", ".txt.gz")):
        for line in _lines(path):
            line = line.rstrip("\r\n")
            if line.strip():
                yield line
    else:
        raise DataFormatError(f"{path}: unknown file type; expected one of "
                              f"{', '.join(TEXT_SUFFIXES)}")


# -- MNLI --------------------------------------------------------------------------------
def _mnli_label(path: str, where: str, gold: str) -> Optional[int]:
    if gold == "-" or gold == "":  # no annotator consensus: TFDS drops these too
        return None
    if gold not in MNLI_LABELS:
        raise DataFormatError(f"{where}: gold_label {gold!r} is not one of "
                              f"{', '.join(MNLI_LABELS)}")
    return MNLI_LABELS.index(gold)


def _read_multinli_jsonl(path: str) -> List[Dict]:
    out = []
    for lineno, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(f"{where}: not JSON ({e.msg}); expected MultiNLI jsonl "
                                  f"records with sentence1, sentence2, gold_label") from None
        missing = [k for k in ("sentence1", "sentence2", "gold_label")
                   if not isinstance(obj, dict) or k not in obj]
        if missing:
            raise DataFormatError(f"{where}: a MultiNLI record needs sentence1, sentence2 and "
                                  f"gold_label; missing {', '.join(missing)}")
        label = _mnli_label(path, where, obj["gold_label"])
        if label is not None:
            out.append({"premise": obj["sentence1"], "hypothesis": obj["sentence2"],
                        "label": label, "idx": len(out)})
    return out


def _read_glue_mnli_tsv(path: str) -> List[Dict]:
    out = []
    with open_text(path) as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        needed = ("sentence1", "sentence2", "gold_label")
        if header is None or any(k not in header for k in needed):
            raise DataFormatError(
                f"{path}: expected a GLUE MNLI TSV whose header names the columns "
                f"sentence1, sentence2 and gold_label, got header {header}")
        cols = {k: header.index(k) for k in needed}
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) < len(header):
                raise DataFormatError(f"{path}:{lineno}: {len(row)} tab-separated fields, "
                                      f"the header names {len(header)}")
            label = _mnli_label(path, f"{path}:{lineno}", row[cols["gold_label"]])
            if label is not None:
                out.append({"premise": row[cols["sentence1"]],
                            "hypothesis": row[cols["sentence2"]],
                            "label": label, "idx": len(out)})
    return out


def read_mnli(path: str) -> List[Dict]:
    """MNLI examples {premise, hypothesis, label (index into MNLI_LABELS), idx} of a
    MultiNLI .jsonl or a GLUE .tsv file (the fields of TFDS glue/mnli)."""
    if path.endswith(".jsonl"):
        return _read_multinli_jsonl(path)
    if path.endswith(".tsv"):
        return _read_glue_mnli_tsv(path)
    raise DataFormatError(f"{path}: expected a MultiNLI .jsonl or a GLUE MNLI .tsv file")


# -- SQuAD -------------------------------------------------------------------------------
def read_squad(path: str) -> List[Dict]:
    """SQuAD v1.1 examples {id, title, context, question, answers: {text, answer_start}}
    (the fields of TFDS squad/v1.1), one per question, in file order."""
    expected = ('SQuAD v1.1 JSON: {"data": [{"title", "paragraphs": [{"context", "qas": '
                '[{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}')
    try:
        with open_text(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}: not JSON ({e.msg} at line {e.lineno}); expected "
                              f"{expected}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataFormatError(f"{path}: no top-level \"data\" list; expected {expected}")
    out = []
    try:
        for article in doc["data"]:
            title = article.get("title", "")
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    answers = qa["answers"]
                    out.append({"id": qa["id"], "title": title, "context": context,
                                "question": qa["question"],
                                "answers": {"text": [a["text"] for a in answers],
                                            "answer_start": [int(a["answer_start"])
                                                             for a in answers]}})
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise DataFormatError(f"{path}: record {len(out)} does not match the SQuAD format "
                              f"({type(e).__name__}: {e}); expected {expected}") from None
    return out


# -- finding files -----------------------------------------------------------------------
def find_first(directory: str, candidates: Sequence[str]) -> Optional[str]:
    """The first of `candidates` (paths relative to `directory`) that exists."""
    for name in candidates:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def glob_files(directory: str, patterns: Sequence[str]) -> List[str]:
    """Sorted files under `directory` matching the first of `patterns` that matches any."""
    for pattern in patterns:
        files = sorted(p for p in glob.glob(os.path.join(directory, pattern))
                       if os.path.isfile(p))
        if files:
            return files
    return []


def require_dir(directory: Optional[str], what: str, setting: str) -> str:
    """`directory`, or DataNotFoundError naming the setting that should point at it."""
    if not directory:
        raise DataNotFoundError(f"no {what} directory: {setting}")
    if not os.path.isdir(directory):
        raise DataNotFoundError(f"{what} directory {directory!r} does not exist ({setting})")
    return directory
