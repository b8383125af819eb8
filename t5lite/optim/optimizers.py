"""Optimizers (Adafactor, AdamW) and learning-rate schedules, built on optax.

Everything here is a pure function; Gin registration lives in `t5lite/config/registry.py`.

Schedules map the optimizer step to a float32 learning rate and are jnp-traceable::

    constant(value)
    rsqrt_decay(base_learning_rate=1.0, warmup_steps=10000)     T5 / T5X pretraining
    linear_decay(peak, *, decay_steps, end=0.0, warmup_steps=0) T5X GPU Pile recipe
    cosine_with_warmup(peak, warmup_steps, decay_steps, end_fraction=0.1)   GPT recipe

`step` is the number of updates already applied: the first update uses `schedule(0)`.
Step counts (`warmup_steps`, `decay_steps`) are absolute: `decay_steps` is the step at
which the decay reaches its end value, counted from 0, not from the end of warmup.

An `Optimizer` pairs the optax transformation with its schedule. The schedule is applied
INSIDE the transformation (`optax.scale_by_schedule`, which counts updates in its own
state), so the learning rate used by update t is exactly `learning_rate_fn(t)`;
`learning_rate_fn` is exposed only for logging. (T5X's GPU wrapper built the schedule and
then dropped it; here the schedule cannot be lost because it is part of `tx`.)

Both optimizers see only the trainable `params["params"]` tree. FP8 scales and amax
histories live in their own collection, which the trainer updates by overwrite and never
passes here, so nothing in this module has to skip them (no clipping, decay or moments).

The optax chains always have the same stages whatever the options (an option that is
off is an `optax.identity()` placeholder), so a checkpointed `opt_state` keeps its tree
paths when e.g. `clip_norm` or `weight_decay` change between runs. Switching Adafactor's
`momentum` on or off does change the state (it adds a first moment).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite.errors import ConfigError
from t5lite.optim import adafactor as adafactor_rule

Schedule = Callable[[Any], jax.Array]
ScheduleOrFloat = Union[Schedule, float, int]
MaskOrFn = Union[Any, Callable[[Any], Any], None]

NO_DECAY_NAMES = ("scale", "bias")
"""Leaf names the default AdamW weight-decay mask leaves alone (norm scales, biases)."""


# ----------------------------------------------------------------------------- schedules


def _as_step(step) -> jax.Array:
    return jnp.asarray(step, jnp.float32)


def _check_steps(name: str, warmup_steps: int, decay_steps: Optional[int] = None) -> None:
    if warmup_steps < 0:
        raise ConfigError(f"{name}: warmup_steps must be >= 0, got {warmup_steps}")
    if decay_steps is not None and decay_steps < warmup_steps:
        raise ConfigError(f"{name}: decay_steps ({decay_steps}) is the absolute step where "
                          f"the decay ends and must be >= warmup_steps ({warmup_steps})")


def _finite(name: str, value) -> float:
    """`value` as a float; ConfigError naming the setting unless it is a finite number
    (an infinite or NaN rate would wreck the parameters at the first update)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating,
                                                         np.integer)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise ConfigError(f"{name} must be a finite number, got {float(value)}; set it to "
                          f"the learning rate you mean (e.g. 1e-3)")
    return float(value)


def _warmup(peak: float, warmup_steps: int, step: jax.Array) -> jax.Array:
    """Linear from 0 at step 0 to `peak` at `warmup_steps`."""
    return peak * step / max(warmup_steps, 1)


def constant(value: float) -> Schedule:
    """lr(step) = value."""
    value = _finite("learning_rate", value)

    def schedule(step):
        return jnp.full(jnp.shape(step), value, jnp.float32)

    return schedule


def rsqrt_decay(base_learning_rate: float = 1.0, warmup_steps: int = 10000) -> Schedule:
    """T5 / T5X pretraining: lr(step) = base / sqrt(max(step, warmup_steps)).

    Flat at base / sqrt(warmup_steps) for the first `warmup_steps` steps (T5's "warmup" is
    a plateau, not a ramp), then inverse square root decay. With warmup_steps 0 the
    denominator is floored at 1 so step 0 stays finite."""
    _check_steps("rsqrt_decay", warmup_steps)
    base = _finite("rsqrt_decay.base_learning_rate", base_learning_rate)
    floor = float(max(warmup_steps, 1))

    def schedule(step):
        return base * jax.lax.rsqrt(jnp.maximum(_as_step(step), floor))

    return schedule


