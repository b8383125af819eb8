"""The train step: one jitted pure function `train_step(state, batch) -> (state, metrics)`
with in/out shardings and donated state, gradient accumulation as a scan inside it.

Only the model's trainable parameters (`model.split_trainable`: all of them, or with LoRA
the adapters) are differentiated and optimized: the gradient is taken with respect to
them alone, with the frozen rest closed over (no gradient of it is computed), the
optimizer state holds them alone, and the frozen leaves pass through the step untouched
(bit-identical). The state's `params` keep the whole tree.

Loss normalization is exact under accumulation: every microbatch contributes its token
sums, and the sums are divided once by the whole batch's normalizer, so k microbatches
give the update of the whole batch. FP8 state is not a parameter: its "gradient" is its
new value (flax's overwrite-with-gradient contract); microbatches combine it with max
(min for Transformer Engine's scales: `precision.combine_fp8`),
and it never reaches the optimizer, clipping or weight decay.

With SHARD_OPTIMIZER_OVER_DATA the optimizer state, the gradients it reads and the
update are split over `data` (`runtime/optimizer_sharding.py`): the gradients are
reduce-scattered, each replica updates its slice, and the parameters are all-gathered.

With SKIP_BAD_STEPS the optimizer skips a step whose gradient is not finite or above
MAX_GRAD_NORM_TO_APPLY (`optim/skipping.py`); the step then keeps the parameters and FP8
state as they were (the step count and the dropout key still advance: the batch is
spent), and its metrics say so (`skipped`, `skipped_in_a_row`, `skipped_steps`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from t5lite.models.common import precision
from t5lite.models.common.precision import FP8_COLLECTION
from t5lite.optim import skipping
from t5lite.runtime.partitioning import Partitioner
from t5lite.optim.train_state import TrainState

Metrics = Dict[str, jax.Array]


def _split_variables(variables) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    params = {"params": variables["params"]}
    fp8 = {k: v for k, v in variables.items() if k == FP8_COLLECTION}
    return params, fp8


def init_state(model, tx: optax.GradientTransformation, rng: jax.Array,
               lengths: Optional[Dict[str, int]] = None) -> TrainState:
    """A fresh TrainState (call under jit with out_shardings to create it sharded)."""
    init_rng, dropout_rng = jax.random.split(rng)
    params, fp8 = _split_variables(model.init(init_rng, lengths=lengths))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, fp8=fp8,
                      opt_state=tx.init(model.split_trainable(params["params"])[0]),
                      rng=jax.random.key_data(dropout_rng))


def state_shardings(partitioner: Partitioner, model, abstract_state: TrainState) -> TrainState:
    """Shardings for every leaf of the state: parameters by their logical names, optimizer
    moments like their (trainable) parameters, FP8 state, step and rng replicated."""
    names = model.logical_axes()
    param_specs = {"params": names["params"]}
    params_sh = partitioner.tree_shardings(abstract_state.params, param_specs)
    trainable = model.split_trainable(abstract_state.params["params"])[0]
    opt_sh = partitioner.opt_state_shardings(
        abstract_state.opt_state, trainable,
        jax.tree_util.tree_map(lambda a, s: partitioner.spec_for(tuple(s), a.shape),
                               trainable, model.split_trainable(names["params"])[0],
                               is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
    rep = partitioner.replicated()
    return TrainState(step=rep, params=params_sh,
                      fp8=jax.tree_util.tree_map(lambda _: rep, abstract_state.fp8),
                      opt_state=opt_sh, rng=rep)


@dataclasses.dataclass
class StepFunctions:
    """What `make_train_step` returns: the jitted step and the state shardings."""

    train_step: Callable[[TrainState, Dict[str, jax.Array]], Tuple[TrainState, Metrics]]
    state_shardings: TrainState
    abstract_state: TrainState
    init: Callable[[jax.Array], TrainState]


def _microbatch_grads(model, variables, batch, rng, num_microbatches: int, partitioner,
                      norm):
    """Summed loss, summed metrics and summed gradients (float32) of the trainable
    parameters (`model.split_trainable`) over microbatches; FP8 state combined by
    `precision.combine_fp8` (max; min for TE's scales). Returns (loss_sum, metrics_sums,
    trainable_grads, new_fp8).

    The gradient is that of loss_sum + norm * moe/objective / num_microbatches for each
    microbatch (`norm`: the whole batch's normalizer), so that, divided by `norm`, it is
    the gradient of loss / norm plus the mean over microbatches (all the same size) of
    the routers' losses: k microbatches give the whole batch's, load balancing included."""
    params, fp8 = _split_variables(variables)
    trainable, frozen = model.split_trainable(params["params"])

    def loss_sums(trainable_, fp8_, mb, mb_rng):
        whole = {"params": model.join_trainable(trainable_, frozen), **fp8_}
        loss_sum, sums = model.loss_sums(whole, mb, mb_rng)
        objective = loss_sum
        if "moe/objective" in sums:
            objective = objective + norm * sums["moe/objective"] / num_microbatches
        return objective, (loss_sum, sums)

    def one(mb, mb_rng):
        (_, (loss_sum, sums)), (g_params, g_fp8) = jax.value_and_grad(
            loss_sums, argnums=(0, 1), has_aux=True)(trainable, fp8, mb, mb_rng)
        g_params = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), g_params)
        return loss_sum, sums, g_params, g_fp8

    if num_microbatches == 1:
        return one(batch, rng)

    def split(x):
        mb = x.reshape((num_microbatches, x.shape[0] // num_microbatches) + x.shape[1:])
        return mb

    mbs = jax.tree_util.tree_map(split, batch)

    def body(carry, xs):
        i, mb = xs
        mb = {k: jax.lax.with_sharding_constraint(v, partitioner.batch_sharding(v.ndim))
              for k, v in mb.items()}
        loss_sum, sums, g_params, g_fp8 = one(mb, jax.random.fold_in(rng, i))
        acc_loss, acc_sums, acc_g, acc_fp8 = carry
        acc_g = jax.tree_util.tree_map(jnp.add, acc_g, g_params)
        acc_fp8 = precision.combine_fp8(acc_fp8, g_fp8)
        acc_sums = jax.tree_util.tree_map(jnp.add, acc_sums, sums)
        return (acc_loss + loss_sum, acc_sums, acc_g, acc_fp8), None

    zero_g = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), trainable)
    low_fp8 = precision.fp8_identity(fp8)
    first = jax.tree_util.tree_map(lambda x: x[0], mbs)
    zero_sums = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype),
                                       jax.eval_shape(one, first, rng)[1])
    (loss_sum, sums, grads, new_fp8), _ = jax.lax.scan(
        body, (jnp.zeros((), jnp.float32), zero_sums, zero_g, low_fp8),
        (jnp.arange(num_microbatches), mbs))
    return loss_sum, sums, grads, new_fp8


INIT_COMPILER_OPTIONS = {"xla_gpu_enable_latency_hiding_scheduler": False}
"""XLA options the state initializer compiles with, over the launchers' XLA_FLAGS: it runs
once and has no communication to hide, so scheduling it for overlap only costs compile
time (T5 base for an H200, compiled on a CPU: 3.3 -> 2.8 s). Ignored off GPUs."""


def make_train_step(model, tx: optax.GradientTransformation, partitioner: Partitioner, *,
                    learning_rate_fn: Optional[Callable] = None, num_microbatches: int = 1,
                    lengths: Optional[Dict[str, int]] = None,
                    bad_gradient_steps: Tuple[int, ...] = ()) -> StepFunctions:
    """Build the jitted, sharded train step and state initializer for `model`.
    `bad_gradient_steps` (fault injection, INJECT_BAD_GRADIENT): the steps, counted from
    1, whose gradient is made NaN."""

    def init(rng):
        return init_state(model, tx, rng, lengths)

    with partitioner.context():  # an abstract key: no array is made on the mesh's
        # devices, which may be compile-only ones (a GPU's, compiled for on a CPU)
        abstract = jax.eval_shape(init, jax.ShapeDtypeStruct((2,), jnp.uint32))
    shardings = state_shardings(partitioner, model, abstract)
    trainable_shardings = model.split_trainable(shardings.params["params"])[0]
    # where the optimizer updates each trainable leaf: as the parameter is sharded, or
    # with SHARD_OPTIMIZER_OVER_DATA a 1/data slice of it (`optimizer_sharding`)
    trainable_abstract = model.split_trainable(abstract.params["params"])[0]
    update_shardings = partitioner.update_shardings(
        trainable_abstract, jax.tree_util.tree_map(lambda s: s.spec, trainable_shardings))

    def step_fn(state: TrainState, batch: Dict[str, jax.Array]):
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        norm = model.normalizer(batch)
        loss_sum, sums, grads, new_fp8 = _microbatch_grads(
            model, state.variables, batch, rng, num_microbatches, partitioner, norm)
        grads = jax.tree_util.tree_map(lambda g: g / norm, grads)
        if bad_gradient_steps:
            bad = jnp.isin(state.step + 1, jnp.asarray(bad_gradient_steps, jnp.int32))
            grads = jax.tree_util.tree_map(lambda g: jnp.where(bad, jnp.nan, g), grads)
        # the gradients reduced onto the slices the optimizer updates (a reduce-scatter
        # over data with SHARD_OPTIMIZER_OVER_DATA, else the parameters' own shardings);
        # the updated slices gathered back into the parameters' shardings
        grads = jax.lax.with_sharding_constraint(grads, update_shardings)
        trainable, frozen = model.split_trainable(state.params["params"])
        trainable = jax.lax.with_sharding_constraint(trainable, update_shardings)
        updates, opt_state = tx.update(grads, state.opt_state, trainable)
        updated = jax.lax.with_sharding_constraint(optax.apply_updates(trainable, updates),
                                                   trainable_shardings)
        new_params = {"params": model.join_trainable(updated, frozen)}
        new_fp8 = new_fp8 if state.fp8 else state.fp8
        applied = skipping.applied(opt_state)
        if applied is not None:  # a skipped step keeps the parameters and FP8 state as they were
            new_params = skipping.select(applied, new_params, state.params)
            new_fp8 = skipping.select(applied, new_fp8, state.fp8)
        new_state = state.replace(step=state.step + 1, params=new_params,
                                  opt_state=opt_state, fp8=new_fp8)
        metrics = {
            "loss": loss_sum / norm,
            "loss_per_token": loss_sum / jnp.maximum(sums["weight_sum"], 1.0),
            "z_loss": sums["z_loss"] / norm,
            "accuracy": sums["correct"] / jnp.maximum(sums["weight_sum"], 1.0),
            "grad_norm": optax.tree.norm(grads),
            "param_norm": optax.tree.norm(new_params),
            "weight_sum": sums["weight_sum"],
            "nonpadding_fraction": sums["nonpadding"] / batch["decoder_target_tokens"].size,
        }
        metrics.update({k: v / num_microbatches for k, v in sums.items()
                        if k.startswith("moe/")})  # per-microbatch means
        metrics.update(skipping.step_metrics(opt_state))
        if learning_rate_fn is not None:
            metrics["learning_rate"] = jnp.asarray(learning_rate_fn(state.step), jnp.float32)
        return new_state, metrics

    train_step = partitioner.partition(
        step_fn, in_shardings=(shardings, partitioner.batch_sharding(2)),
        out_shardings=(shardings, partitioner.replicated()), donate_argnums=(0,))
    sharded_init = partitioner.partition(init, out_shardings=shardings,
                                         compiler_options=INIT_COMPILER_OPTIONS)
    return StepFunctions(train_step=train_step, state_shardings=shardings,
                         abstract_state=abstract, init=sharded_init)
