"""t5lite's Adafactor takes T5X's step (issue 27): the factoring plans give T5X's view of
each parameter (heads joined, each layer and each of q / k / v apart), and a T5X run's
Adafactor state, imported, gives the update a hand-written reference of T5X's rule gives
(`t5x/adafactor.py`'s `apply_param_gradient`, restated below in numpy) for the same
state and gradient, in the plain and in the fused + scanned layouts, for factored and
unfactored parameters, with and without momentum."""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

from t5lite.errors import CheckpointMismatchError
from t5lite.models import layouts
from t5lite.models.common import param_paths
from t5lite.formats import t5x_params
from t5lite.models.configs import T5Config
from t5lite.models.model import model_for_config
from t5lite.optim import adafactor, optimizers
from t5lite.formats import checkpoint_kinds
from t5lite.formats import t5x_checkpoint
from t5lite.formats import t5x_optimizer_state

import t5x_helpers as tx

STEP = 41


# ------------------------------------------------------------------ T5X's rule, by hand


def t5x_update(param, grad, slots, step, lr, beta1=None, decay_exponent=0.8, eps1=1e-30,
               eps2=1e-3, clipping_threshold=1.0):
    """One T5X Adafactor update of one (at most 2-D) parameter: (new param, new slots)."""
    decay = 1.0 - np.float32(step + 1.0) ** -decay_exponent
    mixing = 1.0 - decay
    scale = lr * max(float(np.sqrt(np.mean(param * param))), eps2)
    sq = grad * grad + eps1
    new = dict(slots)
    dims = tx.t5x_factored_dims(param.shape)
    if dims is not None:
        d1, d0 = dims
        new["v_row"] = decay * slots["v_row"] + mixing * sq.mean(axis=d0)
        new["v_col"] = decay * slots["v_col"] + mixing * sq.mean(axis=d1)
        row_factor = (new["v_row"] / new["v_row"].mean()) ** -0.5
        col_factor = new["v_col"] ** -0.5
        y = grad * np.expand_dims(row_factor, d0) * np.expand_dims(col_factor, d1)
    else:
        new["v"] = decay * slots["v"] + mixing * sq
        y = grad * new["v"] ** -0.5
    y = y / max(1.0, float(np.sqrt(np.mean(y * y))) / clipping_threshold)
    sub = scale * y
    if beta1 is not None:
        new["m"] = beta1 * slots["m"] + (1.0 - beta1) * sub
        sub = new["m"]
    return (param - sub).astype(np.float32), {k: np.asarray(v, np.float32)
                                              for k, v in new.items()}


# ------------------------------------------------------------------ the plans


@pytest.mark.parametrize("shape,names,plan", [
    ((768, 12, 64), ("embed", "heads", "kv"), ((), (0,), (1, 2))),       # base: tie, axis 0
    ((512, 6, 64), ("embed", "heads", "kv"), ((), (1, 2), (0,))),        # small: 384 < 512
    ((12, 64, 768), ("heads", "kv", "embed"), ((), (0, 1), (2,))),
    ((2, 768, 12, 64), ("layers", "embed", "heads", "kv"), ((0,), (1,), (2, 3))),
    ((768, 3, 12, 64), ("embed", "stack", "heads", "kv"), ((1,), (0,), (2, 3))),
    ((32128, 768), ("vocab", "embed"), ((), (1,), (0,))),
    ((768, 2048), ("embed", "mlp"), ((), (0,), (1,))),
    ((12, 32), ("heads", "relpos_buckets"), ((), None, None)),
    ((2, 768), ("layers", "embed"), ((0,), None, None)),
    ((4, 256, 512), None, ((), (1,), (2,))),  # by shape: the two largest, like optax
])
def test_plans_give_t5x_view(shape, names, plan):
    got = adafactor.plan_leaf(shape, names)
    assert (got.batch, got.row, got.col) == plan


# ------------------------------------------------------------------ the import


CFG = T5Config(vocab_size=160, emb_dim=128, num_heads=2, head_dim=64, num_encoder_layers=2,
               num_decoder_layers=2, mlp_dim=192, dtype="float32")


@functools.lru_cache(maxsize=None)
def _init_params():
    """CFG's plain parameters at PRNGKey(0), drawn once for the module in one compiled
    program (op by op, each primitive compiled a program of its own); read only."""
    init = functools.partial(model_for_config(CFG).init, lengths={"inputs": 8, "targets": 8})
    return jax.tree.map(np.asarray, jax.jit(init)(jax.random.PRNGKey(0))["params"])


def _t5x_view(params):
    """t5lite's plain params -> T5X's tree (kernels [embed, heads*kv] / [heads*kv, embed])."""
    flat = param_paths.flatten(params)
    out = {}
    for name, value in flat.items():
        value = np.asarray(value, np.float32)
        if value.ndim == 3:
            value = value.reshape(value.shape[0], -1) if name.endswith(
                ("query/kernel", "key/kernel", "value/kernel")) else value.reshape(-1,
                                                                                   value.shape[-1])
        out[name] = value
    return out


def _model_tree(flat_view, model):
    """A T5X-view tree in `model`'s layout (as the parameters are imported)."""
    plain = type(model)(dataclasses.replace(model.config, fuse_qkv=False, scan_layers=False))
    tree = t5x_params.params_from_t5x(param_paths.unflatten(flat_view), plain)
    return layouts.convert_params({"params": tree}, plain.config, model.config)["params"]


