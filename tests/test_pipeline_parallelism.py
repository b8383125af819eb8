"""Pipeline parallelism (the mesh's `stage` axis, `t5lite.models.pipeline`) on 8 CPU
devices, float32: a pipelined step of GPT, LLaMA and GLaM (mixture of experts in the
stages) on [stage=4, fsdp=2] (and [stage=4, tensor=2], [stage=4, expert=2]) gives the
unpipelined [fsdp=8] step's loss, gradients and parameters, with 4 and 8 pipeline
microbatches, repeats 1 and 2 (circular), SCAN_LAYERS on and off, gradient accumulation
on top, a remat policy, TRANSPOSE_BS and LoRA; each device holds its
stage's layers only and the compiled program moves activations between stages by
collective permutes, never another stage's layers.

The cases cover each setting with each model family once rather than every combination:
each pipelined step is one compile (~3 s here)."""
import dataclasses

import jax
import numpy as np
import optax
import pytest

from t5lite.config import parsing
from t5lite.data.synthetic import SyntheticTask
from t5lite.models import layouts, pipeline
from t5lite.runtime import partitioning, train_step
from t5lite.tools.hlo import collectives

MODELS = {  # gin file, layers (a GLaM chunk holds whole MOE_EVERY=2 blocks: 4 x 2 x 2)
    "gpt": ("configs/models/gpt/tiny.gin", 8),
    "llama": ("configs/models/llama2/tiny.gin", 8),
    "glam": ("configs/models/glam/tiny.gin", 16),
}
LENGTHS = {"targets": 8}
BATCH = 16
PIPELINED = (1, 2, 1, 1, 4)   # data, fsdp, tensor, expert, stage
UNPIPELINED = (1, 8, 1)
# float32; one SGD step at learning rate 1, so the update is the gradient. Tolerances
# relative to each array's largest value (the loss: to itself); measured: below 1e-6.
GRAD_ATOL, LOSS_RTOL = 1e-5, 1e-6


def _model(name, **changes):
    gin_file, layers = MODELS[name]
    parsing.parse_gin([gin_file], [f"DecoderConfig.num_layers = {layers}",
                                   "DecoderConfig.vocab_size = 128",
                                   "ACTIVATION_DTYPE = 'float32'",
                                   # routing groups within one pipeline microbatch's tokens
                                   "MOE_GROUP_SIZE = 8"])
    model = parsing.resolve_macro("MODEL")
    return type(model)(dataclasses.replace(model.config, **changes))


def _step(model, mesh_shape, num_microbatches=1):
    """One SGD step: (loss, metrics, params before, params after (host trees, the
    reference layout), the state after, the step functions, the batch)."""
    part = partitioning.Partitioner(partitioning.make_mesh(mesh_shape))
    fns = train_step.make_train_step(model, optax.sgd(1.0), part, lengths=LENGTHS,
                                     num_microbatches=num_microbatches)
    state = fns.init(jax.random.PRNGKey(0))
    before = jax.device_get(state.params)
    task = SyntheticTask(LENGTHS, model.config.vocab_size, "decoder_only", seed=3)
    batch = part.host_to_global(task.global_batch(0, BATCH), part.data_layout(BATCH))
    state, metrics = fns.train_step(state, batch)
    reference = dataclasses.replace(model.config, scan_layers=True, pipeline_microbatches=None,
                                    pipeline_repeats=1)

    def plain(params):
        return layouts.convert_params(params, model.config, reference)["params"]

    return dict(metrics=jax.device_get(metrics), before=plain(before),
                after=plain(jax.device_get(state.params)), state=state, fns=fns, batch=batch)


@pytest.fixture(scope="module")
def references():
    """The unpipelined [fsdp=8] step of each model (scanned: the pipeline's layout)."""
    cache = {}

    def get(name, **changes):
        key = (name, tuple(sorted(changes.items())))
        if key not in cache:
            cache[key] = _step(_model(name, scan_layers=True, **changes), UNPIPELINED)
        return cache[key]
    return get


_RUNS = {}


def _pipelined(name, micro, repeats, scan, accumulate, mesh, extra):
    """A case's pipelined step, once (the sharding test reads one of them again)."""
    key = (name, micro, repeats, scan, accumulate, mesh, tuple(sorted(extra.items())))
    if key not in _RUNS:
        _RUNS[key] = _step(_model(name, pipeline_microbatches=micro, pipeline_repeats=repeats,
                                  scan_layers=scan, **extra), mesh,
                           num_microbatches=accumulate)
    return _RUNS[key]


