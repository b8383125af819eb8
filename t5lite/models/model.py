"""Model wrappers: a network plus its batch features, loss and scoring.

`params` everywhere below means the variables dict returned by `init`: `{"params": ...}`,
plus the FP8 collection (`precision.FP8_COLLECTION`) when FP8 is on. Batches use T5X
feature names, each [batch, length] int32 (weights float):

- encoder-decoder: encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
  decoder_loss_weights, optional encoder/decoder_segment_ids and _positions;
- decoder-only: decoder_input_tokens, decoder_target_tokens, decoder_loss_weights,
  optional decoder_segment_ids and decoder_positions.

`predict_batch` decodes with a KV cache (`t5lite.models.decoding`; docs/decoding.md):
encoder-decoder from encoder_input_tokens; decoder-only continues the prompts in
decoder_input_tokens (left-aligned, 0-padded on the right; `decoder_prompt_lengths`
[batch] when a prompt may end in token 0).

A model answers every question that differs between the families, so that no caller
branches on its type (T5X's FEATURE_CONVERTER_CLS idea):

    FEATURE_CONVERTER_KIND     "encoder_decoder" / "decoder_only": the feature converter
                               (and synthetic batches) its training data need
    feature_lengths(...)       the feature lengths of its training batches
    train_flops_per_example    model FLOPs of one training example (MFU convention)
    flops_report(...)          the FLOP figures `python -m t5lite.info` shows
    check_decode_lengths(...)  whether inference lengths fit it (ConfigError if not)
    check_train_lengths(...)   whether its training batches' widths fit it (the same)
    check_vocabulary(vocab)    whether a vocabulary's ids fit its embedding and its EOS is
                               the model's (the same)
    bos_id, eos_id             the tokens its sequences start and end with (its config's)
    check_features(names)      whether its network reads batches with these features
    tracing_context(axes)      what to enter while tracing it (Transformer Engine's mesh)
    inference_ids(...)         text -> the token ids of one inference input or target
    inference_batch(...)       token lists -> the batch predict_batch / score_batch read

`model_for_config(cfg)` builds the wrapper of a config's family.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.errors import ConfigError
from t5lite.models import decoding, features, flops, losses, te_backend
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.decoder import DecoderOnly
from t5lite.models.t5 import T5

Batch = Mapping[str, jax.Array]
MODEL_EOS = "model"  # predict_batch's default eos_id: the model's own (config.eos_id)


class BaseModel:
    """Shared logic; subclasses set `module`, `FEATURES`, `dummy_batch` and the family
    answers listed in the module docstring."""

    FEATURES: Tuple[str, ...] = ()
    FEATURE_CONVERTER_KIND: str = ""
    module: nn.Module

    def __init__(self, config, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: losses.NormalizingFactor = None):
        self.config = config
        if config.fp8 and config.fp8_backend == "te":
            te_backend.require("FP8_BACKEND='te'", "FP8_BACKEND='native'")
        if config.attention_impl == "te":
            te_backend.require("ATTENTION_IMPL='te'", "ATTENTION_IMPL='cudnn'")
        self.z_loss = z_loss
        self.label_smoothing = label_smoothing
        self.loss_normalizing_factor = loss_normalizing_factor

    # -- construction ---------------------------------------------------------------
    def dummy_batch(self, batch_size: int = 1,
                    lengths: Optional[Mapping[str, int]] = None) -> Dict[str, jax.Array]:
        raise NotImplementedError

    def _network_inputs(self, batch: Batch) -> Dict[str, jax.Array]:
        self.check_features(batch)
        return {k: batch[k] for k in self.FEATURES if k in batch}

    def check_features(self, names) -> None:
        """ConfigError (one line) when the network cannot read batches with these feature
        names: Transformer Engine's fused attention takes no packed segments."""
        if self.config.attention_impl == "te" and any(n.endswith("_segment_ids") for n in names):
            raise ConfigError(
                "ATTENTION_IMPL='te' cannot keep packed sequences apart (Transformer Engine's "
                "fused attention takes padding masks here, not segment ids): set PACK=False, "
                "or keep packing with ATTENTION_IMPL='cudnn'")

    def tracing_context(self, axes: Mapping[str, str]):
        """A context to trace this model's code in, given the mesh axis names {"data",
        "fsdp", "tensor"} -> name: Transformer Engine's mesh resource when it is used."""
        if (self.config.fp8 and self.config.fp8_backend == "te") or \
                self.config.attention_impl == "te":
            return te_backend.tracing_context(axes)
        return contextlib.nullcontext()

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

    # -- decoding -------------------------------------------------------------------
    def _decode_setup(self, decoder: decoding.DecoderSpec):
        """(decoder config, network for decoding, cache batch axis). Decoding never
        differentiates, so the network runs without remat (same parameters)."""
        spec = decoding.get_decoder(decoder)
        module = type(self.module)(dataclasses.replace(self.config, remat_policy="none"))
        cfg = self.config
        return spec, module, int(cfg.transpose_bs) + int(cfg.scan_layers)

    @staticmethod
    def _finish(tokens, scores, return_scores: bool):
        return (tokens, scores) if return_scores else tokens

    @property
    def bos_id(self) -> int:
        """The token a decoder input starts with: the config's `bos_id` (decoder-only),
        T5's decoder start 0 (encoder-decoder)."""
        return int(getattr(self.config, "bos_id", 0))

    @property
    def eos_id(self) -> int:
        """The token that ends a target; decoding stops there (the config's `eos_id`)."""
        return int(self.config.eos_id)

    def _eos(self, eos_id):
        return self.eos_id if eos_id == MODEL_EOS else eos_id

    # -- family answers (overridden by each family) -----------------------------------
    def feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> Dict[str, int]:
        """TASK_FEATURE_LENGTHS -> the lengths of this model's training batches."""
        raise NotImplementedError

    def train_flops_per_example(self, task_feature_lengths: Mapping[str, int]) -> float:
        """Training (fwd + bwd) model FLOPs of one example of TASK_FEATURE_LENGTHS."""
        raise NotImplementedError

    def flops_report(self, *, inputs_length: int = 512, targets_length: int = 128,
                     seq_length: int = 2048) -> Dict[str, Any]:
        """The lengths this family uses (also as `task_feature_lengths`) and its training
        FLOPs at them."""
        raise NotImplementedError

    def check_decode_lengths(self, lengths: Mapping[str, int]) -> None:
        """ConfigError when inference lengths {"inputs", "targets"} do not fit the model."""

    def check_vocabulary(self, vocabulary) -> None:
        """ConfigError when `vocabulary` (pieces + extra ids: `.vocab_size`) has ids past
        the model's embedding, or ends its sequences with another EOS than the model."""
        name = type(self.config).__name__
        if vocabulary.eos_id != self.eos_id:
            raise ConfigError(
                f"the vocabulary ends sequences with EOS {vocabulary.eos_id} but the model "
                f"with {self.eos_id} (its eos_id); use the vocabulary the model was trained "
                f"with, or set the model's special ids to the vocabulary's (e.g. "
                f"--gin.{name}.eos_id={vocabulary.eos_id}"
                + (f" --gin.{name}.bos_id={max(vocabulary.bos_id or 0, 0)}"
                   if hasattr(self.config, "bos_id") else "") + ")")
        if vocabulary.vocab_size > self.config.vocab_size:
            raise ConfigError(
                f"the vocabulary has {vocabulary.vocab_size} ids (pieces + extra ids) but "
                f"the model's embedding only {self.config.vocab_size}; use a smaller "
                f"vocabulary (VOCABULARY_PATH) or set the model's vocab_size (e.g. "
                f"--gin.{name}.vocab_size=...)")

    def check_train_lengths(self, widths: Mapping[str, int],
                            task_feature_lengths: Mapping[str, int]) -> None:
        """ConfigError when its training batches (`widths`, made from TASK_FEATURE_LENGTHS)
        do not fit the model."""

    def inference_ids(self, vocabulary, text: str, length: int) -> List[int]:
        """Token ids of one inference input (or target) text of at most `length`."""
        raise NotImplementedError

    def inference_batch(self, inputs: Sequence[Sequence[int]], lengths: Mapping[str, int],
                        targets: Optional[Sequence[Sequence[int]]] = None
                        ) -> Dict[str, np.ndarray]:
        """Token lists -> the numpy batch `predict_batch` (no targets) or `score_batch`
        (with targets) reads (`t5lite.models.features`)."""
        raise NotImplementedError