@pytest.mark.parametrize("layout,beta1,orbax", [
    ({}, None, False), ({"fuse_qkv": True, "scan_layers": True}, None, False), ({}, 0.9, False),
    ({"scan_layers": True}, 0.9, True),  # T5X's Orbax layout
])
def test_imported_t5x_state_takes_t5x_steps(tmp_path, layout, beta1, orbax):
    rng = np.random.default_rng(0)
    plain = model_for_config(CFG)
    view = _t5x_view(jax.tree.map(np.copy, _init_params()))
    slots = tx.adafactor_slots(view, rng, beta1)
    write = tx.write_t5x_orbax_checkpoint if orbax else tx.write_t5x_checkpoint
    ckpt = write(tmp_path / ("run" if orbax else f"checkpoint_{STEP}"),
                 param_paths.unflatten(view), step=STEP, param_states=tx.param_states(slots))
    model = model_for_config(dataclasses.replace(CFG, **layout))
    schedule = optimizers.rsqrt_decay(base_learning_rate=1.0, warmup_steps=10)
    opt = optimizers.adafactor(schedule, momentum=beta1)
    txf = opt.transformation(model.logical_axes()["params"])
    abstract = model.abstract_variables()["params"]
    tree = t5x_checkpoint.read_checkpoint(ckpt)
    state = t5x_optimizer_state.opt_state_from_t5x(
        tree["state"], model, jax.eval_shape(txf.init, abstract), opt.factoring, "test")
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params = checkpoint_kinds.open_checkpoint(ckpt, "test").read_params(model, {"params": jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), abstract)})
    params = params["params"]
    ref_params = dict(view)
    update = jax.jit(txf.update)  # jitted: op by op, each primitive compiled a program
    for k in range(2):  # the first update after the import, and the one after it
        grads_view = {n: rng.normal(size=p.shape).astype(np.float32) for n, p in view.items()}
        grads = _model_tree(grads_view, model)
        updates, state = update(grads, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        lr = float(schedule(STEP + k))
        for name in view:
            ref_params[name], slots[name] = t5x_update(ref_params[name], grads_view[name],
                                                       slots[name], STEP + k, lr, beta1=beta1)
        got = _t5x_view(layouts.convert_params({"params": params}, model.config,
                                               plain.config)["params"])
        for name in view:
            np.testing.assert_allclose(got[name] - view[name], ref_params[name] - view[name],
                                       rtol=2e-4, atol=1e-7, err_msg=f"update {k}: {name}")
    assert int(state[1].count) == STEP + 2  # the schedule and the moments went on from it


def test_a_state_that_does_not_map_is_one_line(tmp_path):
    rng = np.random.default_rng(1)
    model = model_for_config(CFG)
    view = _t5x_view(jax.tree.map(np.copy, _init_params()))
    slots = tx.adafactor_slots(view, rng, None)
    state = {"step": np.int32(STEP), "param_states": tx.param_states(slots)}
    abstract = model.abstract_variables()["params"]
    axes = model.logical_axes()["params"]

    def imported(opt):
        txf = opt.transformation(axes)
        return t5x_optimizer_state.opt_state_from_t5x(state, model, jax.eval_shape(
            txf.init, abstract), opt.factoring, "T5X checkpoint X")

    cases = [
        (optimizers.adafactor(0.1, min_dim_size_to_factor=4096), "factored the second moment"),
        (optimizers.adafactor(0.1, momentum=0.9), "no beta1"),
        (optimizers.adamw(0.1), "another"),
    ]
    for opt, needle in cases:
        with pytest.raises(CheckpointMismatchError) as e:
            imported(opt)
        message = str(e.value)
        assert needle in message and "\n" not in message, message
        assert "INITIAL_CHECKPOINT_STATE='params'" in message
    del slots["decoder/logits_dense/kernel"]
    state["param_states"] = tx.param_states(slots)
    with pytest.raises(CheckpointMismatchError, match="'decoder/logits_dense/kernel'"):
        imported(optimizers.adafactor(0.1))


def test_a_t5x_run_continued_with_skip_bad_steps_wraps_the_same_state(tmp_path):
    """INITIAL_CHECKPOINT_STATE='train_state' with SKIP_BAD_STEPS: the T5X run's
    parameters, step and Adafactor state as without it, inside the skipping wrapper's
    state with no step skipped yet."""
    from t5lite.optim import skipping
    from t5lite.runtime import train_step
    from t5lite.runtime.checkpointing import finetune_restore
    rng = np.random.default_rng(1)
    model = model_for_config(CFG)
    view = _t5x_view(jax.tree.map(np.copy, _init_params()))
    ckpt = tx.write_t5x_checkpoint(tmp_path / f"checkpoint_{STEP}", param_paths.unflatten(view),
                                   step=STEP, param_states=tx.param_states(
                                       tx.adafactor_slots(view, rng, None)))
    opt = optimizers.adafactor(0.01)
    plain_tx = opt.transformation(model.logical_axes()["params"])

    def continued(transformation):
        @jax.jit  # jitted: op by op, each primitive compiled a program of its own
        def init_fn():
            return train_step.init_state(model, transformation, jax.random.PRNGKey(0))
        abstract = jax.eval_shape(init_fn)
        return finetune_restore.continue_t5x_run(str(ckpt), model, abstract, init_fn,
                                                 opt.factoring)

    plain, skipped = continued(plain_tx), continued(skipping.skip_bad_steps(plain_tx))
    assert isinstance(skipped.opt_state, skipping.SkipState)
    assert bool(skipped.opt_state.applied) and int(skipped.opt_state.in_a_row) == 0 \
        and int(skipped.opt_state.total) == 0
    assert int(skipped.step) == int(plain.step) == STEP
    jax.tree.map(np.testing.assert_array_equal, skipped.opt_state.inner, plain.opt_state)
    jax.tree.map(np.testing.assert_array_equal, skipped.params, plain.params)
