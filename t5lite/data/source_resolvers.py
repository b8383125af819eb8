"""Which source a task reads, decided when its dataset is built (`DeferredSource` asks
these): a setting's local directory in the dataset's own layout (the Pile, C4, MNLI, SQuAD),
else a prepared TFDS dataset in the local TFDS data directory, else one line naming both
and how to set them. Each is handed the settings to read (`ResolvedDataSettings`, which
the task's `DeferredSource` resolves at build time); none reads module state.

    resolve_pile / resolve_c4 / resolve_text_files / resolve_mnli / resolve_squad
        (splits, data)
    resolve_tfds_only(name, splits, data)
"""
from __future__ import annotations

import glob
import os
import re
from typing import List, Mapping, Sequence

from t5lite.data import blend
from t5lite.data.files import readers
from t5lite.data.settings import ResolvedDataSettings, how_to_set
from t5lite.data.sources import (ExamplesSource, TextFilesSource, TfdsDirSource,
                                 find_tfds_dir)
from t5lite.data.tf_env import import_tensorflow
from t5lite.errors import DataFormatError, DataNotFoundError

tf = import_tensorflow()
import seqio  # noqa: E402

# Local layouts: split -> glob patterns under the directory; the first that matches wins.
PILE_LAYOUT = {
    "train": ("train/*.jsonl.zst", "train/*.jsonl", "[0-9][0-9].jsonl.zst", "[0-9][0-9].jsonl"),
    "validation": ("val.jsonl.zst", "val.jsonl", "validation/*.jsonl.zst",
                   "validation/*.jsonl", "val/*.jsonl.zst", "val/*.jsonl"),
    "test": ("test.jsonl.zst", "test.jsonl", "test/*.jsonl.zst", "test/*.jsonl"),
}
MNLI_LAYOUT = {
    "train": ("multinli_1.0_train.jsonl", "multinli_1.0/multinli_1.0_train.jsonl",
              "train.tsv", "MNLI/train.tsv"),
    "validation_matched": ("multinli_1.0_dev_matched.jsonl",
                           "multinli_1.0/multinli_1.0_dev_matched.jsonl",
                           "dev_matched.tsv", "MNLI/dev_matched.tsv"),
    "validation_mismatched": ("multinli_1.0_dev_mismatched.jsonl",
                              "multinli_1.0/multinli_1.0_dev_mismatched.jsonl",
                              "dev_mismatched.tsv", "MNLI/dev_mismatched.tsv"),
}
PILE_EXPECTED = ("the Pile's files in its layout: train/00.jsonl.zst ... train/29.jsonl.zst, "
                 "val.jsonl.zst, test.jsonl.zst (uncompressed .jsonl also read), one "
                 "{\"text\": ..., \"meta\": ...} record a line")
SQUAD_LAYOUT = {"train": ("train-v1.1.json",), "validation": ("dev-v1.1.json",)}
# allenai/c4 (Hugging Face): en/c4-train.00000-of-01024.json.gz ..., one gzip member a file
C4_LAYOUT = {
    "train": ("en/c4-train.*.json.gz", "c4-train.*.json.gz"),
    "validation": ("en/c4-validation.*.json.gz", "c4-validation.*.json.gz"),
}
C4_EXPECTED = ("C4 as allenai/c4 lays it out: en/c4-train.00000-of-01024.json.gz ..., "
               "en/c4-validation.00000-of-00008.json.gz ... (a subset of the shards is "
               "fine), one {\"text\": ..., \"timestamp\": ..., \"url\": ...} record a line")


def _tfds_where(name: str, data: ResolvedDataSettings) -> str:
    return (f"a prepared TFDS {name} under the TFDS data directory "
            f"{data.get('tfds_data_dir')!r} ({how_to_set('tfds_data_dir')})")


def _find_tfds(name: str, data: ResolvedDataSettings):
    return find_tfds_dir(name, data.get("tfds_data_dir"))


def resolve_pile(splits: Sequence[str], data: ResolvedDataSettings) -> seqio.DataSource:
    """The Pile from the `pile_dir` setting if set, else TFDS the_pile, else an error."""
    return _resolve_texts(data, "pile_dir", "Pile", PILE_LAYOUT, "the_pile", splits,
                          PILE_EXPECTED, numbered_shards=True)


def resolve_c4(splits: Sequence[str], data: ResolvedDataSettings) -> seqio.DataSource:
    """C4 from the `c4_dir` setting (allenai/c4's json.gz files) if set, else TFDS
    c4/en, else an error. The same reader as the Pile's."""
    return _resolve_texts(data, "c4_dir", "C4", C4_LAYOUT, "c4/en", splits, C4_EXPECTED)


