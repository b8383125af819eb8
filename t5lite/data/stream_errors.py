"""Data errors met inside tf.data, raised to the consumer as t5lite's own one-line
DataError instead of a TensorFlow error with a Python traceback.

    with stream_scope() as stream:
        ds = build_dataset()               # readers park their DataErrors under `stream`
    for element in numpy_iterator(ds, stream):
        ...                                # a parked error is raised here
"""
from __future__ import annotations

import contextlib
import itertools
import re
import threading
from typing import Any, Iterator, List, Optional

from t5lite.data.tf_env import import_tensorflow
from t5lite.errors import DataError, DataFormatError

tf = import_tensorflow()

_DATA_FORMAT_ERROR = re.compile(r"DataFormatError: (.*)")


def format_error_from(e: Exception) -> Optional[DataFormatError]:
    """The DataFormatError a reader raised inside tf.data, if `e` wraps one."""
    m = _DATA_FORMAT_ERROR.search(str(e))
    return DataFormatError(m.group(1).strip()) if m else None


# A DataError raised inside a Python function that tf.data calls goes through TensorFlow,
# which prints its Python traceback (~250 lines) and can leave the process hanging at
# exit. So the readers' functions end their data quietly instead and park the error
# under the stream they belong to (the `stream_scope` their dataset was built in), and
# that stream's consumer (`numpy_iterator`) raises it, with nothing of TensorFlow in
# between.
_deferred: List[tuple] = []
_deferred_lock = threading.Lock()
_streams = itertools.count(1)
_current = threading.local()


@contextlib.contextmanager
def stream_scope() -> Iterator[int]:
    """Datasets built inside park their readers' errors under the id this yields."""
    previous = getattr(_current, "stream", 0)
    _current.stream = next(_streams)
    try:
        yield _current.stream
    finally:
        _current.stream = previous


def stream_id() -> int:
    """The id of the `stream_scope` in force (0 outside any)."""
    return getattr(_current, "stream", 0)


def park_error(stream: int, error: DataError) -> None:
    """Keep `error` for the consumer of `stream` (`numpy_iterator` raises it)."""
    with _deferred_lock:
        _deferred.append((stream, error))


def raise_deferred_error(stream: int = 0) -> None:
    """Raise the first data error parked by the readers of `stream` (or of datasets
    built outside any scope), forgetting that stream's others."""
    with _deferred_lock:
        mine = [e for s, e in _deferred if s in (stream, 0)]
        _deferred[:] = [(s, e) for s, e in _deferred if s not in (stream, 0)]
    if mine:
        raise mine[0]


def numpy_iterator(ds, stream: int = 0) -> Iterator[Any]:
    """`ds.as_numpy_iterator()` (or numpy elements of `ds`, a tf.data iterator) whose data
    errors (a bad record met inside tf.data) surface as the reader's own DataError, not as
    a TensorFlow error. `stream`: the `stream_scope` id `ds` was built under."""
    if isinstance(ds, tf.data.Dataset):
        iterator = ds.as_numpy_iterator()
    else:
        iterator = (tf.nest.map_structure(lambda t: t.numpy(), e) for e in ds)
    while True:
        try:
            element = next(iterator)
        except StopIteration:
            raise_deferred_error(stream)  # a generator that stopped early is no end
            return
        except tf.errors.OpError as e:
            error = format_error_from(e)
            if error is None:
                raise
            raise error from None
        raise_deferred_error(stream)
        yield element


