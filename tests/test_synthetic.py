"""Synthetic batches: deterministic from (seed, step), host slices, T5X features, no TF."""
import json

import numpy as np
import pytest

from t5lite.data.sharding.layout import DataLayout
from t5lite.data.synthetic import SyntheticIterator, SyntheticTask

import train_helpers as th

ENC_DEC = dict(feature_lengths={"inputs": 24, "targets": 10}, vocab_size=50,
               kind="encoder_decoder")
DEC_ONLY = dict(feature_lengths={"targets": 16}, vocab_size=50, kind="decoder_only")


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("spec", [ENC_DEC, DEC_ONLY], ids=["enc_dec", "dec_only"])
def test_deterministic_across_instances_and_differs_by_step_and_seed(spec):
    a = SyntheticTask(**spec, seed=3).global_batch(7, 8)
    b = SyntheticTask(**spec, seed=3).global_batch(7, 8)
    _assert_same(a, b)
    other_step = SyntheticTask(**spec, seed=3).global_batch(8, 8)
    other_seed = SyntheticTask(**spec, seed=4).global_batch(7, 8)
    assert not np.array_equal(a["decoder_target_tokens"], other_step["decoder_target_tokens"])
    assert not np.array_equal(a["decoder_target_tokens"], other_seed["decoder_target_tokens"])


@pytest.mark.parametrize("spec", [ENC_DEC, DEC_ONLY], ids=["enc_dec", "dec_only"])
@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_host_slices_concatenate_to_global_batch(spec, process_count):
    task = SyntheticTask(**spec, seed=1)
    whole = task.global_batch(5, 8)
    parts = [task.host_batch(5, DataLayout(8, i, process_count)) for i in range(process_count)]
    for p in parts:
        assert all(v.shape[0] == 8 // process_count for v in p.values())
    _assert_same({k: np.concatenate([p[k] for p in parts]) for k in whole}, whole)


def test_batch_not_divisible_by_processes_is_a_clear_error():
    task = SyntheticTask(**ENC_DEC)
    with pytest.raises(ValueError,
                       match="batch size 6 is not divisible by the data shard count 4"):
        task.host_batch(0, DataLayout(6, 0, 4))
    with pytest.raises(ValueError, match="not divisible"):
        SyntheticIterator(task, DataLayout(6, 1, 4))
    with pytest.raises(ValueError, match="out of range"):
        task.host_batch(0, DataLayout(8, 4, 4))


def test_encoder_decoder_features():
    task = SyntheticTask(**ENC_DEC, seed=0)
    b = task.global_batch(0, 32)
    assert sorted(b) == ["decoder_input_tokens", "decoder_loss_weights",
                         "decoder_target_tokens", "encoder_input_tokens"]
    assert b["encoder_input_tokens"].shape == (32, 24)
    for k in ("decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights"):
        assert b[k].shape == (32, 10)
    for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens"):
        assert b[k].dtype == np.int32
    assert b["decoder_loss_weights"].dtype == np.float32
    # Targets shifted right with a 0 first; weights mark the non-padding targets.
    tgt = b["decoder_target_tokens"]
    np.testing.assert_array_equal(b["decoder_input_tokens"][:, 0], 0)
    np.testing.assert_array_equal(b["decoder_input_tokens"][:, 1:], tgt[:, :-1])
    np.testing.assert_array_equal(b["decoder_loss_weights"], (tgt != 0).astype(np.float32))
    for x, length in ((b["encoder_input_tokens"], 24), (tgt, 10)):
        for row in x:
            eos = np.flatnonzero(row == 1)
            assert len(eos) == 1 and eos[0] + 1 >= length // 2
            assert np.all(row[:eos[0]] >= 2) and np.all(row[:eos[0]] < 50)
            assert np.all(row[eos[0] + 1:] == 0)
        assert np.any(x == 0), "some rows should be padded"


def test_decoder_only_features():
    b = SyntheticTask(**DEC_ONLY, seed=0).global_batch(2, 4)
    assert sorted(b) == ["decoder_input_tokens", "decoder_loss_weights",
                         "decoder_target_tokens"]
    for k in b:
        assert b[k].shape == (4, 16)
    assert b["decoder_input_tokens"].dtype == b["decoder_target_tokens"].dtype == np.int32
    assert b["decoder_loss_weights"].dtype == np.float32
    np.testing.assert_array_equal(b["decoder_loss_weights"], 1.0)
    np.testing.assert_array_equal(b["decoder_input_tokens"][:, 1:],
                                  b["decoder_target_tokens"][:, :-1])
    for k in ("decoder_input_tokens", "decoder_target_tokens"):
        assert b[k].min() >= 2 and b[k].max() < 50


def test_feature_specs_match_batches():
    for spec in (ENC_DEC, DEC_ONLY):
        task = SyntheticTask(**spec)
        b = task.host_batch(0, DataLayout(8, 1, 2))
        assert {k: (v.shape, v.dtype) for k, v in b.items()} == task.feature_specs(4)


def test_bad_feature_lengths_are_clear_errors():
    with pytest.raises(ValueError, match="'inputs' and 'targets'"):
        SyntheticTask({"targets": 8}, 50, "encoder_decoder")
    with pytest.raises(ValueError, match="decoder_only task needs"):
        SyntheticTask({"inputs": 8, "targets": 8}, 50, "decoder_only")
    SyntheticTask({"inputs": None, "targets": 8}, 50, "decoder_only")  # T5X-style None is fine
    with pytest.raises(ValueError, match="kind"):
        SyntheticTask({"targets": 8}, 50, "prefix_lm")
    with pytest.raises(ValueError, match="vocab_size"):
        SyntheticTask({"targets": 8}, 2, "decoder_only")


@pytest.mark.parametrize("spec", [ENC_DEC, DEC_ONLY], ids=["enc_dec", "dec_only"])
def test_iterator_state_round_trip_continues_exactly(spec):
    task = SyntheticTask(**spec, seed=9)
    it = SyntheticIterator(task, DataLayout(8, 1, 2))
    for _ in range(3):
        next(it)
    state = it.get_state()
    assert state == {"step": 3}
    expected = [next(it) for _ in range(2)]

    resumed = SyntheticIterator(task, DataLayout(8, 1, 2))
    resumed.set_state(json.loads(json.dumps(state)))  # survives a JSON checkpoint
    for want in expected:
        _assert_same(next(resumed), want)
    _assert_same(expected[0], task.host_batch(3, DataLayout(8, 1, 2)))
    assert SyntheticIterator(task, DataLayout(8), start_step=5).get_state() == {"step": 5}


def test_import_pulls_in_no_tensorflow_or_seqio():
    code = ("import t5lite.data, t5lite.data.synthetic as s\n"
            "s.SyntheticTask({'inputs': 8, 'targets': 4}, 32).global_batch(0, 2)\n")
    _, imported = th.imports_after(code)
    assert imported == []