CORPUS_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".parquet")


def resolve_text_files(splits: Sequence[str],
                       data: ResolvedDataSettings) -> seqio.DataSource:
    """The files the TEXT_FILES (train) and TEXT_VALIDATION_FILES (validation) globs
    match, each a format of CORPUS_SUFFIXES, their TEXT_FIELD read."""
    layout = {"train": "text_files", "validation": "text_validation_files"}
    files, blends = {}, {}
    for split in splits:
        source = data.source_of(layout[split])
        weighted = data.get_blend(layout[split])
        if weighted:  # each glob a source of the blend (t5lite/data/blend.py)
            names = blend.source_names([g for g, _ in weighted])
            blends[split] = [(name, weight, _match_text_files(source, [pattern]))
                             for name, (pattern, weight) in zip(names, weighted)]
            files[split] = list(dict.fromkeys(f for _, _, group in blends[split]
                                              for f in group))
        elif data.get_globs(layout[split]):
            files[split] = _match_text_files(source, data.get_globs(layout[split]))
    if "train" in splits and "train" not in files:
        raise DataNotFoundError(
            f"no text files: {how_to_set('text_files')} to a glob (or a list of "
            f"globs) of {', '.join(CORPUS_SUFFIXES)} files")
    return _PartialSplits(
        TextFilesSource(files, field=data.text_field(), blends=blends),
        {"train": ("TEXT_FILES",), "validation": ("TEXT_VALIDATION_FILES (not set)",)},
        "the TEXT_FILES settings", "text")


def _match_text_files(source: str, globs: Sequence[str]) -> List[str]:
    """The files each glob matches, in order, sorted within a glob; one line for a glob
    that matches nothing (naming `source`, where the globs came from) and for a file of
    another format."""
    found: List[str] = []
    for pattern in globs:
        matched = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        if not matched:
            raise DataNotFoundError(f"{pattern}: no file matches it ({source})")
        for path in matched:
            if not path.endswith(CORPUS_SUFFIXES):
                raise DataFormatError(f"{path}: not a text file t5lite reads (from "
                                      f"{pattern!r}): expected {', '.join(CORPUS_SUFFIXES)}")
            if path not in found:
                found.append(path)
    return found


def _resolve_texts(data: ResolvedDataSettings, setting: str, what: str,
                   layout: Mapping[str, Sequence[str]],
                   tfds_name: str, splits: Sequence[str], expected: str,
                   numbered_shards: bool = False) -> seqio.DataSource:
    """JSON-lines text files in `layout` under the `setting` directory if set, else the
    TFDS dataset `tfds_name`, else one line naming both."""
    directory = data.get(setting)
    if directory:
        readers.require_dir(directory, what, f"{data.source_of(setting)}; "
                                             f"{how_to_set(setting)}")
        files = {s: readers.glob_files(directory, layout[s]) for s in splits}
        files = {s: f for s, f in files.items() if f}
        if numbered_shards:
            for split_files in files.values():
                check_numbered_shards(split_files)
        if not files:
            raise DataNotFoundError(
                f"no {what} files in {directory!r} ({data.source_of(setting)}): "
                f"expected {expected}")
        return _PartialSplits(TextFilesSource(files), layout, directory, what)
    tfds_dir = _find_tfds(tfds_name, data)
    if tfds_dir:
        return TfdsDirSource(tfds_dir, splits)
    raise DataNotFoundError(
        f"no {what} data: {how_to_set(setting)} to a directory holding "
        f"{expected}, or provide {_tfds_where(tfds_name, data)}")


def check_numbered_shards(files: Sequence[str]) -> None:
    """Files named by number (the Pile's 00.jsonl.zst ... 29.jsonl.zst) must run from 00
    without a gap: a missing one (a download cut short) is named, not silently skipped."""
    numbered = {}
    for path in files:
        m = re.fullmatch(r"(\d+)(\..*)", os.path.basename(path))
        if m:
            numbered[int(m.group(1))] = (len(m.group(1)), m.group(2), os.path.dirname(path))
    if not numbered:
        return
    missing = sorted(set(range(max(numbered) + 1)) - set(numbered))
    if missing:
        width, suffix, where = numbered[max(numbered)]
        names = ", ".join(f"{n:0{width}d}{suffix}" for n in missing)
        raise DataNotFoundError(
            f"{where}: shard {names} is missing (the shards present run to "
            f"{max(numbered):0{width}d}{suffix}); restore it, or keep shards numbered "
            f"from 00 without gaps")


