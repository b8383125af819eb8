"""SeqIO data sources that find their data when a dataset is built, not when the task is
registered: local files in the datasets' own formats, or a prepared TFDS dataset in the
local TFDS data directory (never downloaded, never read from a cloud bucket).

    TextFilesSource    JSON lines (.jsonl, .zst, .gz: the Pile, C4) or Parquet text files
    ExamplesSource     a file read whole by a reader of t5lite/data/files/readers.py (MNLI, SQuAD)
    TfdsDirSource      a prepared TFDS dataset directory (builder_from_directory)
    DeferredSource     asks a resolver, at build time, which of those to read
                       (the resolvers: t5lite/data/source_resolvers.py), handing it
                       the settings it holds, resolved then (t5lite/data/settings.py)

Sharding: with at least as many files as processes, each process reads its own files;
with fewer, each process keeps every num_shards-th record (local sources skip the
others before decoding them; TFDS sources are sharded by SeqIO after reading).
Shuffling: the file order (TextFilesSource, TFDS) or the whole example list
(ExamplesSource) is permuted by the seed, the same permutation on every process, so
shards stay disjoint.
"""
from __future__ import annotations

import functools
import glob
import os
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from t5lite.data.files import jsonl_cursor, readers
from t5lite.data.settings import DataSettings, ResolvedDataSettings
from t5lite.data.stream_errors import park_error, stream_id
from t5lite.data.tf_env import import_tensorflow
from t5lite.errors import DataError, DataFormatError, DataNotFoundError

tf = import_tensorflow()
import seqio  # noqa: E402

TEXTS_PER_CALL = 64  # documents a Pile reader hands tf.data per Python call
def _permutation(n: int, seed: Optional[int]) -> np.ndarray:
    return np.random.RandomState(0 if seed is None else seed % 2 ** 32).permutation(n)


class TextFilesSource(seqio.DataSource):
    """{"text": string} examples of text files: JSON lines (.jsonl, .jsonl.zst,
    .jsonl.gz / .json.gz; the `field` string of each record) or Parquet (the `field`
    column), read by jsonl_cursor.CursorPool from saved positions.

    Shards itself: with at least as many files as shards, shard i reads files i, i+n, ...;
    with fewer, every shard reads every file but decodes only its own records (record k
    of a file belongs to shard k mod n), so no process parses JSON it then throws away.
    """

    def __init__(self, split_files: Mapping[str, Sequence[str]], field: str = "text",
                 cycle_length: int = 8,
                 blends: Optional[Mapping[str, Sequence[tuple]]] = None):
        """`blends`: {split: [(name, weight, files)]} for a split whose files are a blend
        (TEXT_FILES with weights, t5lite/data/blend.py): the pipeline reads each group as
        a source of its own (`blend`); read whole, the split is every group's files."""
        self._files = {k: list(v) for k, v in split_files.items()}
        self._field = field
        self._cycle_length = cycle_length
        self._blends = {k: [tuple(g) for g in v] for k, v in (blends or {}).items()}
        super().__init__(splits=tuple(self._files))

    def blend(self, split: str) -> Optional[List[tuple]]:
        """[(name, weight, source of the group's files as split `split`)] when `split` is
        a blend, else None."""
        if split not in self._blends:
            return None
        return [(name, weight, TextFilesSource({split: files}, self._field,
                                               self._cycle_length))
                for name, weight, files in self._blends[split]]

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True

    def list_shards(self, split: str) -> Sequence[str]:
        return self._files[split]

    def get_dataset(self, split: str = "train", shuffle: bool = True,
                    seed: Optional[int] = None, shard_info: Optional[seqio.ShardInfo] = None,
                    *, sequence_length=None, use_cached=False, num_epochs=1):
        files = list(self._files[split])
        index, count = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
        if count > 1 and len(files) >= count:
            files, index, count = files[index::count], 0, 1
        if shuffle:
            files = [files[i] for i in _permutation(len(files), seed)]
        for path in files:
            readers.check_jsonl(path, self._field)  # a wrong format fails here, clearly
        pool = jsonl_cursor.CursorPool(self._field, index, count)
        stream = stream_id()

        def read_texts(path, position):
            # TEXTS_PER_CALL texts per Python call: the per-call cost (under the GIL) is
            # paid once per chunk; a bad record ends the file's texts and is parked
            try:
                texts, position = pool.read(path.decode(), position, TEXTS_PER_CALL)
            except DataError as e:
                park_error(stream, e)
                texts = []
            return (np.array([t.encode() for t in texts], dtype=object),
                    np.asarray(position, np.int64))

        def read(path):
            # The file's position is the state of a scan: tf.data saves it with the
            # iterator, and a restored iterator asks the pool to read from there
            def texts_at(position, _):
                texts, after = tf.numpy_function(read_texts, [path, position],
                                                 (tf.string, tf.int64), stateful=False)
                texts.set_shape([None])
                after.set_shape([len(jsonl_cursor.START)])
                return after, texts
            return (tf.data.Dataset.from_tensors(np.int64(0)).repeat()
                    .scan(tf.constant(jsonl_cursor.START, tf.int64), texts_at)
                    .take_while(lambda texts: tf.size(texts) > 0)
                    .unbatch())

        # Several files at a time when shuffling (one document of each in turn), so that
        # the shuffle buffer sees more than one file's neighbourhood.
        cycle = min(self._cycle_length, len(files)) if shuffle else 1
        return tf.data.Dataset.from_tensor_slices(files).interleave(
            read, cycle_length=max(cycle, 1), block_length=1).map(lambda t: {"text": t})


