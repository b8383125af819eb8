"""A tf.data iterator's state as bytes (what a checkpoint's data item stores for each data
shard) and back: tf.data's own serialization of every stage's state, with a stage whose
state lives outside tf.data (a Python generator) refused rather than saved wrong."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from t5lite.data.tf_env import import_tensorflow

tf = import_tensorflow()
FAIL = tf.data.experimental.ExternalStatePolicy.FAIL


def save_iterator(iterator) -> bytes:
    """A tf.data iterator's state as bytes (tf.errors.OpError if a stage cannot be saved)."""
    from tensorflow.python.ops import gen_dataset_ops
    variant = gen_dataset_ops.serialize_iterator(iterator._iterator_resource,
                                                 external_state_policy=FAIL.value)
    return tf.io.serialize_tensor(variant).numpy()


def restore_iterator(iterator, state: bytes) -> None:
    """Put a new iterator over the same dataset where `save_iterator` found the saved one."""
    from tensorflow.python.ops import gen_dataset_ops
    gen_dataset_ops.deserialize_iterator(iterator._iterator_resource,
                                         tf.io.parse_tensor(state, tf.variant))


def shard_states(saved: Any, count: int) -> Optional[Dict[int, bytes]]:
    """{shard: bytes} of a saved "iterator" entry ({"count", "states"}; its keys may have
    become strings and its bytes lists on a trip through JSON), None when it has none or
    is of another shard count."""
    if not isinstance(saved, Mapping) or int(saved.get("count", -1)) != count:
        return None
    return {int(s): bytes(b) for s, b in saved.get("states", {}).items()}
