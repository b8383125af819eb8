"""Splitting the sequence: Megatron's sequence parallelism (SEQUENCE_PARALLEL: with a
tensor axis over 1 the residual stream's sequence is split over `tensor`, so the norms,
dropout and residual adds run on a slice of it and each block's boundaries are a
reduce-scatter and an all-gather instead of an all-reduce) and context parallelism (the
mesh's `context` axis: every activation's sequence split, keys and values all-gathered,
a causal model's tokens load-balanced, `models/common/context_order.py`).

On 8 CPU devices, float32: LLaMA tiny and GPT tiny at 256 tokens, and T5 tiny at 256 / 64,
give one device's loss and gradient (one SGD step at rate 1, whose update is the
gradient) within 1e-5, on rows that are one sequence and rows packed with three, on
[fsdp=2, tensor=4] with sequence parallelism, on [fsdp=2, context=4], and on [tensor=2,
context=4] with both; compiled for 8 H100s, sequence parallelism's layers end in
reduce-scatters and all-gathers with no all-reduce of the residual stream; a context
axis of 4 cuts the step's temporaries by about 4; decoding and scoring under it are one
device's; bad settings are one line."""
import functools
from types import SimpleNamespace

import jax
import numpy as np
import optax
import pytest

import initial_states
from t5lite.config import parsing
from t5lite.data.synthetic import SyntheticTask
from t5lite.errors import ConfigError, PartitioningError
from t5lite.tools import gpu_target
from t5lite.tools.hlo import collectives
from t5lite.runtime import partitioning, train_step

MODELS = {"llama": ("configs/models/llama2/tiny.gin", "DecoderConfig"),
          "gpt": ("configs/models/gpt/tiny.gin", "DecoderConfig"),
          "t5": ("configs/models/t5_1_1/tiny.gin", "T5Config")}
LENGTHS = {"llama": {"targets": 256}, "gpt": {"targets": 256},
           "t5": {"inputs": 256, "targets": 64}}
BATCH = 8
SEQUENCE_PARALLEL = (1, 2, 4)  # data, fsdp, tensor
CONTEXT = (1, 2, 1, 1, 1, 4)   # data, fsdp, tensor, expert, stage, context
BOTH = (1, 1, 2, 1, 1, 4)
# float32; measured: loss within 1e-7 relative, gradients within 2.6e-6 of each leaf's
# largest entry (or of 1% of the largest gradient: a key bias's is zero but for rounding)
LOSS_RTOL, GRAD_TOL = 1e-6, 1e-5


def _model(name, attention="xla"):
    gin_file, config = MODELS[name]
    dtype = "bfloat16" if attention == "cudnn" else "float32"  # cuDNN's: 16-bit only
    parsing.parse_gin([gin_file], [f"{config}.vocab_size = 128",
                                   f"ACTIVATION_DTYPE = '{dtype}'",
                                   f"ATTENTION_IMPL = '{attention}'"])
    return parsing.resolve_macro("MODEL")


def _batch(name, model):
    """Rows 0-3 one sequence each; rows 4-7 three packed sequences (segments of 100, 80
    and the rest of the targets, positions counted from each one's start)."""
    kind = model.FEATURE_CONVERTER_KIND
    batch = SyntheticTask(LENGTHS[name], 128, kind, seed=3).global_batch(0, BATCH)
    length = LENGTHS[name]["targets"]
    cuts = [0, length * 100 // 256, length * 180 // 256, length]
    segments = np.ones((BATCH, length), np.int32)
    positions = np.tile(np.arange(length, dtype=np.int32), (BATCH, 1))
    for row in range(4, BATCH):
        for s, (a, b) in enumerate(zip(cuts, cuts[1:])):
            segments[row, a:b] = s + 1
            positions[row, a:b] = np.arange(b - a)
    batch.update(decoder_segment_ids=segments, decoder_positions=positions)
    if kind == "encoder_decoder":
        inputs = LENGTHS[name]["inputs"]
        batch["encoder_segment_ids"] = np.where(np.arange(inputs) < inputs // 2, 1, 2
                                                ).astype(np.int32)[None].repeat(BATCH, 0)
        batch["encoder_segment_ids"][:4] = 1
        batch["encoder_positions"] = np.tile(np.arange(inputs, dtype=np.int32), (BATCH, 1))
    return batch


def _step(name, mesh_shape, sequence_parallel, attention="xla"):
    """One SGD step at rate 1: (loss, gradient as a host tree)."""
    model = _model(name, attention)
    devices = jax.devices()[:int(np.prod(mesh_shape))]
    part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape, devices=devices),
                                    sequence_parallel=sequence_parallel)
    fns = train_step.make_train_step(model, optax.sgd(1.0), part,
                                     lengths=model.feature_lengths(LENGTHS[name]))
    state = initial_states.get(fns, key=(model.config, "sgd"))  # made once per model
    before = jax.device_get(state.params)
    batch = part.host_to_global(_batch(name, model), part.data_layout(BATCH))
    state, metrics = fns.train_step(state, batch)
    grads = jax.tree_util.tree_map(lambda b, a: b - a, before, jax.device_get(state.params))
    return float(metrics["loss"]), grads


