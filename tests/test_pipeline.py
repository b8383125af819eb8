"""t5lite.data.pipeline: SeqIO tasks -> this process's numpy batches; deterministic order,
disjoint per-process shards, packing, and an exact resume from a saved position."""
import json
import weakref

import numpy as np
import pytest

from t5lite.data.files import demo_corpus

from data_helpers import data_env, reset_data_settings, vocabulary

pytest.importorskip("seqio")

from t5lite.data import pipeline, tasks  # noqa: E402,F401 (importing tasks registers them)
from t5lite.data.sharding.layout import DataLayout  # noqa: E402
from t5lite.errors import DataError  # noqa: E402

ENC_DEC = ("pile_span_corruption", "encoder_decoder", {"inputs": 32, "targets": 8})
DEC_ONLY = ("pile_lm", "decoder_only", {"targets": 16})


@pytest.fixture(autouse=True)
def _restore_settings():
    yield
    reset_data_settings()


@pytest.fixture
def pile(tmp_path, monkeypatch, tmp_path_factory):
    directory = tmp_path / "pile"
    demo_corpus.write_pile(str(directory), train_files=4, docs_per_file=5, eval_docs=4)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), pile_dir=directory)
    return directory


def _iterator(spec, batch_size=4, process_index=0, process_count=1, **kwargs):
    task, kind, lengths = spec
    args = dict(split="train", feature_lengths=lengths, model_kind=kind,
                pack=False, shuffle=True, seed=3, shuffle_buffer_size=32)
    args.update(kwargs)
    return pipeline.make_iterator(
        task, layout=DataLayout(batch_size, process_index, process_count), **args)


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("spec", [ENC_DEC, DEC_ONLY], ids=["encoder_decoder", "decoder_only"])
def test_resume_continues_with_the_next_unseen_batch(pile, spec):
    reference = _iterator(spec)
    expected = [next(reference) for _ in range(8)]
    first = _iterator(spec)
    for i in range(5):
        assert _same(next(first), expected[i])
    state = first.get_state()
    assert state["position"] == 5 and state["iterator"]["count"] == 1
    assert isinstance(state["iterator"]["states"][0], bytes)
    for saved in (state, {k: v for k, v in state.items() if k != "iterator"}):
        resumed = _iterator(spec)  # from the iterator state, then by replaying 5 batches
        resumed.set_state(json.loads(json.dumps(saved, default=_bytes_as_list)))
        assert _same(next(resumed), expected[5])  # nothing repeated, nothing skipped
        assert _same(next(resumed), expected[6])
        assert resumed.get_state()["position"] == 7
    assert _same(next(_iterator(spec, start_position=7)), expected[7])
    # close() releases the tf.data iterators at once (no garbage collection needed: none
    # is left reading ahead in the background) and a later batch continues the stream
    tf_iterator = weakref.ref(first._tf_iterators[0])
    first.close()
    assert tf_iterator() is None
    assert _same(next(first), expected[5]) and first.get_state()["position"] == 6


def _bytes_as_list(value):
    return list(value)  # json.dumps of the bytes, as a checkpoint round trip


def test_order_is_a_function_of_the_seed(pile):
    a = [next(it) for it in [_iterator(ENC_DEC)] for _ in range(3)]
    b = [next(it) for it in [_iterator(ENC_DEC)] for _ in range(3)]
    c = [next(it) for it in [_iterator(ENC_DEC, seed=4)] for _ in range(3)]
    assert all(_same(x, y) for x, y in zip(a, b))
    assert not all(_same(x, y) for x, y in zip(a, c))


def test_the_pipeline_is_deterministic_and_not_autotuned(pile):
    """Autotuning's model thread costs training a core's share on small hosts and stalls
    the iterator's destruction (docs/data.md, "Without tf.data autotuning")."""
    options = _iterator(ENC_DEC).dataset().options()
    assert options.autotune.enabled is False and options.deterministic is True


