"""The face of data/: all that the floors above (runtime, inference, interop, config,
tools, the commands) use of the data layer, and the one data module they import
(tests/test_architecture.py holds them to it).

Loaded with this module, without TensorFlow:
    DataSettings, SETTINGS, how_to_set   the data settings and the macro that sets each
    DataLayout, shards_for               which rows a process reads; DATA_SHARDS
    SyntheticTask, SyntheticIterator     random batches of a model's shapes, no files
    zero_shot_files                      Lambada and BoolQ as their authors ship them
    demo_corpus, vocab_training          the demo's corpus; a vocabulary from local text
    jsonl_cursor                         the Pile reader (its counters: `data_bench`)
    package_check                        the data packages' versions (`t5lite.deps`)

TensorFlow, SeqIO and t5 load on the first call of one of these (TensorFlow with its GPUs
hidden, a line logged: it takes seconds):
    tasks = import_tasks(DataSettings(pile_dir="/data/pile", vocabulary_path="..."))
    provider = check_split(tasks, "pile_span_corruption", "train")
    iterator = make_iterator("pile_span_corruption", split="train", ...)  # training
    vocabulary()                         the SentencePiece vocabulary of the settings
    has_inputs, cut_labels               an evaluation's features and labels cut short
    feature_converter(model_kind, pack)  the converter to a model kind's features
    stream_scope, numpy_iterator, raise_deferred_error   bad records in a tf.data stream
    import_tensorflow()                  TensorFlow itself, set up as above

The t5 package registers gin configurables when it is imported; after a command has
finalized its gin config that needs the config unlocked, which `import_tasks` does.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Iterator, Optional

from t5lite.data import package_check  # noqa: F401  (the face's)
from t5lite.data.sharding.layout import DataLayout  # noqa: F401
from t5lite.data.sharding.shards import shards_for  # noqa: F401
from t5lite.data.files import (demo_corpus, jsonl_cursor, vocab_training,  # noqa: F401
                               zero_shot_files)
from t5lite.data.settings import SETTINGS, DataSettings, how_to_set  # noqa: F401
from t5lite.data.synthetic import SyntheticIterator, SyntheticTask  # noqa: F401
from t5lite.errors import DataError


def import_tasks(data: Optional[DataSettings] = None):
    """The `t5lite.data.tasks` module (every task registered), with `data` applied through
    `tasks.configure` unless it is None (then the settings in force stay)."""
    import gin
    if "t5lite.data.tasks" not in sys.modules:  # the first time: seconds of silence else
        logging.getLogger(__name__).info(
            "loading TensorFlow, SeqIO and the registered tasks (once per process, a few "
            "seconds)")
    with gin.unlock_config():
        from t5lite.data import tasks
    if data is not None:
        tasks.configure(data)
    return tasks


def check_split(tasks_module, name: str, split: str, macro: str = "SPLIT"):
    """The task or mixture `name`; DataError naming `macro` when it has no `split`."""
    provider = tasks_module.get_provider(name)
    if split not in provider.splits:
        raise DataError(f"task {name!r} has no split {split!r}; its splits are "
                        f"{', '.join(provider.splits)} (set {macro})")
    return provider


def make_iterator(mixture_or_task_name: str, **kwargs):
    """The input pipeline's iterator (`pipeline.SeqioIterator`: batches of a task or
    mixture, resumable, this process's rows of the layout)."""
    import_tasks()
    from t5lite.data import pipeline
    return pipeline.make_iterator(mixture_or_task_name, **kwargs)


def vocabulary(path: Optional[str] = None, extra_ids: Optional[int] = None):
    """The SentencePiece vocabulary at `path` (default: the settings' `vocabulary_path`)
    with `extra_ids` sentinels (default: the settings')."""
    import_tasks()
    from t5lite.data import vocabularies
    return vocabularies.get_vocabulary(path, extra_ids)


def has_inputs(provider) -> bool:
    """Whether a task or mixture has an `inputs` feature (an encoder's)."""
    from t5lite.data import features
    return features.has_inputs(provider)


def feature_converter(model_kind: str, pack: bool, **kwargs):
    """The seqio feature converter to `model_kind`'s features (`features.feature_converter`:
    traced with AutoGraph off), e.g. for seqio's Evaluator."""
    from t5lite.data import features
    return features.feature_converter(model_kind, pack, **kwargs)


def cut_labels(examples, vocabulary, targets_length: int, **kwargs):
    """`length_check.cut_labels`: an evaluation's examples whose label is longer than
    `targets_length` tokens with its EOS."""
    from t5lite.data import length_check
    return length_check.cut_labels(examples, vocabulary, targets_length, **kwargs)


def stream_scope():
    """A context manager around a tf.data stream's use: a bad record met in one of its
    threads is parked under the stream id it yields, raised by `raise_deferred_error`."""
    from t5lite.data import stream_errors
    return stream_errors.stream_scope()


def numpy_iterator(ds, stream: int = 0) -> Iterator[Any]:
    """A tf.data dataset's elements as numpy, a bad record raised as its DataError."""
    from t5lite.data import stream_errors
    return stream_errors.numpy_iterator(ds, stream)


def raise_deferred_error(stream: int = 0) -> None:
    """The DataError a tf.data thread parked for `stream`, raised here, if any."""
    from t5lite.data import stream_errors
    stream_errors.raise_deferred_error(stream)


def import_tensorflow():
    """TensorFlow, imported with its GPUs hidden and its native logging quiet."""
    from t5lite.data.tf_env import import_tensorflow as _import
    return _import()
