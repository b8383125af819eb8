"""Sequence parallelism (SEQUENCE_PARALLEL, Megatron's): with a tensor axis over 1 the
residual stream's sequence is split over `tensor`, so the norms, dropout and residual
adds run on a slice of it and each block's boundaries are a reduce-scatter and an
all-gather instead of an all-reduce.

On 8 CPU devices, float32: LLaMA tiny and GPT tiny at 256 tokens, and T5 tiny at 256 / 64,
on [fsdp=2, tensor=4] with it give one device's loss and gradient (one SGD step at rate 1,
whose update is the gradient) within 1e-5, on rows that are one sequence and rows packed
with three; compiled for 8 H100s, the layers' boundaries are reduce-scatters and
all-gathers with no all-reduce of the residual stream; bad settings are one line."""
import dataclasses

import jax
import numpy as np
import optax
import pytest

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
# float32; measured: loss within 1e-7 relative, gradients within 2.6e-6 of each leaf's
# largest entry (or of 1% of the largest gradient: a key bias's is zero but for rounding)
LOSS_RTOL, GRAD_TOL = 1e-6, 1e-5


def _model(name):
    gin_file, config = MODELS[name]
    parsing.parse_gin([gin_file], [f"{config}.vocab_size = 128",
                                   "ACTIVATION_DTYPE = 'float32'"])
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


def _step(name, mesh_shape, sequence_parallel):
    """One SGD step at rate 1: (loss, gradient as a host tree)."""
    model = _model(name)
    devices = jax.devices()[:int(np.prod(mesh_shape))]
    part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape, devices=devices),
                                    sequence_parallel=sequence_parallel)
    fns = train_step.make_train_step(model, optax.sgd(1.0), part,
                                     lengths=model.feature_lengths(LENGTHS[name]))
    state = fns.init(jax.random.PRNGKey(0))
    before = jax.device_get(state.params)
    batch = part.host_to_global(_batch(name, model), part.data_layout(BATCH))
    state, metrics = fns.train_step(state, batch)
    grads = jax.tree_util.tree_map(lambda b, a: b - a, before, jax.device_get(state.params))
    return float(metrics["loss"]), grads


@pytest.mark.parametrize("name", list(MODELS))
def test_sequence_parallel_step_is_one_devices_step(name):
    loss, grads = _step(name, SEQUENCE_PARALLEL, True)
    ref_loss, ref_grads = _step(name, (1, 1, 1), False)
    np.testing.assert_allclose(loss, ref_loss, rtol=LOSS_RTOL)
    scale = max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(ref_grads))

    def close(path, got, want):
        tol = GRAD_TOL * max(float(np.max(np.abs(want))), 1e-2 * scale)
        assert float(np.max(np.abs(got - want))) <= tol, jax.tree_util.keystr(path)

    jax.tree_util.tree_map_with_path(close, grads, ref_grads)


def test_compiled_for_gpus_the_layers_reduce_scatter_and_gather_the_sequence():
    """LLaMA tiny compiled for 8 H100s on [fsdp=2, tensor=4] with sequence parallelism:
    each layer's two boundaries, forward and backward, are reduce-scatters over the tensor
    groups (the attention's out-projection and the MLP's wo forward, the q and wi
    projections' input gradients backward), and no collective of the layers all-reduces
    a residual-sized array over them (without it: the out-projection and wo all-reduce
    [4, 256, 64] float32 per device, 256 KiB or more)."""
    model = _model("llama")
    part = partitioning.Partitioner(partitioning.make_mesh(
        SEQUENCE_PARALLEL, devices=gpu_target.gpu_devices("h100", 8)), sequence_parallel=True)
    fns = train_step.make_train_step(model, optax.sgd(1.0), part,
                                     lengths=model.feature_lengths(LENGTHS["llama"]))
    state = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), fns.abstract_state,
        fns.state_shardings)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=part.batch_sharding(v.ndim))
             for k, v in _batch("llama", model).items()}
    text = fns.train_step.lower(state, batch).compile(
        gpu_target.compiler_options(None)).as_text()
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