def resolve_tfds_only(name: str, splits: Sequence[str],
                      data: ResolvedDataSettings) -> seqio.DataSource:
    tfds_dir = _find_tfds(name, data)
    if tfds_dir:
        return TfdsDirSource(tfds_dir, splits)
    raise DataNotFoundError(f"no {name} data: expected {_tfds_where(name, data)}, i.e. "
                            f"{name}/<version>/dataset_info.json and its tfrecord files")


def _resolve_files(data: ResolvedDataSettings, setting: str, what: str,
                   layout: Mapping[str, Sequence[str]],
                   tfds_name: str, splits: Sequence[str], reader, signature,
                   expected: str) -> seqio.DataSource:
    directory = data.get(setting)
    if not directory:
        tfds_dir = _find_tfds(tfds_name, data)
        if tfds_dir:
            return TfdsDirSource(tfds_dir, splits)
        raise DataNotFoundError(
            f"no {what} data: {how_to_set(setting)} to a directory holding "
            f"{expected}, or provide {_tfds_where(tfds_name, data)}")
    readers.require_dir(directory, what, f"{data.source_of(setting)}; "
                                         f"{how_to_set(setting)}")
    files = {}
    for split in splits:
        path = readers.find_first(directory, layout[split])
        if path:
            files[split] = path
    if not files:
        raise DataNotFoundError(f"no {what} files in {directory!r} "
                                f"({data.source_of(setting)}): expected {expected}")
    return _PartialSplits(ExamplesSource(files, reader, signature), layout, directory, what)


class _PartialSplits(seqio.DataSource):
    """A local-files source that names the missing file when asked for a split it lacks."""

    def __init__(self, inner: seqio.DataSource, layout, directory: str, what: str):
        self._inner, self._layout, self._directory, self._what = inner, layout, directory, what
        super().__init__(splits=tuple(layout))

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return self._inner.supports_arbitrary_sharding

    def _check(self, split: str) -> None:
        if split not in self._inner.splits:
            raise DataNotFoundError(f"no {self._what} file for split {split!r} in "
                                    f"{self._directory!r}: expected "
                                    f"{' or '.join(self._layout[split])}")

    def list_shards(self, split: str) -> Sequence[str]:
        self._check(split)
        return self._inner.list_shards(split)

    def blend(self, split: str):
        self._check(split)
        return getattr(self._inner, "blend", lambda _: None)(split)

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed=None,
                    shard_info=None, *, sequence_length=None, use_cached=False, num_epochs=1):
        self._check(split)
        return self._inner.get_dataset(split=split, shuffle=shuffle, seed=seed,
                                       shard_info=shard_info)


MNLI_SIGNATURE = {"premise": tf.TensorSpec([], tf.string),
                  "hypothesis": tf.TensorSpec([], tf.string),
                  "label": tf.TensorSpec([], tf.int64),
                  "idx": tf.TensorSpec([], tf.int32)}
SQUAD_SIGNATURE = {"id": tf.TensorSpec([], tf.string), "title": tf.TensorSpec([], tf.string),
                   "context": tf.TensorSpec([], tf.string),
                   "question": tf.TensorSpec([], tf.string),
                   "answers": {"text": tf.TensorSpec([None], tf.string),
                               "answer_start": tf.TensorSpec([None], tf.int32)}}


def resolve_mnli(splits: Sequence[str], data: ResolvedDataSettings) -> seqio.DataSource:
    """MNLI from the `mnli_dir` setting (MultiNLI jsonl or GLUE TSVs) if set, else TFDS
    glue/mnli, else an error."""
    return _resolve_files(
        data, "mnli_dir", "MNLI", MNLI_LAYOUT, "glue/mnli", splits, readers.read_mnli,
        MNLI_SIGNATURE,
        "the MultiNLI files multinli_1.0_train.jsonl, multinli_1.0_dev_matched.jsonl, "
        "multinli_1.0_dev_mismatched.jsonl or the GLUE files train.tsv, dev_matched.tsv, "
        "dev_mismatched.tsv (at its top or in multinli_1.0/ or MNLI/)")


def resolve_squad(splits: Sequence[str], data: ResolvedDataSettings) -> seqio.DataSource:
    """SQuAD v1.1 from the `squad_dir` setting if set, else TFDS squad/v1.1, else an
    error."""
    return _resolve_files(data, "squad_dir", "SQuAD", SQUAD_LAYOUT, "squad/v1.1", splits,
                          readers.read_squad, SQUAD_SIGNATURE,
                          "the official train-v1.1.json and dev-v1.1.json")
