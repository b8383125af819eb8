"""Packing written as graph code: T5X's greedy packing of examples into rows, the rows
equal to SeqIO's (`seqio.utils.trim_and_pack_dataset`, which the feature converters
call), with its loop written as `tf.while_loop` and `tf.cond` instead of Python control
flow over tensors. SeqIO's loop only becomes a graph through AutoGraph, whose conversion
of it and of everything it calls cost about 0.8 CPU s at the start of every process that
builds a packed pipeline; this one is traced as written (`tf_env.as_written`).

The contract, SeqIO's: each feature of `lengths` is cut to its length; the examples of
each window of max(lengths) consecutive ones are laid one after another into rows, a new
row begun when any feature would overflow; a row holds, per feature `k` of length L,
`k` [L] (the tokens, zeros after them), `k_positions` [L] (0, 1, ... within each example)
and `k_segment_ids` [L] (1, 2, ... per example, 0 on padding). An example's length is its
count of nonzero ids. Features not in `lengths` are dropped; ids leave as int32.
"""
from __future__ import annotations

from typing import Dict, Mapping

from t5lite.data.tf_env import import_tensorflow

tf = import_tensorflow()


def pack_dataset(ds: "tf.data.Dataset", lengths: Mapping[str, int]) -> "tf.data.Dataset":
    """`ds` (examples of 1-D id features) -> its packed rows (module docstring)."""
    lengths = {k: int(v) for k, v in lengths.items()}
    for k in lengths:
        if k not in ds.element_spec:
            raise ValueError(f"feature {k!r} is not in the dataset ({list(ds.element_spec)})")
    window = max(lengths.values())  # enough examples to fill a row, if each has a token
    ds = ds.map(lambda ex: {k: ex[k][:n] for k, n in lengths.items()},
                num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.padded_batch(window, padded_shapes={k: [-1] for k in lengths})
    ds = ds.map(lambda batch: _pack_window(batch, lengths),
                num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    return ds.map(lambda row: _with_shapes(row, _row_lengths(lengths)),
                  num_parallel_calls=tf.data.AUTOTUNE)


def _row_lengths(lengths: Dict[str, int]) -> Dict[str, int]:
    """Each feature of a packed row -> its length: a feature's, its `_positions`' and its
    `_segment_ids`'."""
    return {k + suffix: n for k, n in lengths.items()
            for suffix in ("", "_positions", "_segment_ids")}


def _pack_window(batch: Dict[str, "tf.Tensor"], lengths: Dict[str, int]):
    """One padded window [examples, longest] per feature -> its rows [rows, L] per
    feature, `_positions` and `_segment_ids` beside each."""
    keys = list(lengths)
    slots = [k + suffix for k in keys for suffix in ("", "_positions")]
    length_of = _row_lengths(lengths)

    def empty():
        return {s: tf.zeros([0], tf.int32) for s in slots}

    def flush(partial, rows):  # the row being filled, padded and written; a new one begun
        written = {s: rows[s].write(rows[s].size(),
                                    tf.pad(partial[s], [[0, length_of[s] - tf.size(partial[s])]]))
                   for s in slots}
        return empty(), written

    def body(i, partial, rows):
        example = {}
        for k in keys:
            ids = tf.cast(batch[k][i], tf.int32)
            example[k] = ids[:tf.reduce_sum(tf.cast(tf.not_equal(ids, 0), tf.int32))]
        fits = tf.constant(True)
        for k in keys:
            fits = tf.logical_and(fits, tf.size(partial[k]) + tf.size(example[k]) <= lengths[k])
        partial, rows = tf.cond(fits, lambda: (partial, rows), lambda: flush(partial, rows))
        grown = {}
        for k in keys:
            ids = example[k][:lengths[k]]
            grown[k] = tf.concat([partial[k], ids], 0)
            grown[k + "_positions"] = tf.concat(
                [partial[k + "_positions"], tf.range(tf.size(ids), dtype=tf.int32)], 0)
        return i + 1, grown, rows

    rows = {s: tf.TensorArray(tf.int32, size=0, dynamic_size=True,
                              element_shape=[length_of[s]]) for s in slots}
    n = tf.shape(batch[keys[0]])[0]
    _, partial, rows = tf.while_loop(
        lambda i, partial, rows: i < n, body, (tf.constant(0), empty(), rows),
        shape_invariants=(tf.TensorShape([]), {s: tf.TensorShape([None]) for s in slots},
                          {s: tf.TensorShape(None) for s in slots}))
    _, rows = flush(partial, rows)
    packed = {s: rows[s].stack() for s in slots}
    for k in keys:
        starts = tf.cast(tf.equal(packed[k + "_positions"], 0), tf.int32)
        packed[k + "_segment_ids"] = (tf.cumsum(starts, axis=1)
                                      * tf.cast(tf.not_equal(packed[k], 0), tf.int32))
    return packed


def _with_shapes(row: Dict[str, "tf.Tensor"], row_lengths: Dict[str, int]):
    """Each feature's static shape [L] (lost through the loop and unbatch)."""
    for name, value in row.items():
        value.set_shape([row_lengths[name]])
    return row
