"""A fresh init draws each kind of parameter once for a whole stack of layers: the
initializer's program does not grow with depth (what made it compile for minutes on a
GPU), a fresh init is the same under SCAN_LAYERS True and False, and the draws are still
what the initializers say (every layer different, the right scale)."""
import dataclasses
import re

import jax
import numpy as np
import pytest

from t5lite.models import layouts
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.model import DecoderOnlyModel, EncoderDecoderModel
from t5lite.optim import optimizers
from t5lite.runtime import partitioning, train_step

T5 = T5Config(vocab_size=96, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
              num_decoder_layers=3, mlp_dim=48, relpos_num_buckets=8, relpos_max_distance=12)
LLAMA = DecoderConfig(vocab_size=96, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                      num_layers=3, mlp_dim=48)
CASES = [("t5", T5), ("llama", LLAMA)]
LENGTHS = {"t5": {"inputs": 16, "targets": 8}, "llama": {"targets": 16}}


def _model(cfg, **changes):
    cfg = dataclasses.replace(cfg, **changes)
    return (EncoderDecoderModel if isinstance(cfg, T5Config) else DecoderOnlyModel)(cfg)


def _deeper(cfg, layers):
    if isinstance(cfg, T5Config):
        return dict(num_encoder_layers=layers, num_decoder_layers=layers)
    return dict(num_layers=layers)


def _init_program_for_cuda(model, lengths) -> str:
    """The state initializer (parameters and AdamW moments) as StableHLO for a GPU,
    lowered here on the CPU."""
    part = partitioning.Partitioner(partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
    tx = optimizers.adamw(1e-3).transformation(model.logical_axes()["params"])
    fns = train_step.make_train_step(model, tx, part, lengths=lengths)
    with part.context():
        traced = fns.init._jitted.trace(jax.random.PRNGKey(0))
        return traced.lower(lowering_platforms=("cuda",)).as_text()


def _random_draws(program: str) -> int:
    """How many times the program hashes random bits with threefry once its function calls
    are inlined, as XLA inlines them (a draw, or a key's split or fold-in: on a GPU each
    becomes its own 20 unrolled rounds)."""
    calls = {}
    for chunk in program.split("func.func ")[1:]:
        name = re.match(r"(?:public |private )?@([\w.]+)", chunk).group(1)
        calls[name] = re.findall(r"call @([\w.]+)", chunk)

    def expanded(name, seen=()):
        if name.startswith("threefry2x32"):
            return 1
        return sum(expanded(callee, seen + (name,)) for callee in calls.get(name, ()))

    return expanded("main")


@pytest.mark.parametrize("name,cfg", CASES)
def test_the_initializer_does_not_grow_with_depth(name, cfg):
    shallow = _init_program_for_cuda(_model(cfg, **_deeper(cfg, 2)), LENGTHS[name])
    deep = _init_program_for_cuda(_model(cfg, **_deeper(cfg, 8)), LENGTHS[name])
    assert _random_draws(shallow) > 0
    assert _random_draws(deep) == _random_draws(shallow)
    # the old per-layer init drew every kernel of every layer on its own: the program of
    # 8 layers held more than twice the draws of 2 layers
    per_layer = _model(cfg, **_deeper(cfg, 8))
    boxed = jax.jit(lambda k: per_layer.init_boxed(k, lengths=LENGTHS[name])).trace(
        jax.random.PRNGKey(0)).lower(lowering_platforms=("cuda",)).as_text()
    assert _random_draws(boxed) > 2 * _random_draws(deep)


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("fuse", [False, True])
def test_a_fresh_init_is_the_same_scanned_or_not(name, cfg, fuse):
    rng = jax.random.PRNGKey(7)
    plain = _model(cfg, fuse_qkv=fuse).init(rng, lengths=LENGTHS[name])
    scanned = _model(cfg, fuse_qkv=fuse, scan_layers=True).init(rng, lengths=LENGTHS[name])
    assert jax.tree.structure(plain) == jax.tree.structure(
        _model(cfg, fuse_qkv=fuse).abstract_variables(lengths=LENGTHS[name]))
    unscanned = layouts.unscan_layers(scanned["params"])
    jax.tree.map(np.testing.assert_array_equal, plain["params"], unscanned)


@pytest.mark.parametrize("name,cfg", CASES)
def test_every_layer_gets_its_own_draw_at_the_initializers_scale(name, cfg):
    params = _model(cfg, num_heads=4).init(jax.random.PRNGKey(0), lengths=LENGTHS[name])["params"]
    stack = params["decoder"]
    layers = [stack[f"layers_{i}"] for i in range(3)]
    wo = [np.asarray(layer["mlp"]["wo"]["kernel"]) for layer in layers]
    assert not np.array_equal(wo[0], wo[1]) and not np.array_equal(wo[1], wo[2])
    # fan-in truncated normal of scale 1 over mlp_dim inputs: std ~ 1/sqrt(48) (the
    # truncation at 2 std, undone by the initializer's correction, keeps it there)
    for kernel in wo:
        assert abs(kernel.std() * np.sqrt(48) - 1.0) < 0.1
        assert np.abs(kernel).max() <= 2.0 / np.sqrt(48) * 1.0001 * 0.87962566103423978 ** -1
    norms = [np.asarray(layer["pre_mlp_layer_norm"]["scale"]) for layer in layers]
    assert all(np.array_equal(n, np.ones(32)) for n in norms)


def test_logical_axes_are_traced_once_per_config_and_each_caller_gets_its_own_tree(
        monkeypatch):
    """A run asks for its model's axis names several times (optimizer, step, checkpoint),
    eval and infer for its abstract variables too: the network is traced for them once
    per config, and what one caller changes in its tree is not seen by the next."""
    other = _model(LLAMA)
    fresh, fresh_vars = other.logical_axes(), other.abstract_variables(batch_size=2)
    model = _model(LLAMA)
    traced = []
    original = type(model).init_boxed
    monkeypatch.setattr(type(model), "init_boxed",
                        lambda self, *a, **k: traced.append(1) or original(self, *a, **k))
    first = model.logical_axes()
    first["params"].clear()
    second = model.logical_axes()
    assert len(traced) == 1 and second["params"], second
    assert second == fresh
    variables = model.abstract_variables()
    variables["params"].clear()
    assert len(traced) == 1  # the same trace
    assert model.abstract_variables() == fresh_vars  # its own tree, the shapes a batch of 2's
    assert len(traced) == 1
    model.abstract_variables(batch_size=2)
    assert len(traced) == 2  # asked for another batch: traced for it
    model.config = dataclasses.replace(LLAMA, num_layers=4)
    model.logical_axes()
    assert len(traced) == 3  # another config: traced again
