"""Token-level cross entropy with z-loss and label smoothing, and its normalization.

Shapes: logits [batch, length, vocab] float32, targets / weights [batch, length].
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp

NUM_REAL_TARGET_TOKENS = "NUM_REAL_TARGET_TOKENS"
NormalizingFactor = Optional[Union[float, int, str]]


def cross_entropy_with_logits(logits: jax.Array, targets: jax.Array, z_loss: float = 0.0,
                              label_smoothing: float = 0.0) -> Tuple[jax.Array, jax.Array]:
    """Per-token loss and its z-loss part, both [batch, length].

    loss = -sum_v soft_v * log_softmax_v + z_loss * logsumexp^2 - H(soft), where soft is
    the one-hot target smoothed by `label_smoothing` (the entropy constant makes a perfect
    prediction of the smoothed target cost zero, as in T5X)."""
    vocab = logits.shape[-1]
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    entropy = -(confidence * math.log(confidence) +
                (vocab - 1) * low * math.log(low + 1e-20)) if label_smoothing else 0.0
    lse = jax.nn.logsumexp(logits, axis=-1)
    log_probs = logits - lse[..., None]
    target_logp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    if label_smoothing:
        nll = -(confidence - low) * target_logp - low * jnp.sum(log_probs, axis=-1)
    else:
        nll = -target_logp
    z = z_loss * jnp.square(lse)
    return nll + z - entropy, z


def normalizer(weights: jax.Array, loss_normalizing_factor: NormalizingFactor) -> jax.Array:
    """What the summed loss is divided by: 1 (None: token sum), a constant, or the number
    of real target tokens (sum of weights)."""
    if loss_normalizing_factor is None:
        return jnp.float32(1.0)
    if loss_normalizing_factor == NUM_REAL_TARGET_TOKENS:
        return jnp.maximum(jnp.sum(weights), 1e-8).astype(jnp.float32)
    if isinstance(loss_normalizing_factor, str):
        raise ValueError(f"unknown loss_normalizing_factor {loss_normalizing_factor!r}; use None, "
                         f"a number or {NUM_REAL_TARGET_TOKENS!r}")
    return jnp.float32(loss_normalizing_factor)


def weighted_loss(logits, targets, weights, z_loss=0.0, label_smoothing=0.0,
                  loss_normalizing_factor: NormalizingFactor = None):
    """Scalar loss, scalar z-loss part, both summed over tokens with `weights` and divided
    by `normalizer(weights, loss_normalizing_factor)`."""
    weights = weights.astype(jnp.float32)
    tok_loss, tok_z = cross_entropy_with_logits(logits, targets, z_loss, label_smoothing)
    norm = normalizer(weights, loss_normalizing_factor)
    return jnp.sum(tok_loss * weights) / norm, jnp.sum(tok_z * weights) / norm