@pytest.mark.parametrize("spec", [ENC_DEC, DEC_ONLY], ids=["encoder_decoder", "decoder_only"])
def test_batches_have_t5x_features_with_and_without_packing(pile, spec):
    _, kind, lengths = spec
    plain = next(_iterator(spec, batch_size=6, process_count=2, process_index=1))
    names = ["decoder_input_tokens", "decoder_loss_weights", "decoder_target_tokens"]
    if kind == "encoder_decoder":
        names = ["encoder_input_tokens"] + names
    assert sorted(plain) == sorted(names)
    targets = lengths["targets"]
    assert plain["decoder_target_tokens"].shape == (3, targets)
    assert plain["decoder_target_tokens"].dtype == np.int32
    assert plain["decoder_loss_weights"].dtype == np.float32
    np.testing.assert_array_equal(plain["decoder_input_tokens"][:, 1:],
                                  plain["decoder_target_tokens"][:, :-1])
    np.testing.assert_array_equal(plain["decoder_loss_weights"],
                                  plain["decoder_target_tokens"] > 0)

    packed = next(_iterator(spec, pack=True))
    _check_packed(packed, kind)


def _check_packed(packed, kind):
    stacks = ["decoder"] + (["encoder"] if kind == "encoder_decoder" else [])
    for stack in stacks:
        seg, pos = packed[f"{stack}_segment_ids"], packed[f"{stack}_positions"]
        tokens = packed[f"{stack}_input_tokens" if stack == "encoder" else
                        "decoder_target_tokens"]
        assert seg.shape == pos.shape == tokens.shape
        np.testing.assert_array_equal(seg > 0, tokens > 0)
        for row_seg, row_pos in zip(seg, pos):
            for s in set(row_seg[row_seg > 0].tolist()):
                np.testing.assert_array_equal(row_pos[row_seg == s],
                                              np.arange((row_seg == s).sum()))
    return packed


def test_packing_puts_several_examples_in_a_row(tmp_path, monkeypatch, tmp_path_factory):
    demo_corpus.write_multinli(str(tmp_path), train=12, dev=3)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), mnli_dir=tmp_path)
    packed = _check_packed(next(_iterator(("mnli", "encoder_decoder",
                                           {"inputs": 256, "targets": 64}), pack=True)),
                           "encoder_decoder")
    assert packed["encoder_segment_ids"].max() >= 3
    assert packed["decoder_segment_ids"].max() >= 3
    # Decoder inputs restart with BOS (0) at the start of every packed segment.
    starts = (packed["decoder_positions"] == 0) & (packed["decoder_segment_ids"] > 0)
    assert np.all(packed["decoder_input_tokens"][starts] == 0)
    assert np.all(packed["decoder_input_tokens"][~starts & (packed["decoder_segment_ids"]
                                                            > 0)] > 0)


def _all_rows(spec, process_index, process_count, **kwargs):
    it = _iterator(spec, batch_size=2 * process_count, process_index=process_index,
                   process_count=process_count, repeat=False, drop_remainder=False,
                   shuffle=False, **kwargs)
    rows = []
    for batch in it:
        key = "encoder_input_tokens" if "encoder_input_tokens" in batch else \
            "decoder_target_tokens"
        rows += [tuple(r.tolist()) for r in batch[key]]
    return rows


@pytest.fixture
def pile_docs_task(pile):
    """The Pile's documents one to an example (tokenized, nothing merged or split), so
    that shards can be compared example by example."""
    import functools
    import seqio
    from t5.data import preprocessors
    lm = seqio.TaskRegistry.get("pile_lm")
    seqio.TaskRegistry.add(
        "test_pile_docs", source=lm.source,
        preprocessors=[functools.partial(preprocessors.rekey, key_map={"targets": "text"}),
                       seqio.preprocessors.tokenize],
        output_features={"targets": lm.output_features["targets"]})
    yield ("test_pile_docs", "decoder_only", {"targets": 24})
    seqio.TaskRegistry.remove("test_pile_docs")


