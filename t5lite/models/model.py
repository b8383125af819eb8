"""Model wrappers: a network plus its batch features, loss and scoring.

`params` everywhere below means the variables dict returned by `init`: `{"params": ...}`,
plus the FP8 collection (`precision.FP8_COLLECTION`) when FP8 is on. Batches use T5X
feature names, each [batch, length] int32 (weights float):

- encoder-decoder: encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
  decoder_loss_weights, optional encoder/decoder_segment_ids and _positions;
- decoder-only: decoder_input_tokens, decoder_target_tokens, decoder_loss_weights,
  optional decoder_segment_ids and decoder_positions.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite import losses
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.decoder import DecoderOnly
from t5lite.models.t5 import T5

Batch = Mapping[str, jax.Array]


class BaseModel:
    """Shared logic; subclasses set `module`, `FEATURES` and `dummy_batch`."""

    FEATURES: Tuple[str, ...] = ()
    module: nn.Module

    def __init__(self, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: losses.NormalizingFactor = None):
        self.z_loss = z_loss
        self.label_smoothing = label_smoothing
        self.loss_normalizing_factor = loss_normalizing_factor

    # -- construction ---------------------------------------------------------------
    def dummy_batch(self, batch_size: int = 1,
                    lengths: Optional[Mapping[str, int]] = None) -> Dict[str, jax.Array]:
        raise NotImplementedError

    def _network_inputs(self, batch: Batch) -> Dict[str, jax.Array]:
        return {k: batch[k] for k in self.FEATURES if k in batch}

    def init_boxed(self, rng: jax.Array, batch_size: int = 1,
                   lengths: Optional[Mapping[str, int]] = None):
        """Variables with their logical-axis metadata (flax `Partitioned` boxes)."""
        return self.module.init({"params": rng}, **self.dummy_batch(batch_size, lengths))

    def init(self, rng: jax.Array, batch_size: int = 1,
             lengths: Optional[Mapping[str, int]] = None) -> Dict[str, Any]:
        """Freshly initialized variables (plain arrays)."""
        return nn.meta.unbox(self.init_boxed(rng, batch_size, lengths))

    def abstract_variables(self, batch_size: int = 1,
                           lengths: Optional[Mapping[str, int]] = None) -> Dict[str, Any]:
        """ShapeDtypeStruct tree of the variables; nothing is allocated."""
        boxed = jax.eval_shape(lambda: self.init_boxed(jax.random.PRNGKey(0), batch_size,
                                                       lengths))
        return nn.meta.unbox(boxed)

    def logical_axes(self) -> Dict[str, Any]:
        """Tree of logical axis-name tuples (PartitionSpec of names), one per variable."""
        boxed = jax.eval_shape(lambda: self.init_boxed(jax.random.PRNGKey(0)))
        return nn.get_partition_spec(boxed)

    # -- forward --------------------------------------------------------------------
    def logits(self, params, batch: Batch, rng: Optional[jax.Array] = None) -> jax.Array:
        """float32 [batch, length, vocab]; dropout is on iff `rng` is given."""
        rngs = {"dropout": rng} if rng is not None else {}
        return self.module.apply(params, **self._network_inputs(batch),
                                 deterministic=rng is None, rngs=rngs)

    def loss_sums(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        """Token sums, before normalization: (loss_sum, {"z_loss", "correct",
        "weight_sum", "nonpadding"}). Sums add across microbatches, so accumulated
        gradients equal the whole batch's."""
        logits = self.logits(params, batch, rng)
        targets = batch["decoder_target_tokens"]
        weights = self._weights(batch)
        tok_loss, tok_z = losses.cross_entropy_with_logits(logits, targets, self.z_loss,
                                                           self.label_smoothing)
        sums = {"z_loss": jnp.sum(tok_z * weights),
                "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
                "weight_sum": jnp.sum(weights),
                "nonpadding": jnp.sum(targets > 0).astype(jnp.float32)}
        return jnp.sum(tok_loss * weights), sums

    def normalizer(self, batch: Batch) -> jax.Array:
        """What the loss sums of `batch` are divided by (LOSS_NORMALIZING_FACTOR)."""
        return losses.normalizer(self._weights(batch), self.loss_normalizing_factor)

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        """Scalar loss (cross entropy + z-loss, normalized) and metrics:
        (loss, {"loss", "z_loss", "weight_sum", "correct", "nonpadding"})."""
        loss_sum, sums = self.loss_sums(params, batch, rng)
        norm = self.normalizer(batch)
        loss = loss_sum / norm
        return loss, {**sums, "loss": loss, "z_loss": sums["z_loss"] / norm}

    @staticmethod
    def _weights(batch: Batch) -> jax.Array:
        weights = batch.get("decoder_loss_weights")
        if weights is None:
            weights = batch["decoder_target_tokens"] > 0
        return jnp.asarray(weights, jnp.float32)

    def score_batch(self, params, batch: Batch) -> jax.Array:
        """Sum over target tokens of log p(target) with the loss weights: [batch]."""
        logits = self.logits(params, batch)
        targets = batch["decoder_target_tokens"]
        weights = self._weights(batch)
        logp = jax.nn.log_softmax(logits, axis=-1)
        tok = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(tok * weights, axis=-1)


class EncoderDecoderModel(BaseModel):
    """T5-style encoder-decoder (`T5Config`)."""

    FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                "encoder_segment_ids", "decoder_segment_ids", "encoder_positions",
                "decoder_positions")

    def __init__(self, config: T5Config, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: losses.NormalizingFactor = None):
        super().__init__(z_loss, label_smoothing, loss_normalizing_factor)
        self.config = config
        self.module = T5(config)

    def dummy_batch(self, batch_size=1, lengths=None):
        lengths = dict(lengths or {})
        enc, dec = lengths.get("inputs", 8), lengths.get("targets", 8)
        return {"encoder_input_tokens": jnp.ones((batch_size, enc), jnp.int32),
                "decoder_input_tokens": jnp.ones((batch_size, dec), jnp.int32),
                "decoder_target_tokens": jnp.ones((batch_size, dec), jnp.int32)}


class DecoderOnlyModel(BaseModel):
    """GPT / LLaMA-style decoder-only language model (`DecoderConfig`)."""

    FEATURES = ("decoder_input_tokens", "decoder_target_tokens", "decoder_segment_ids",
                "decoder_positions")

    def __init__(self, config: DecoderConfig, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: losses.NormalizingFactor = None):
        super().__init__(z_loss, label_smoothing, loss_normalizing_factor)
        self.config = config
        self.module = DecoderOnly(config)

    def dummy_batch(self, batch_size=1, lengths=None):
        length = dict(lengths or {}).get("targets", 8)
        return {"decoder_input_tokens": jnp.ones((batch_size, length), jnp.int32),
                "decoder_target_tokens": jnp.ones((batch_size, length), jnp.int32)}
