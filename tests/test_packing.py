"""data/packing.py: the packed rows equal SeqIO's (`seqio.utils.trim_and_pack_dataset`,
the reference) on the edges of its contract, and are built with AutoGraph off."""
import numpy as np
import pytest

pytest.importorskip("seqio")

import seqio  # noqa: E402

from t5lite.data import packing  # noqa: E402
from t5lite.data.tf_env import as_written, import_tensorflow  # noqa: E402

tf = import_tensorflow()


def _examples(n, keys, longest, dtype, zero_inside, seed):
    """n examples of random ids 1..49 (lengths 0..longest-1, so empty ones too), each
    with a feature that packing drops; `zero_inside`: an id 0 inside longer ones (an
    example's length is its count of nonzero ids, SeqIO's rule)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        row = {"index": np.int64(len(rows))}
        for k in keys:
            ids = rng.integers(1, 50, int(rng.integers(0, longest))).astype(dtype)
            if zero_inside and ids.size > 2:
                ids[1] = 0
            row[k] = ids
        rows.append(row)
    spec = {k: tf.TensorSpec([None], tf.as_dtype(dtype)) for k in keys}
    return tf.data.Dataset.from_generator(
        lambda: iter(rows), output_signature={**spec, "index": tf.TensorSpec([], tf.int64)})


@pytest.mark.parametrize("lengths,n,longest,dtype,zero_inside", [
    ({"inputs": 8, "targets": 5}, 100, 12, np.int32, False),  # trimmed, windows of 8
    ({"targets": 16}, 77, 20, np.int64, False),                # one feature, int64 ids
    ({"inputs": 3, "targets": 3}, 50, 6, np.int32, True),      # zeros inside examples
    ({"targets": 1}, 9, 3, np.int32, False),                   # rows of one token
])
def test_rows_equal_seqios(lengths, n, longest, dtype, zero_inside):
    ds = _examples(n, list(lengths), longest, dtype, zero_inside, seed=len(lengths) + n)
    want = list(seqio.utils.trim_and_pack_dataset(
        ds.map(lambda ex: {k: ex[k] for k in lengths}), lengths).as_numpy_iterator())
    from tensorflow.python.autograph.impl import api as autograph
    real, calls = autograph.converted_call, []
    autograph.converted_call = lambda f, *a, **k: calls.append(f) or real(f, *a, **k)
    try:
        packed = as_written(packing.pack_dataset)(ds, lengths)
    finally:
        autograph.converted_call = real
    assert not calls  # traced as written
    assert {k: v.shape.as_list() for k, v in packed.element_spec.items()} == {
        k + s: [n_k] for k, n_k in lengths.items() for s in ("", "_positions", "_segment_ids")}
    got = list(packed.as_numpy_iterator())
    assert len(got) == len(want) <= n
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k].dtype == w[k].dtype == np.int32
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)


def test_a_missing_feature_is_named():
    ds = tf.data.Dataset.from_tensors({"targets": tf.constant([1, 2])})
    with pytest.raises(ValueError, match="'inputs' is not in the dataset"):
        packing.pack_dataset(ds, {"inputs": 4, "targets": 4})