TENSOR = (1, 1, 2, 1, 4)  # tensor parallelism within each of 4 stages
EXPERT = (1, 1, 1, 2, 4)  # the experts split over 2 devices within each of 4 stages
CASES = [  # model, pipeline microbatches, repeats, SCAN_LAYERS, NUM_MICROBATCHES, mesh, extra
    ("gpt", 4, 1, True, 1, PIPELINED, {"transpose_bs": True}),
    ("gpt", 8, 2, False, 1, TENSOR, {"remat_policy": "full"}),
    ("llama", 4, 2, True, 2, PIPELINED, {}),
    ("llama", 8, 1, False, 1, PIPELINED, {"lora_rank": 2,
                                          "lora_targets": ("query", "value", "wo")}),
    ("glam", 4, 2, False, 2, EXPERT, {}),
    ("glam", 8, 1, True, 1, PIPELINED, {}),
]


@pytest.mark.parametrize("name,micro,repeats,scan,accumulate,mesh,extra", CASES,
                         ids=[f"{c[0]}-m{c[1]}-r{c[2]}-{'scan' if c[3] else 'loop'}-acc{c[4]}"
                              f"-{'x'.join(map(str, c[5]))}"
                              f"{'-' + '-'.join(c[6]) if c[6] else ''}" for c in CASES])
def test_a_pipelined_step_is_the_unpipelined_step(references, name, micro, repeats, scan,
                                                  accumulate, mesh, extra):
    lora = {k: v for k, v in extra.items() if k.startswith("lora")}
    ref = references(name, **lora)
    run = _pipelined(name, micro, repeats, scan, accumulate, mesh, extra)
    np.testing.assert_allclose(run["metrics"]["loss"], ref["metrics"]["loss"], rtol=LOSS_RTOL)
    # GLaM's routers: their means over the microbatches, but expert_load (max / mean
    # tokens an expert), which is each microbatch's, averaged, as NUM_MICROBATCHES has it
    for key in [k for k in ref["metrics"] if k.startswith("moe/")]:
        if key != "moe/expert_load":
            np.testing.assert_allclose(run["metrics"][key], ref["metrics"][key], rtol=1e-5,
                                       err_msg=key)
    assert name != "glam" or "moe/aux_loss" in run["metrics"]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 run["before"], ref["before"])  # one init, whatever the layout and mesh
    grads = jax.tree.map(np.subtract, run["before"], run["after"])
    ref_grads = jax.tree.map(np.subtract, ref["before"], ref["after"])
    _assert_close(grads, ref_grads, "gradients")
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(ref_grads)) > 1e-3
    _assert_close(run["after"], ref["after"], "parameters after the step")


def _assert_close(tree, ref, what):
    """Each array within GRAD_ATOL of the reference, relative to its largest value (or a
    hundredth of the tree's largest: a key bias's gradient is zero but for rounding)."""
    worst = {}
    floor = 1e-2 * max(float(np.abs(b).max()) for b in jax.tree.leaves(ref))
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(ref)):
        scale = max(float(np.abs(b).max()), floor)
        worst[jax.tree_util.keystr(path)] = float(np.abs(np.asarray(a) - b).max()) / scale
    bad = {k: v for k, v in worst.items() if v > GRAD_ATOL}
    assert not bad, f"{what}: {bad}"


def test_each_stage_holds_its_own_layers_and_passes_activations_on():
    """Checked on the shardings of a circular pipeline's state (LLaMA's case above, 4
    microbatches, 2 repeats, [stage=4, fsdp=2]) and on its compiled step."""
    run = _pipelined("llama", 4, 2, True, 2, PIPELINED, {})
    layers = run["state"].params["params"]["decoder"]["repeats"]
    for path, leaf in jax.tree_util.tree_flatten_with_path(layers)[0]:
        shard = leaf.addressable_shards[0].data.shape
        # [repeats, 8 / repeats] layers: each device a quarter of each run's layers
        assert leaf.shape[:2] == (2, 4) and shard[:2] == (2, 1), (path, shard)
        if leaf.ndim > 2 and "kernel" in jax.tree_util.keystr(path):
            assert np.prod(shard) * 8 == np.prod(leaf.shape), (path, shard)  # and fsdp
    mesh = dict(run["fns"].state_shardings.step.mesh.shape)
    text = run["fns"].train_step.lower(run["state"], run["batch"]).compile().as_text()
    found = collectives.program_collectives(text)
    moves = [c for c in found if c.kind == "collective-permute"
             and collectives.group_axes(c.groups, mesh) == ("stage",)]
    iterations = 2 * (4 * 2 + 4 - 1)  # M R + S - 1 a step, twice (NUM_MICROBATCHES=2):
    # each one move forward and one back, of the stages' activations and of the buffers
    assert sum(c.count for c in moves) >= 2 * iterations, [(c.op_name, c.count) for c in moves]
    # nothing is gathered across stages inside the pipeline's loop (at most once for each
    # of the NUM_MICROBATCHES=2, outside it), and never a layer
    gathers = [c for c in found if c.kind == "all-gather"
               and "stage" in collectives.group_axes(c.groups, mesh)]
    assert all(c.count <= 2 and "_Chunk" not in c.op_name for c in gathers), \
        [(c.op_name, c.bytes, c.count) for c in gathers]