def linear_decay(peak: float, *, decay_steps: int, end: float = 0.0,
                 warmup_steps: int = 0) -> Schedule:
    """Linear warmup from 0 to `peak` over `warmup_steps`, then linear to `end` at step
    `decay_steps`, then constant `end`.

        lr(s) = peak * s / warmup                                   s <  warmup
              = peak + (end - peak) * (s - warmup) / (decay - warmup)  warmup <= s < decay
              = end                                                 s >= decay
    """
    _check_steps("linear_decay", warmup_steps, decay_steps)
    peak, end = _finite("linear_decay.peak", peak), _finite("linear_decay.end", end)
    span = float(max(decay_steps - warmup_steps, 1))

    def schedule(step):
        s = _as_step(step)
        frac = jnp.clip((s - warmup_steps) / span, 0.0, 1.0)
        decayed = peak + (end - peak) * frac
        return jnp.where(s < warmup_steps, _warmup(peak, warmup_steps, s), decayed)

    return schedule


def cosine_with_warmup(peak: float, warmup_steps: int, decay_steps: int,
                       end_fraction: float = 0.1) -> Schedule:
    """Linear warmup from 0 to `peak` over `warmup_steps`, then a half cosine down to
    `end_fraction * peak` at step `decay_steps`, then flat (GPT recipe: decay to 10%).

        lr(s) = end + (peak - end) * (1 + cos(pi * (s - warmup) / (decay - warmup))) / 2
    """
    _check_steps("cosine_with_warmup", warmup_steps, decay_steps)
    peak = _finite("cosine_with_warmup.peak", peak)
    end = _finite("cosine_with_warmup.end_fraction", end_fraction) * peak
    span = float(max(decay_steps - warmup_steps, 1))

    def schedule(step):
        s = _as_step(step)
        frac = jnp.clip((s - warmup_steps) / span, 0.0, 1.0)
        decayed = end + (peak - end) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
        return jnp.where(s < warmup_steps, _warmup(peak, warmup_steps, s), decayed)

    return schedule


def as_schedule(learning_rate: ScheduleOrFloat, owner: str = "") -> Schedule:
    """A schedule stays as it is; a number becomes `constant(number)`. `owner` (the
    optimizer) names the setting in errors. A rate that is not finite, or a schedule
    whose first rate is not, is refused (ConfigError) before any step."""
    name = f"{owner}.learning_rate" if owner else "learning_rate"
    if callable(learning_rate):
        first = float(learning_rate(0))
        if not math.isfinite(first):
            raise ConfigError(f"{name}: the schedule's learning rate at step 0 is {first}; "
                              f"check its settings")
        return learning_rate
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        return constant(_finite(name, learning_rate))
    raise TypeError(f"learning_rate must be a number or a schedule (step -> lr), got "
                    f"{learning_rate!r}")


# ----------------------------------------------------------------------------- optimizers


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """`tx` already applies `learning_rate_fn` (from its own update count);
    `learning_rate_fn(step)` is the lr that update number `step` (0-based) uses.
    `for_axes(param_axes)`, where given, builds the transformation for parameters with
    those logical axis names (Adafactor factors by them); `factoring`: its options."""

    tx: optax.GradientTransformation
    learning_rate_fn: Schedule
    name: str = "optimizer"
    for_axes: Optional[Callable[[Any], optax.GradientTransformation]] = None
    factoring: Optional[Dict[str, Any]] = None

    def transformation(self, param_axes: Any = None) -> optax.GradientTransformation:
        """The transformation for parameters with logical axis names `param_axes`
        (`model.logical_axes()["params"]`); `tx` when None or not needed."""
        if param_axes is None or self.for_axes is None:
            return self.tx
        return self.for_axes(param_axes)


def _maybe(enabled: bool, make: Callable[[], optax.GradientTransformation]):
    return make() if enabled else optax.identity()


def _global_clip(clip_norm: Optional[float]) -> optax.GradientTransformation:
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")
    return _maybe(clip_norm is not None, lambda: optax.clip_by_global_norm(clip_norm))


def _leaf_name(path) -> Optional[str]:
    """The last dict key on a tree path (skips attribute keys such as a box's `value`)."""
    for key in reversed(path):
        if isinstance(key, jax.tree_util.DictKey):
            return str(key.key)
    return None


def default_weight_decay_mask(params: Any) -> Any:
    """True for leaves that get weight decay: ndim >= 2 and not named `scale` / `bias`.

    That is kernels, embeddings and relative-position tables, but not norm scales or
    biases. The name rule matters with scanned layers, where a norm scale gains a
    leading `layers` axis and is 2-D."""
    def decide(path, leaf):
        return jnp.ndim(leaf) >= 2 and _leaf_name(path) not in NO_DECAY_NAMES

    return jax.tree_util.tree_map_with_path(decide, params)