class EncoderDecoderModel(BaseModel):
    """T5-style encoder-decoder (`T5Config`)."""

    FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                "encoder_segment_ids", "decoder_segment_ids", "encoder_positions",
                "decoder_positions")
    FEATURE_CONVERTER_KIND = "encoder_decoder"

    def __init__(self, config: T5Config, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: losses.NormalizingFactor = None):
        super().__init__(config, z_loss, label_smoothing, loss_normalizing_factor)
        self.module = T5(config)

    def predict_batch(self, params, batch: Batch, *,
                      decoder: decoding.DecoderSpec = "greedy",
                      max_decode_length: Optional[int] = None,
                      rng: Optional[jax.Array] = None, return_scores: bool = False,
                      eos_id: Optional[int] | str = MODEL_EOS):
        """Decode targets for `batch["encoder_input_tokens"]` [batch, enc_length].

        decoder: `decoding.GreedyDecoder()`, `Sampling(temperature, top_k, top_p)`,
        `BeamSearch(num_beams, alpha)` or a name ("greedy", "sample", "beam_search").
        max_decode_length: default the width of `decoder_input_tokens`. Decoding starts
        from BOS 0 and stops at eos_id (default the config's; None: never early).
        Returns tokens [batch, max_decode_length] (EOS included, 0 after);
        with return_scores also scores [batch] (summed log-probs; for beam search
        length-penalized). Jittable (decoder and lengths static)."""
        spec, module, cache_axis = self._decode_setup(decoder)
        enc_tokens = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
        if max_decode_length is None:
            if "decoder_input_tokens" not in batch:
                raise ValueError("predict_batch needs max_decode_length or a batch with "
                                 "decoder_input_tokens (whose width sets it)")
            max_decode_length = batch["decoder_input_tokens"].shape[1]
        length, batch_size, beams = max_decode_length, enc_tokens.shape[0], spec.num_beams
        encoded = module.apply(params, enc_tokens, method=T5.encode)
        if beams > 1:  # encoded is in the internal layout: batch is axis 1 when transposed
            encoded = decoding.repeat_beams(encoded, beams, int(self.config.transpose_bs))
            enc_tokens = decoding.repeat_beams(enc_tokens, beams)

        def run(tokens, cache, positions=None):
            variables = dict(params) if cache is None else {**params, "cache": cache}
            logits, new = module.apply(variables, encoded, enc_tokens, tokens, decode=True,
                                       decoder_positions=positions,
                                       max_decode_length=length, mutable=["cache"],
                                       method=T5.decode)
            return logits, new["cache"]

        # The cache-creating call: self-attention caches start as zeros; cross-attention
        # caches hold the projected encoder keys/values (the rest of the pass is unused).
        _, cache = run(jnp.zeros((batch_size * beams, length), jnp.int32), None)

        def tokens_to_logits(tokens, cache, index):
            logits, cache = run(tokens, cache, index[:, None])
            return logits[:, 0], cache

        tokens, scores = decoding.decode(
            spec, tokens_to_logits, jnp.zeros((batch_size,), jnp.int32), 0, cache, length,
            rng=rng, eos_id=self._eos(eos_id), cache_batch_axis=cache_axis,
            gather_cache=functools.partial(_gather_self_attention_cache, axis=cache_axis))
        return self._finish(tokens, scores, return_scores)

    def dummy_batch(self, batch_size=1, lengths=None):
        lengths = dict(lengths or {})
        enc, dec = lengths.get("inputs", 8), lengths.get("targets", 8)
        return {"encoder_input_tokens": jnp.ones((batch_size, enc), jnp.int32),
                "decoder_input_tokens": jnp.ones((batch_size, dec), jnp.int32),
                "decoder_target_tokens": jnp.ones((batch_size, dec), jnp.int32)}

    # -- family answers -------------------------------------------------------------
    def feature_lengths(self, task_feature_lengths):
        return {"inputs": int(task_feature_lengths["inputs"]),
                "targets": int(task_feature_lengths["targets"])}

    def train_flops_per_example(self, task_feature_lengths):
        lengths = self.feature_lengths(task_feature_lengths)
        return flops.encoder_decoder_train_flops_per_example(
            self.config, lengths["inputs"], lengths["targets"])

    def flops_report(self, *, inputs_length=512, targets_length=128, seq_length=2048):
        return {"inputs_length": inputs_length, "targets_length": targets_length,
                "task_feature_lengths": {"inputs": inputs_length, "targets": targets_length},
                "train_flops_per_example": flops.encoder_decoder_train_flops_per_example(
                    self.config, inputs_length, targets_length)}

    def inference_ids(self, vocabulary, text, length):
        return features.tokenize(vocabulary, text, length)  # trimmed, EOS appended

    def inference_batch(self, inputs, lengths, targets=None):
        return features.encdec_features(inputs, lengths, targets)