@functools.lru_cache(maxsize=None)
def _one_device(name):
    return _step(name, (1, 1, 1), False)


@pytest.mark.parametrize("name, mesh_shape, sequence_parallel, attention", [
    ("llama", SEQUENCE_PARALLEL, True, "xla"), ("gpt", SEQUENCE_PARALLEL, True, "xla"),
    ("t5", SEQUENCE_PARALLEL, True, "xla"), ("llama", CONTEXT, False, "xla"),
    ("gpt", CONTEXT, False, "dot_product"), ("t5", CONTEXT, False, "dot_product"),
    ("llama", BOTH, True, "dot_product")],
    ids=["llama-sp", "gpt-sp", "t5-sp", "llama-cp", "gpt-cp-jax-nn", "t5-cp-jax-nn",
         "llama-sp-cp-jax-nn"])
def test_a_split_sequence_step_is_one_devices_step(name, mesh_shape, sequence_parallel,
                                                   attention):
    """(`dot_product`: jax.nn's attention, in context parallelism's shard_map, against
    the one device's einsum: the same numbers.)"""
    loss, grads = _step(name, mesh_shape, sequence_parallel, attention)
    ref_loss, ref_grads = _one_device(name)
    np.testing.assert_allclose(loss, ref_loss, rtol=LOSS_RTOL)
    scale = max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(ref_grads))

    def close(path, got, want):
        tol = GRAD_TOL * max(float(np.max(np.abs(want))), 1e-2 * scale)
        assert float(np.max(np.abs(got - want))) <= tol, jax.tree_util.keystr(path)

    jax.tree_util.tree_map_with_path(close, grads, ref_grads)


def _gpu_program(model, mesh_shape, sequence_parallel):
    """The HLO text of `model`'s train step on `_batch`'s batch, compiled for 8 H100s."""
    part = partitioning.Partitioner(partitioning.make_mesh(
        mesh_shape, devices=gpu_target.gpu_devices("h100", 8)),
        sequence_parallel=sequence_parallel)
    fns = train_step.make_train_step(model, optax.sgd(1.0), part,
                                     lengths={"targets": LENGTHS["llama"]["targets"]})
    state = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), fns.abstract_state,
        fns.state_shardings)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=part.batch_sharding(v.ndim))
             for k, v in _batch("llama", model).items()}
    return fns.train_step.lower(state, batch).compile(
        gpu_target.compiler_options(None)).as_text()


def test_compiled_for_gpus_the_layers_reduce_scatter_and_gather_the_sequence():
    """LLaMA tiny compiled for 8 H100s on [fsdp=2, tensor=4] with sequence parallelism:
    each layer's two boundaries, forward and backward, are reduce-scatters over the tensor
    groups (the attention's out-projection and the MLP's wo forward, the q and wi
    projections' input gradients backward), and no collective of the layers all-reduces
    a residual-sized array over them (without it: the out-projection and wo all-reduce
    [4, 256, 64] float32 per device, 256 KiB or more)."""
    model = _model("llama")
    text = _gpu_program(model, SEQUENCE_PARALLEL, True)
    residual = BATCH // 2 * LENGTHS["llama"]["targets"] * model.config.emb_dim * 4
    in_layers = [c for c in collectives.program_collectives(text)
                 if "/decoder/layers_" in c.op_name and c.group_size == 4]
    scattered = [c for c in in_layers if c.kind == "reduce-scatter" and c.bytes >= residual]
    assert len(scattered) == 4 * model.config.num_layers, [c.op_name for c in scattered]
    for boundary in ("self_attention/out/dot_general", "mlp/wo/dot_general",
                     "query/dot_general", "mlp/wi_1/dot_general"):
        assert sum(boundary in c.op_name for c in scattered) == model.config.num_layers, \
            (boundary, [c.op_name for c in scattered])
    assert not [c.op_name for c in in_layers
                if c.kind == "all-reduce" and c.bytes >= residual]


