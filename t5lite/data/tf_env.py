"""The one place the data edge imports TensorFlow: with its GPUs hidden, so that the
input pipeline never takes accelerator memory from JAX; and `as_written`, how t5lite's
own pipeline stages are traced (without AutoGraph)."""
from __future__ import annotations

import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def _native_stderr_silenced():
    """File descriptor 2 pointed at /dev/null: TensorFlow's C++ start-up lines (oneDNN,
    "could not find cuda drivers", cuInit) are written before its log level applies.
    Python exceptions are unaffected (they are printed after this block)."""
    if os.environ.get("T5LITE_TF_STARTUP_LOGS"):  # set it to see them
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow():
    """`tensorflow`, with `tf.config.set_visible_devices([], "GPU")` applied once."""
    first = "tensorflow" not in sys.modules
    with _native_stderr_silenced() if first else contextlib.nullcontext():
        import tensorflow as tf
        try:
            tf.config.set_visible_devices([], "GPU")
        except (RuntimeError, ValueError):  # the runtime is already up: too late to change
            pass
    return tf


def as_written(build):
    """`build`, a callable that assembles tf.data stages from t5lite's, SeqIO's and t5's
    TensorFlow code (control flow written as TensorFlow ops: tf.cond, tf.while_loop), to
    be called with AutoGraph off: each function it maps is traced as written instead of
    first being rewritten into a graph function. The same datasets, without AutoGraph's
    conversion, which cost about 3 CPU s for span corruption's 47 functions in every
    process that builds it (each train, eval or infer command). A user's own SeqIO task
    is not built through this, and keeps AutoGraph."""
    return import_tensorflow().autograph.experimental.do_not_convert(build)