def adafactor(learning_rate: ScheduleOrFloat, decay_rate: float = 0.8,
              clipping_threshold: Optional[float] = 1.0,
              multiply_by_parameter_scale: bool = True, factored: bool = True,
              min_dim_size_to_factor: int = 128, epsilon1: float = 1e-30,
              epsilon2: float = 1e-3, momentum: Optional[float] = None,
              weight_decay_rate: Optional[float] = None, clip_norm: Optional[float] = None,
              weight_decay_mask: MaskOrFn = None, decay_offset: int = 0) -> Optimizer:
    """Adafactor with T5's defaults, step for step T5X's (`t5x/adafactor.py`).

    Per update t (0-based), for each parameter p with gradient g:

    - optional global-norm clipping of all gradients to `clip_norm` (T5X's
      `global_norm_clip_threshold`; off by default);
    - second moment with beta2_t = 1 - (t + 1 - decay_offset) ** -decay_rate of
      g**2 + epsilon1, factored (`t5lite.optim.adafactor`: a row and a column vector,
      over T5X's view of the parameter, heads joined and each layer apart) when
      `factored` and the smaller of the two dimensions is >= `min_dim_size_to_factor`,
      full otherwise; y = g / sqrt(v);
    - update clipping: y /= max(1, RMS(y) / clipping_threshold);
    - step size learning_rate(t), times max(RMS(p), epsilon2) when
      `multiply_by_parameter_scale`;
    - optional momentum (EMA of the scaled update, no bias correction; T5X's beta1);
    - optional decoupled weight decay p -= weight_decay_rate * p (not scaled by the
      learning rate, as in T5X), on every leaf unless `weight_decay_mask` says otherwise.

    `tx` plans each leaf by its shape alone (then, with `epsilon2` = 1e-3 and no
    `clip_norm`, it is `optax.adafactor`); a training run takes
    `transformation(model.logical_axes()["params"])`, planned by the axis names. RMS
    statistics are per T5X parameter: per layer of a scanned stack, per q / k / v of a
    fused kernel.
    """
    schedule = as_schedule(learning_rate, "adafactor")
    settings = dict(factored=factored, min_dim_size_to_factor=min_dim_size_to_factor)

    def build(param_axes):
        return optax.chain(
            _global_clip(clip_norm),
            adafactor_rule.scale_by_factored_rms(
                decay_rate=decay_rate, step_offset=decay_offset, epsilon1=epsilon1,
                clipping_threshold=clipping_threshold,
                epsilon2=epsilon2 if multiply_by_parameter_scale else None,
                param_axes=param_axes, **settings),
            optax.scale_by_learning_rate(schedule, flip_sign=False),
            _maybe(momentum is not None, lambda: optax.ema(momentum, debias=False)),
            _maybe(weight_decay_rate is not None,
                   lambda: optax.add_decayed_weights(weight_decay_rate, mask=weight_decay_mask)),
            optax.scale(-1.0),
        )
    return Optimizer(tx=build(None), learning_rate_fn=schedule, name="adafactor",
                     for_axes=build, factoring=settings)


def adamw(learning_rate: ScheduleOrFloat, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, weight_decay: float = 0.0, clip_norm: Optional[float] = None,
          weight_decay_mask: MaskOrFn = default_weight_decay_mask) -> Optimizer:
    """AdamW (Loshchilov & Hutter) with optional global-norm gradient clipping.

    Per update t (0-based): gradients are first clipped to global norm `clip_norm` (all
    leaves together; off when None), then the bias-corrected Adam direction
    m_hat / (sqrt(v_hat) + eps) gets the decoupled weight decay `weight_decay * p` added
    and the sum is scaled by -learning_rate(t):
        p -= lr_t * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)
    (the decay is multiplied by the learning rate, as in optax / PyTorch / Megatron).

    Weight decay applies where `weight_decay_mask` is True. The default,
    `default_weight_decay_mask`, decays kernels and embeddings (ndim >= 2) but not norm
    scales and biases (named `scale` / `bias`). Pass a tree of bools (same structure as
    params, or a prefix) or a function params -> such a tree to override it; None decays
    every leaf.

    GPT reference: adamw(cosine_with_warmup(...), b1=0.9, b2=0.95, eps=1e-8,
    weight_decay=0.1, clip_norm=1.0). T5X GPU Pile: lr 1e-4, weight_decay 0.01, clip 1.0.
    """
    schedule = as_schedule(learning_rate, "adamw")
    tx = optax.chain(
        _global_clip(clip_norm),
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        _maybe(bool(weight_decay),
               lambda: optax.add_decayed_weights(weight_decay, mask=weight_decay_mask)),
        optax.scale_by_learning_rate(schedule),
    )
    return Optimizer(tx=tx, learning_rate_fn=schedule, name="adamw")