class DecoderOnlyModel(BaseModel):
    """GPT / LLaMA-style decoder-only language model (`DecoderConfig`)."""

    FEATURES = ("decoder_input_tokens", "decoder_target_tokens", "decoder_segment_ids",
                "decoder_positions", "decoder_causal_attention")
    FEATURE_CONVERTER_KIND = "decoder_only"

    def __init__(self, config: DecoderConfig, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: losses.NormalizingFactor = None):
        super().__init__(config, z_loss, label_smoothing, loss_normalizing_factor)
        self.module = DecoderOnly(config)

    def predict_batch(self, params, batch: Batch, *,
                      decoder: decoding.DecoderSpec = "greedy",
                      max_decode_length: Optional[int] = None,
                      rng: Optional[jax.Array] = None, return_scores: bool = False,
                      eos_id: Optional[int] | str = MODEL_EOS):
        """Continue the prompts in `batch["decoder_input_tokens"]` [batch, P]: each row
        left-aligned and padded with 0 on the right. Prompt lengths come from
        `batch["decoder_prompt_lengths"]` [batch] if present, else from the last nonzero
        token of each row (so a prompt may contain 0 but not end with it); a prompt needs
        at least one token (e.g. BOS).

        max_decode_length: new tokens per row (default P). The KV cache holds
        P + max_decode_length positions, of which the network reads at most
        P + max_decode_length - 1 (the last new token is never fed back; for learned
        positions those must fit `max_length`).
        Returns the continuations [batch, max_decode_length] (EOS included, 0 after;
        eos_id: default the config's, None never stops early); with return_scores also scores [batch]
        (summed log-probs of the new tokens; for beam search length-penalized)."""
        spec, module, cache_axis = self._decode_setup(decoder)
        prompts = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)
        batch_size, width = prompts.shape
        if "decoder_prompt_lengths" in batch:
            lengths = jnp.asarray(batch["decoder_prompt_lengths"], jnp.int32)
        else:
            nonzero = prompts != 0
            last = width - jnp.argmax(nonzero[:, ::-1], axis=1)
            lengths = jnp.where(jnp.any(nonzero, axis=1), last, 0).astype(jnp.int32)
        lengths = jnp.clip(lengths, 1, width)
        new_tokens = width if max_decode_length is None else max_decode_length
        total = width + new_tokens
        cfg = self.config
        if cfg.position_embedding == "learned" and total - 1 > cfg.max_length:
            raise ValueError(
                f"prompt width {width} + max_decode_length {new_tokens} - 1 = {total - 1} "
                f"positions exceed the learned position table (max_length="
                f"{cfg.max_length}); shorten either")
        beams = spec.num_beams
        rows = decoding.repeat_beams(prompts, beams) if beams > 1 else prompts

        def run(tokens, cache, positions=None, prompt=None):
            variables = dict(params) if cache is None else {**params, "cache": cache}
            logits, new = module.apply(variables, tokens, decoder_positions=positions,
                                       decoder_causal_attention=prompt, decode=True,
                                       max_decode_length=total, mutable=["cache"])
            return logits, new["cache"]

        _, cache = run(jnp.zeros((rows.shape[0], total), jnp.int32), None)  # zero cache
        # Prefill: the whole padded prompt block at positions 0..P-1. Slots past a row's
        # prompt hold padding; they are masked (causal) until decoding overwrites them.
        # With a bidirectional prefix the prompt's own positions see each other both ways,
        # as in its prefix-LM training sequence.
        block = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), rows.shape)
        row_lengths = decoding.repeat_beams(lengths, beams) if beams > 1 else lengths
        _, cache = run(rows, cache, block, (block < row_lengths[:, None]).astype(jnp.int32))

        def tokens_to_logits(tokens, cache, index):
            logits, cache = run(tokens, cache, index[:, None])
            return logits[:, 0], cache

        # Decoding starts by re-feeding each prompt's last token at its position: its
        # logits give the first new token.
        last_tokens = jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0]
        tokens, scores = decoding.decode(spec, tokens_to_logits, last_tokens, lengths - 1,
                                         cache, new_tokens, rng=rng,
                                         eos_id=self._eos(eos_id),
                                         cache_batch_axis=cache_axis)
        return self._finish(tokens, scores, return_scores)

    def dummy_batch(self, batch_size=1, lengths=None):
        length = dict(lengths or {}).get("targets", 8)
        return {"decoder_input_tokens": jnp.ones((batch_size, length), jnp.int32),
                "decoder_target_tokens": jnp.ones((batch_size, length), jnp.int32)}

    # -- family answers -------------------------------------------------------------
    def feature_lengths(self, task_feature_lengths):
        return {"targets": int(task_feature_lengths["targets"])}

    def train_flops_per_example(self, task_feature_lengths):
        return flops.decoder_only_train_flops_per_example(
            self.config, self.feature_lengths(task_feature_lengths)["targets"])

    def flops_report(self, *, inputs_length=512, targets_length=128, seq_length=2048):
        return {"seq_length": seq_length, "task_feature_lengths": {"targets": seq_length},
                "train_flops_per_token": flops.decoder_only_train_flops_per_token(
                    self.config, seq_length),
                "train_flops_per_example": flops.decoder_only_train_flops_per_example(
                    self.config, seq_length)}

    def check_decode_lengths(self, lengths):
        # BOS + inputs prompt tokens, then targets new tokens: the network reads
        # inputs + targets positions (the last new token is not fed back), as many as
        # its prefix-LM training sequence
        cfg = self.config
        total = int(lengths["inputs"]) + int(lengths["targets"])
        if cfg.position_embedding == "learned" and total > cfg.max_length:
            raise ConfigError(
                f"TASK_FEATURE_LENGTHS: prompt {lengths['inputs']} + new tokens "
                f"{lengths['targets']} = {total} positions, more than the model's "
                f"max_length {cfg.max_length}; shorten them")

    def check_train_lengths(self, widths, task_feature_lengths):
        cfg = self.config
        if cfg.position_embedding == "learned" and widths["targets"] > cfg.max_length:
            given = {k: v for k, v in task_feature_lengths.items() if v}
            raise ConfigError(
                f"TASK_FEATURE_LENGTHS {given} makes training sequences of "
                f"{widths['targets']} tokens, more than the model's max_length "
                f"{cfg.max_length} (learned positions); shorten them")

    def inference_ids(self, vocabulary, text, length):
        # plain ids: a prompt keeps its last tokens, a target is scored as the
        # continuation (inference_batch trims both)
        return [int(t) for t in vocabulary.encode(text)]

    def inference_batch(self, inputs, lengths, targets=None):
        return features.decoder_only_features(inputs, lengths, targets, bos_id=self.bos_id)


MODEL_CLASSES = {T5Config: EncoderDecoderModel, DecoderConfig: DecoderOnlyModel}


def model_for_config(config, **kwargs) -> BaseModel:
    """The model wrapper of `config`'s family (kwargs: z_loss, label_smoothing, ...)."""
    if type(config) not in MODEL_CLASSES:
        raise TypeError(f"no model family for config type {type(config).__name__}; "
                        f"expected one of {[c.__name__ for c in MODEL_CLASSES]}")
    return MODEL_CLASSES[type(config)](config, **kwargs)


def _gather_self_attention_cache(cache, rows, axis: int):
    """Beam reordering for an encoder-decoder cache: only self-attention entries move;
    cross-attention keys/values are the same for every beam of an example."""
    def take(path, x):
        names = [getattr(p, "key", "") for p in path]
        if "encoder_decoder_attention" in names:
            return x
        return jnp.take(x, rows, axis=axis)

    return jax.tree_util.tree_map_with_path(take, cache)