@pytest.mark.parametrize("split,expected,processes",
                         [("train", 20, 2), ("train", 20, 5), ("validation", 4, 2)],
                         ids=["4_files_2_processes_by_file", "4_files_5_processes_by_record",
                              "1_file_2_processes_by_record"])
def test_process_shards_are_disjoint_and_cover_the_data(pile_docs_task, split, expected,
                                                        processes):
    everything = _all_rows(pile_docs_task, 0, 1, split=split)
    assert len(everything) == len(set(everything)) == expected
    shards = [_all_rows(pile_docs_task, i, processes, split=split) for i in range(processes)]
    assert all(shards)
    assert sum(len(s) for s in shards) == expected  # so no row is in two shards
    assert sorted(sum(shards, [])) == sorted(everything)


def test_mnli_shards_by_example_and_keeps_the_last_batch(tmp_path, monkeypatch,
                                                         tmp_path_factory):
    demo_corpus.write_glue_mnli(str(tmp_path / "MNLI"), train=3, dev=7)
    data_env(monkeypatch, tmp_path, vocabulary(tmp_path_factory), mnli_dir=tmp_path)
    spec = ("mnli", "encoder_decoder", {"inputs": 64, "targets": 4})
    rows = [_all_rows(spec, i, 3, split="validation_matched") for i in range(3)]
    assert [len(r) for r in rows] == [3, 2, 2]
    everything = _all_rows(spec, 0, 1, split="validation_matched")
    assert sorted(sum(rows, [])) == sorted(everything) and len(everything) == 7


def test_errors_for_mismatched_model_kind_lengths_and_state(pile):
    with pytest.raises(DataError, match="decoder_only model on the inputs -> targets task "
                                        "'pile_span_corruption' .* needs feature lengths"):
        _iterator(("pile_span_corruption", "decoder_only", {"targets": 16}))
    with pytest.raises(DataError, match="encoder_decoder model needs an input/target task"):
        _iterator(("pile_lm", "encoder_decoder", {"inputs": 16, "targets": 16}))
    with pytest.raises(DataError, match="feature lengths for 'inputs' and 'targets'"):
        _iterator(("pile_span_corruption", "encoder_decoder", {"targets": 16}))
    with pytest.raises(ValueError, match="not divisible by the data shard count"):
        _iterator(ENC_DEC, batch_size=5, process_count=2)
    with pytest.raises(DataError, match="needs a 'position'"):
        _iterator(ENC_DEC).set_state({"step": 3})


@pytest.mark.parametrize("change", [{"batch_size": 8},
                                    {"feature_lengths": {"inputs": 64, "targets": 8}},
                                    {"task": "pile_lm"}, {"seed": 4}, {"pack": True},
                                    {"bos_id": 1}])
def test_resume_under_changed_settings_is_refused_in_one_line(pile, change):
    it = _iterator(ENC_DEC)
    next(it)
    state = dict(it.get_state(), **change)
    with pytest.raises(DataError, match=f"another data stream: {list(change)[0]} ") as e:
        it.set_state(state)
    assert "\n" not in str(e.value) and "Set them back" in str(e.value)
    assert it.get_state()["position"] == 1  # nothing changed
    it.set_state(json.loads(json.dumps(it.get_state(), default=_bytes_as_list)))  # same: fine


@pytest.mark.parametrize("pack", [False, True])
def test_reader_chunking_leaves_the_stream_unchanged(pile, monkeypatch, pack):
    """The Pile reader hands tf.data TEXTS_PER_CALL documents per Python call (for speed,
    docs/data.md); the stream is the one of a document per call, batch for batch."""
    from t5lite.data import sources

    def batches(per_call):
        monkeypatch.setattr(sources, "TEXTS_PER_CALL", per_call)
        it = pipeline.make_iterator("pile_span_corruption", split="train",
                                    feature_lengths={"inputs": 64, "targets": 16},
                                    layout=DataLayout(4), pack=pack, shuffle=True, seed=2)
        return [next(it) for _ in range(8)]

    for a, b in zip(batches(1), batches(3)):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