class ExamplesSource(seqio.DataSource):
    """Examples that a reader returns as a list of dicts (a whole file in memory), with
    the TFDS feature layout given by `signature`."""

    def __init__(self, split_files: Mapping[str, str],
                 reader: Callable[[str], List[Dict]], signature: Mapping):
        self._files = dict(split_files)
        self._reader = reader
        self._signature = signature
        super().__init__(splits=tuple(self._files))

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True  # example k of the (seed-permuted) file goes to shard k mod n

    def list_shards(self, split: str) -> Sequence[str]:
        return [self._files[split]]

    def examples(self, split: str) -> List[Dict]:
        """The split's examples; DataFormatError naming the file when it has none (an
        empty file, or records none of which is an example, such as unlabeled ones)."""
        path = self._files[split]
        examples = _read_cached(self._reader, path, os.path.getmtime(path))
        if not examples:
            what = ("the file is empty" if os.path.getsize(path) == 0
                    else "none of its records is a labeled example")
            raise DataFormatError(f"{path}: no examples for split {split!r} ({what}); "
                                  f"restore the file, or point the task at another")
        return examples

    def get_dataset(self, split: str = "train", shuffle: bool = True,
                    seed: Optional[int] = None, shard_info: Optional[seqio.ShardInfo] = None,
                    *, sequence_length=None, use_cached=False, num_epochs=1):
        examples = self.examples(split)
        order = _permutation(len(examples), seed) if shuffle else np.arange(len(examples))
        if shard_info:
            order = order[shard_info.index::shard_info.num_shards]
        return examples_at(examples, order, self._signature)


def _flatten_like(signature: Mapping, example: Mapping) -> List:
    """The example's values in `tf.nest.flatten(signature)` order (dicts by sorted key);
    lists in the example are values, not structure."""
    out: List = []
    for key in sorted(signature):
        if isinstance(signature[key], Mapping):
            out += _flatten_like(signature[key], example[key])
        else:
            out.append(example[key])
    return out


def _as_numpy(value, spec) -> np.ndarray:
    """`value` (str, number or a list of them) as `tf.numpy_function` returns a `spec`."""
    if spec.dtype != tf.string:
        return np.asarray(value, spec.dtype.as_numpy_dtype)
    encode = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
    if spec.shape.rank:
        return np.array([encode(v) for v in value], dtype=object)
    return np.array(encode(value), dtype=object)


def examples_at(examples: Sequence[Mapping], order: np.ndarray, signature: Mapping):
    """examples[order[0]], examples[order[1]], ... as a tf.data dataset of `signature`'s
    layout. The dataset's state is an index into `order` (tf.data saves it with the
    iterator); each element is looked up in Python, where the examples are."""
    specs = tf.nest.flatten(signature)

    def lookup(i):
        values = _flatten_like(signature, examples[int(i)])
        return [_as_numpy(value, spec) for value, spec in zip(values, specs)]

    def fetch(i):
        flat = tf.numpy_function(lookup, [i], [s.dtype for s in specs], stateful=False)
        for tensor, spec in zip(flat, specs):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(signature, flat)

    return tf.data.Dataset.from_tensor_slices(np.asarray(order, np.int64)).map(fetch)


@functools.lru_cache(maxsize=16)
def _read_cached(reader, path: str, mtime: float) -> List[Dict]:
    return reader(path)