def test_sequence_parallelism_settings_are_checked():
    with pytest.raises(PartitioningError, match="SEQUENCE_PARALLEL .* tensor axis"):
        partitioning.MeshSettings((-1, 2, 1), (1, 1, 1), (), sequence_parallel=True
                                  ).partitioner()
    with pytest.raises(ConfigError, match="SEQUENCE_PARALLEL must be True or False"):
        partitioning.MeshSettings((-1, 1, 4), (1, 1, 1), (), sequence_parallel="yes")
    # a length the tensor axis does not divide (a decoding step's one token) stays whole
    part = partitioning.Partitioner(partitioning.make_mesh(SEQUENCE_PARALLEL),
                                    sequence_parallel=True)
    from t5lite.models.common.layers import Layout

    def specs(length):
        with part.context():
            lowered = jax.jit(Layout().constrain_residual).lower(
                jax.ShapeDtypeStruct((4, length, 64), np.float32))
        return [line for line in lowered.as_text().splitlines()
                if "sharding_constraint" in line]

    assert '{"tensor"}' in specs(8)[0] and '{"tensor"}' not in specs(1)[0]


def test_cudnn_attention_compiles_over_the_context_axis_for_gpus():
    """LLaMA tiny with cuDNN's attention on [fsdp=2, context=4], compiled for 8 H100s
    (jax's own partitioning of it refuses queries split unlike their keys): each layer's
    attention is one cuDNN call each way, a device's 4 rows x 64 queries against the
    whole 256 keys, the keys and values all-gathered over the context groups forward and
    their gradients reduce-scattered backward, and no all-reduce over those groups of
    anything as large."""
    model = _model("llama", "cudnn")
    cfg = model.config
    text = _gpu_program(model, CONTEXT, False)
    calls = [line for line in text.splitlines()
             if "custom-call(" in line and "__cudnn$fmha" in line]
    forward = [line for line in calls if "Backward" not in line]
    assert len(forward) == len(calls) - len(forward) == cfg.num_layers, calls
    queries = f"bf16[4,{cfg.num_heads},64,{cfg.head_dim}]"
    keys = f"bf16[4,{cfg.kv_heads},256,{cfg.head_dim}]"
    assert all(queries in line.split("custom-call(")[0] for line in forward), forward
    assert all(keys in line.split("custom-call(")[0] for line in calls if "Backward" in line)
    whole_keys = BATCH // 2 * LENGTHS["llama"]["targets"] * cfg.kv_heads * cfg.head_dim * 2
    layers = [c for c in collectives.program_collectives(text)
              if "/decoder/" in c.op_name and c.group_size == 4 and c.bytes >= whole_keys]
    for kind in ("all-gather", "reduce-scatter"):
        assert sum(c.kind == kind and "shard_map" in c.op_name for c in layers) >= \
            cfg.num_layers, (kind, [c.op_name for c in layers])
    assert not [c.op_name for c in layers if c.kind == "all-reduce"]


def test_a_causal_models_tokens_are_balanced_over_the_context_axis():
    """Each of the context axis' devices holds a chunk from the front and one from the
    back; LLaMA's loss reads its batch in that order, masked by positions, under a
    context axis over 1 only; a mixture of experts and relative biases keep the order."""
    from t5lite.models.common import context_order
    assert context_order.balanced_order(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="12 tokens does not cut into 8"):
        context_order.balanced_order(12, 4)
    llama = _model("llama")
    batch = {k: np.asarray(v) for k, v in _batch("llama", llama).items()}
    for mesh_shape, reordered in ((CONTEXT, True), ((1, 2, 4), False)):
        part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape))
        with part.context():
            got, extra = llama.context_ordered(batch)
        order = context_order.balanced_order(256, 4) if reordered else np.arange(256)
        np.testing.assert_array_equal(np.asarray(got["decoder_target_tokens"]),
                                      batch["decoder_target_tokens"][:, order])
        np.testing.assert_array_equal(np.asarray(got["decoder_positions"]),
                                      batch["decoder_positions"][:, order])
        assert extra == ({"causal_by_positions": True} if reordered else {})
    for changes in ({"num_experts": 4}, {"position_embedding": "relative"}):
        cfg = SimpleNamespace(**{"num_experts": 0, "position_embedding": "rope", **changes})
        assert not type(llama).balances_context(SimpleNamespace(config=cfg))