def test_the_bubble_and_the_settings_checks():
    assert pipeline.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert pipeline.bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
    assert pipeline.bubble_fraction(1, 8) == 0.0
    cfg = _model("gpt", pipeline_microbatches=4).config
    assert pipeline.problem_on_mesh(cfg, 4) is None
    assert "fewer than the 8" in pipeline.problem_on_mesh(cfg, 8)
    assert "6 layers do not split into 4 stages x 1 repeat(s)" in pipeline.problem_on_mesh(
        dataclasses.replace(cfg, num_layers=6), 4)
    with pytest.raises(ValueError, match="PIPELINE_REPEATS=3 must divide the 8 layers"):
        dataclasses.replace(cfg, pipeline_repeats=3)
    assert "set PIPELINE_MICROBATCHES" in pipeline.problem_on_mesh(
        dataclasses.replace(cfg, pipeline_microbatches=None), 2)
    assert "does not divide into PIPELINE_MICROBATCHES=4" in pipeline.problem_with_batch(4, 6, 1)
    assert "multiple of 8" in pipeline.problem_with_batch(4, 12, 2)


def test_packed_batches_do_not_reach_cudnn_in_a_pipeline():
    """Checked before anything is traced (a GPU run: on CPUs cuDNN is refused sooner)."""
    import types
    from t5lite.errors import ConfigError
    from t5lite.runtime.model_on_mesh import check_batches_on_mesh
    cfg = dataclasses.replace(_model("gpt", pipeline_microbatches=4).config,
                              attention_impl="cudnn", dtype="bfloat16")
    mesh = types.SimpleNamespace(shape={"data": 1, "fsdp": 2, "expert": 1, "stage": 4})
    model = types.SimpleNamespace(config=cfg)
    with pytest.raises(ConfigError, match="PACK=True with ATTENTION_IMPL='cudnn'"):
        check_batches_on_mesh(model, mesh, 16, pack=True)
    check_batches_on_mesh(model, mesh, 16, pack=False)  # cuDNN takes sequence lengths
    with pytest.raises(partitioning.PartitioningError, match="multiple of 8"):
        check_batches_on_mesh(model, mesh, 12, pack=False)


def test_microbatches_are_cut_where_the_rows_lie():
    """Microbatch (s, k) takes, from each data shard d, sub-block k of block (d, s): the
    rows stage s holds outside the pipeline; and the cut is undone exactly."""
    from t5lite.models.pipeline import buffers
    d, s, k, rows = 2, 4, 3, 5  # data shards, stages, microbatches a stage, rows a shard
    batch = np.arange(d * s * k * rows * 2).reshape(d * s * k * rows, 2)  # [B, 2]
    cut = np.asarray(buffers.to_microbatches(batch, 0, s, k, d))
    assert cut.shape == (s, k, d * rows, 2)
    block = rows * k  # rows of one device's block (d, s): block index d * s_count + s
    for si in range(s):
        for ki in range(k):
            for di in range(d):
                start = (di * s + si) * block + ki * rows
                np.testing.assert_array_equal(cut[si, ki, di * rows:(di + 1) * rows],
                                              batch[start:start + rows])
    np.testing.assert_array_equal(buffers.from_microbatches(cut, 0, d), batch)
    seq = np.arange(2 * 24 * 3).reshape(2, 24, 3)  # the batch on axis 1 (TRANSPOSE_BS)
    np.testing.assert_array_equal(
        buffers.from_microbatches(buffers.to_microbatches(seq, 1, 4, 3, 2), 1, 2), seq)
