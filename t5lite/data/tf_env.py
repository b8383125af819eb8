"""The one place the data edge imports TensorFlow: with its GPUs hidden, so that the
input pipeline never takes accelerator memory from JAX."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_tensorflow():
    """`tensorflow`, with `tf.config.set_visible_devices([], "GPU")` applied once."""
    import tensorflow as tf
    try:
        tf.config.set_visible_devices([], "GPU")
    except (RuntimeError, ValueError):  # the runtime is already up: too late to change
        pass
    return tf
