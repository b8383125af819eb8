"""Transformer Engine as a precision / attention choice.

On every machine: without TE, choosing it ends in one line naming the package, the GPU
it needs and the alternative (API and command line); packed batches with TE attention
are refused in one line; microbatches combine TE's scales with min and everything else
with max. Where TE imports (an NVIDIA GPU with transformer_engine[jax] >= 2.12), the
`needs_te` tests check the numerics: TE FP8 logits near bf16, parameters identical in
name and shape to the bf16 model's (checkpoints move between them), TE attention equal to
XLA attention with T5's relative-position bias, and 1 vs 4 microbatches giving the same
update."""
import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_helpers as th
from t5lite.errors import ConfigError
from t5lite.models import configs
from t5lite.models.common import precision
from t5lite.models.common import te_backend
from t5lite.models.model import model_for_config

TE_MISSING = te_backend.unavailable_reason()
needs_te = pytest.mark.skipif(TE_MISSING is not None,
                              reason=f"Transformer Engine not usable: {TE_MISSING}")
T5_SMALLISH = configs.T5Config(vocab_size=256, emb_dim=128, num_heads=4, head_dim=32,
                               num_encoder_layers=2, num_decoder_layers=2, mlp_dim=256)


# --------------------------------------------------------------------------- any machine

@pytest.mark.skipif(TE_MISSING is None, reason="Transformer Engine is installed here")
@pytest.mark.parametrize("fields,names", [
    ({"fp8": True, "fp8_backend": "te"}, ["FP8_BACKEND='te'", "FP8_BACKEND='native'"]),
    ({"attention_impl": "te"}, ["ATTENTION_IMPL='te'", "ATTENTION_IMPL='cudnn'"]),
])
def test_missing_te_is_one_line_naming_package_gpu_and_alternative(fields, names):
    with pytest.raises(ConfigError) as err:
        model_for_config(dataclasses.replace(T5_SMALLISH, **fields))
    message = str(err.value)
    assert "\n" not in message
    for word in ["Transformer Engine", "NVIDIA GPU", "transformer_engine[jax]", *names]:
        assert word in message, message