class TfdsDirSource(seqio.DataSource):
    """A prepared TFDS dataset read from its directory (`.../name/config/version`), with
    no builder code, no download and no cloud lookup."""

    def __init__(self, directory: str, splits: Sequence[str]):
        self._directory = directory
        super().__init__(splits=tuple(splits))

    @functools.cached_property
    def builder(self):
        import tensorflow_datasets as tfds
        return tfds.builder_from_directory(self._directory)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return False

    def _check_split(self, split: str) -> None:
        if split not in self.builder.info.splits:
            raise DataNotFoundError(
                f"TFDS dataset {self._directory!r} has no split {split!r} (it has "
                f"{', '.join(sorted(self.builder.info.splits))})")

    def list_shards(self, split: str) -> Sequence[str]:
        self._check_split(split)
        return [str(fi.filename) for fi in self.builder.info.splits[split].file_instructions]

    def get_dataset(self, split: str = "train", shuffle: bool = True,
                    seed: Optional[int] = None, shard_info: Optional[seqio.ShardInfo] = None,
                    *, sequence_length=None, use_cached=False, num_epochs=1):
        import tensorflow_datasets as tfds
        self._check_split(split)
        read_config = tfds.ReadConfig(
            shuffle_seed=seed, skip_prefetch=True,
            input_context=(tf.distribute.InputContext(
                num_input_pipelines=shard_info.num_shards,
                input_pipeline_id=shard_info.index) if shard_info else None))
        # An ordered dataset (disable_shuffling) refuses shuffled files; its examples are
        # still shuffled by the task's shuffle buffer.
        shuffle_files = shuffle and not self.builder.info.disable_shuffling
        return self.builder.as_dataset(split=split, shuffle_files=shuffle_files,
                                       read_config=read_config)


def _version_key(path: str):
    name = os.path.basename(os.path.dirname(path))
    return tuple(int(p) for p in name.split("."))


def find_tfds_dir(name: str, data_dir: Optional[str]) -> Optional[str]:
    """The newest prepared version directory of TFDS dataset `name` ("glue/mnli",
    "the_pile": any config of it) under the TFDS data directory `data_dir`, or None."""
    if not data_dir or not os.path.isdir(data_dir):
        return None
    depth = ["*"] if "/" in name else ["*", "*/*"]
    found = []
    for pattern in depth:
        for info in glob.glob(os.path.join(data_dir, name, pattern, "dataset_info.json")):
            if re.fullmatch(r"\d+\.\d+\.\d+", os.path.basename(os.path.dirname(info))):
                found.append(info)
    return os.path.dirname(max(found, key=_version_key)) if found else None


class DeferredSource(seqio.DataSource):
    """Delegates to the source `resolve(settings)` returns when a dataset is built, so
    that a task registers without its data. It holds its `DataSettings` (`data`), and
    hands the resolver them resolved at build time (environment fallbacks read then);
    the source is kept while they resolve the same."""

    def __init__(self, splits: Sequence[str],
                 resolve: Callable[[ResolvedDataSettings], seqio.DataSource],
                 description: str, data: DataSettings):
        self._resolve_fn = resolve
        self._resolved = None  # (ResolvedDataSettings, source)
        self._description = description
        self.data = data
        super().__init__(splits=tuple(splits))

    def __repr__(self) -> str:
        return f"DeferredSource({self._description})"

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return self.resolve().supports_arbitrary_sharding

    def resolve(self) -> seqio.DataSource:
        """The source the settings point at now (looked up again when what they resolve
        to changes: an environment variable behind a None setting)."""
        key = self.data.resolve()
        if self._resolved is None or self._resolved[0] != key:
            self._resolved = (key, self._resolve_fn(key))
        return self._resolved[1]

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise DataError(f"{self._description} has no split {split!r}; its splits are "
                            f"{', '.join(self.splits)}")

    def blend(self, split: str) -> Optional[List[tuple]]:
        """The resolved source's blend of `split` (TextFilesSource.blend), else None."""
        self._check_split(split)
        return getattr(self.resolve(), "blend", lambda _: None)(split)

    def list_shards(self, split: str) -> Sequence[str]:
        self._check_split(split)
        return self.resolve().list_shards(split)

    def get_dataset(self, split: str = "train", shuffle: bool = True,
                    seed: Optional[int] = None, shard_info: Optional[seqio.ShardInfo] = None,
                    *, sequence_length=None, use_cached=False, num_epochs=1):
        self._check_split(split)
        return self.resolve().get_dataset(split=split, shuffle=shuffle, seed=seed,
                                           shard_info=shard_info)


# -- the resolvers of the t5lite tasks ---------------------------------------------------