def test_a_context_axis_divides_the_steps_activations():
    """LLaMA tiny at 1,024 tokens, two rows: the compiled step's temporaries on a context
    axis of 4 are about a quarter of one device's (measured 248.0 -> 54.5 MB)."""
    from t5lite.tools import step_memory
    model, length = _model("llama"), 1024

    def temporaries(mesh_shape):
        devices = jax.devices()[:int(np.prod(mesh_shape))]
        part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape, devices=devices))
        fns = train_step.make_train_step(model, optax.sgd(1.0), part,
                                         lengths={"targets": length})
        state = jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            fns.abstract_state, fns.state_shardings)
        batch = {k: jax.ShapeDtypeStruct((2, length), np.int32, sharding=part.batch_sharding(2))
                 for k in ("decoder_input_tokens", "decoder_target_tokens")}
        compiled = fns.train_step.lower(state, batch).compile()
        return step_memory.compiled_memory(compiled).temp_bytes

    whole, split = temporaries((1, 1, 1)), temporaries((1, 1, 1, 1, 1, 4))
    assert whole / 5 < split < whole / 3.5, (whole, split)


def test_context_parallelism_settings_are_checked():
    from t5lite.runtime.model_on_mesh import check_lengths_on_mesh, check_model_on_mesh
    mesh = partitioning.make_mesh((1, 2, 1, 1, 1, 4))
    with pytest.raises(ConfigError, match="ATTENTION_IMPL .* not 'te'"):
        check_model_on_mesh(SimpleNamespace(config=SimpleNamespace(attention_impl="te")),
                            mesh)
    with pytest.raises(ConfigError, match="does not run inside a pipeline"):
        check_model_on_mesh(SimpleNamespace(config=SimpleNamespace(attention_impl="xla")),
                            partitioning.make_mesh((1, 1, 1, 1, 2, 4)))
    llama, t5 = _model("llama"), _model("t5")
    check_lengths_on_mesh(llama, mesh, {"targets": 256})
    with pytest.raises(PartitioningError, match="8 equal chunks .* targets 252 tokens: "
                                                "use a multiple of 8"):
        check_lengths_on_mesh(llama, mesh, {"targets": 252})
    check_lengths_on_mesh(t5, mesh, {"inputs": 12, "targets": 4})  # T5: slices of 4
    with pytest.raises(PartitioningError, match="inputs 10 tokens: use a multiple of 4"):
        check_lengths_on_mesh(t5, mesh, {"inputs": 10, "targets": 4})


def test_decoding_and_scoring_under_a_context_axis_are_one_devices():
    """An eval / infer mesh with a context axis: LLaMA's greedy continuations of prompts
    (the KV cache's one-token steps keep their length whole) and its teacher-forced
    logits (natural order, split over context) are one device's."""
    model = _model("llama", "dot_product")
    params = {"params": model.init(jax.random.PRNGKey(0), lengths={"targets": 16})["params"]}
    prompts = np.tile(np.array([2, 5, 7, 9, 11, 3, 4, 6], np.int32), (BATCH, 1))
    prompts[::2, 5:] = 0
    batch = {"decoder_input_tokens": prompts, "decoder_target_tokens": prompts}
    want = (model.predict_batch(params, batch, max_decode_length=8), model.logits(params, batch))
    part = partitioning.Partitioner(partitioning.make_mesh(CONTEXT))
    with part.context():
        got = jax.jit(lambda p, b: (model.predict_batch(p, b, max_decode_length=8),
                                    model.logits(p, b)))(params, batch)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), atol=1e-5)