@pytest.mark.skipif(TE_MISSING is None, reason="Transformer Engine is installed here")
def test_missing_te_on_the_command_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "t5lite.train", "--gin_file=configs/models/t5_1_1/tiny.gin",
         "--gin_file=configs/synthetic_pretrain.gin", f"--gin.MODEL_DIR='{tmp_path}/run'",
         "--gin.TRAIN_STEPS=2", "--gin.FP8=True", "--gin.FP8_BACKEND='te'"],
        cwd=th.REPO, env=th.env(devices=1), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "Transformer Engine" in errors[0] and "FP8_BACKEND='native'" in errors[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_fp8_switches_are_validated():
    with pytest.raises(ValueError, match="fp8_backend"):
        dataclasses.replace(T5_SMALLISH, fp8_backend="cublas")
    with pytest.raises(ValueError, match="fp8_recipe"):
        dataclasses.replace(T5_SMALLISH, fp8_recipe="mxfp8")
    mode = precision.fp8_mode
    assert mode(T5_SMALLISH) == "" and mode(dataclasses.replace(T5_SMALLISH, fp8=True)) == "native"
    assert mode(dataclasses.replace(T5_SMALLISH, fp8=True, fp8_backend="te",
                                    fp8_recipe="current")) == "te-current"
    # the backend alone changes nothing while FP8 is off
    assert mode(dataclasses.replace(T5_SMALLISH, fp8_backend="te")) == ""


def test_packed_batches_with_te_attention_are_refused(monkeypatch):
    """The guard itself (TE's presence faked: nothing of TE runs here)."""
    monkeypatch.setattr(te_backend, "unavailable_reason", lambda: None)
    model = model_for_config(dataclasses.replace(T5_SMALLISH, attention_impl="te"))
    model.check_features(["encoder_input_tokens", "decoder_target_tokens"])  # unpacked: fine
    with pytest.raises(ConfigError, match="PACK=False") as err:
        model.check_features(["encoder_input_tokens", "encoder_segment_ids"])
    assert "ATTENTION_IMPL='cudnn'" in str(err.value) and "\n" not in str(err.value)
    from t5lite.optim import optimizers
    from t5lite.runtime import run
    with pytest.raises(ConfigError, match="packed"):
        data = run.TrainData("synthetic", {"inputs": 8, "targets": 4}, batch_size=2, seed=0,
                             pack=True)
        run.build_run(model=model, data=data, optimizer=optimizers.adamw(1e-3),
                      devices=jax.devices()[:1])


def test_microbatches_combine_te_scales_with_min_and_the_rest_with_max():
    a = {"dense": {te_backend.TE_SCOPE: {"x_scale": jnp.array([4.0]),
                                         "x_amax_history": jnp.array([1.0, 5.0])}},
         "other": {"fp8": {"input_scale": jnp.array([2.0]),
                           "input_amax_history": jnp.array([3.0, 0.0])}}}
    b = jax.tree_util.tree_map(lambda x: x * 0 + jnp.array([2.0, 9.0])[:x.size], a)
    got = precision.combine_fp8(a, b)
    te = got["dense"][te_backend.TE_SCOPE]
    np.testing.assert_array_equal(te["x_scale"], [2.0])             # min: fp8_max / amax
    np.testing.assert_array_equal(te["x_amax_history"], [2.0, 9.0])  # max
    np.testing.assert_array_equal(got["other"]["fp8"]["input_scale"], [2.0])   # flax: max
    np.testing.assert_array_equal(got["other"]["fp8"]["input_amax_history"], [3.0, 9.0])
    start = precision.fp8_identity(a)
    assert float(start["dense"][te_backend.TE_SCOPE]["x_scale"][0]) == np.inf
    assert float(start["other"]["fp8"]["input_scale"][0]) == -np.inf
    # the identity really is one: folding it in changes nothing
    same = precision.combine_fp8(start, a)
    jax.tree_util.tree_map(np.testing.assert_array_equal, same, a)


# --------------------------------------------------------------------------- with TE (GPU)

def _t5_batch(model, batch=4):
    from t5lite.data import synthetic
    task = synthetic.SyntheticTask({"inputs": 64, "targets": 32}, model.config.vocab_size,
                                   model.FEATURE_CONVERTER_KIND)
    return {k: jnp.asarray(v) for k, v in task.global_batch(0, batch).items()}


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("backend,recipe", [
    ("native", "delayed"), pytest.param("te", "delayed", marks=needs_te),
    pytest.param("te", "current", marks=needs_te)])
def test_fp8_logits_near_bf16_with_the_same_parameters(backend, recipe):
    bf16 = model_for_config(T5_SMALLISH)
    te = model_for_config(dataclasses.replace(T5_SMALLISH, fp8=True, fp8_backend=backend,
                                              fp8_recipe=recipe))
    # jitted: outside jit flax compiles a program for each primitive (seconds of CPU)
    variables = jax.jit(te.init)(jax.random.PRNGKey(0))
    ref = jax.eval_shape(bf16.init, jax.random.PRNGKey(0))
    shapes = lambda t: jax.tree_util.tree_map(lambda x: x.shape, t)  # noqa: E731
    assert shapes(variables["params"]) == shapes(ref["params"])      # checkpoints move
    batch = _t5_batch(bf16)
    want = jax.jit(bf16.logits)({"params": variables["params"]}, batch)
    got = jax.jit(te.logits)(variables, batch)
    assert _rel(got, want) < 0.15, _rel(got, want)


@needs_te
def test_te_attention_matches_xla_attention_with_relative_bias():
    xla = model_for_config(T5_SMALLISH)
    te = model_for_config(dataclasses.replace(T5_SMALLISH, attention_impl="te"))
    params = xla.init(jax.random.PRNGKey(0))
    batch = _t5_batch(xla)
    f32 = model_for_config(dataclasses.replace(T5_SMALLISH, dtype="float32"))
    bf16_error = _rel(xla.logits(params, batch), f32.logits(params, batch))
    assert _rel(te.logits(params, batch), xla.logits(params, batch)) < max(3 * bf16_error, 1e-3)


@pytest.mark.parametrize("backend", ["native", pytest.param("te", marks=needs_te)])
def test_fp8_microbatches_give_the_same_update(backend):
    """1 vs 4 microbatches: the same parameters after one step and the same FP8 state
    (native runs everywhere and keeps this test honest on CPU); one layer a side, as the
    depth changes nothing of how microbatches combine."""
    from t5lite.optim import optimizers
    from t5lite.runtime import run
    from t5lite.runtime.partitioning import MeshSettings
    import optax
    cfg = dataclasses.replace(T5_SMALLISH, fp8=True, fp8_backend=backend, dtype="float32",
                              num_encoder_layers=1, num_decoder_layers=1)
    sgd = optimizers.Optimizer(optax.sgd(1.0), lambda step: 1.0, "sgd")  # update = -grad
    states = []
    for k in (1, 4):
        data = run.TrainData("synthetic", {"inputs": 64, "targets": 32}, batch_size=8,
                             seed=0, pack=False)
        the_run = run.build_run(model=model_for_config(cfg), data=data,
                                optimizer=sgd, num_microbatches=k,
                                mesh=MeshSettings.data_parallel(), devices=jax.devices()[:1])
        state = the_run.step_fns.init(jax.random.PRNGKey(0))
        state, _ = the_run.step_fns.train_step(state, the_run.next_batch())
        states.append(jax.device_get(state))
    for a, b in zip(jax.tree_util.tree_leaves(states[0].params),
                    jax.tree_util.tree_leaves(states[1].params)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(states[0].fp8),
                    jax.tree_util.tree_leaves(states[1].fp8)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
