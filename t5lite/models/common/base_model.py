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
    split_trainable(tree)      (trainable, frozen) parts of its parameters: with LoRA on,
                               the adapters and the frozen base; `join_trainable` rejoins
    inference_ids(...)         text no task processes -> the token ids of one inference
                               input or target (T5: EOS appended; decoder-only: as is)
    inference_batch(...)       token lists -> the batch predict_batch / score_batch read

The families: `t5lite.models.encoder_decoder.model.EncoderDecoderModel` and
`t5lite.models.decoder_only.model.DecoderOnlyModel`; `t5lite.models.model` names both
and `model_for_config(cfg)` builds the wrapper of a config's family.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite.errors import ConfigError, check_number
from t5lite.models import decoding, layouts, lora, moe
from t5lite.models.common import losses
from t5lite.models.common import te_backend

Batch = Mapping[str, jax.Array]
MODEL_EOS = "model"  # predict_batch's default eos_id: the model's own (config.eos_id)


class BaseModel:
    """Shared logic; subclasses set `module`, `FEATURES`, `dummy_batch` and the family
    answers listed in the module docstring."""

    FEATURES: Tuple[str, ...] = ()
    FEATURE_CONVERTER_KIND: str = ""
    # the token sums `loss_sums` returns beside the loss (summed over microbatches)
    METRIC_SUMS: Tuple[str, ...] = ("z_loss", "correct", "weight_sum", "nonpadding")
    NETWORK: type  # the family's flax network, built from the config
    module: nn.Module

    def __init__(self, config, z_loss: float = 1e-4, label_smoothing: float = 0.0,
                 loss_normalizing_factor: losses.NormalizingFactor = None):
        self.config = config
        if config.fp8 and config.fp8_backend == "te":
            te_backend.require("FP8_BACKEND='te'", "FP8_BACKEND='native'")
        if config.attention_impl == "te":
            te_backend.require("ATTENTION_IMPL='te'", "ATTENTION_IMPL='cudnn'")
        self.z_loss = check_number("Z_LOSS", z_loss, low=0)
        self.label_smoothing = check_number("LABEL_SMOOTHING", label_smoothing, low=0, below=1)
        factor = loss_normalizing_factor
        if factor is not None and factor != losses.NUM_REAL_TARGET_TOKENS and (
                isinstance(factor, (bool, str)) or not isinstance(factor, (int, float))
                or not 0 < factor < float("inf")):
            raise ConfigError(f"LOSS_NORMALIZING_FACTOR must be None (the token sum), a "
                              f"positive number or {losses.NUM_REAL_TARGET_TOKENS!r}, got "
                              f"{factor!r}")
        self.loss_normalizing_factor = factor
        self.module = self.NETWORK(config)

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
        if self._uses_te():
            return te_backend.tracing_context(axes)
        return contextlib.nullcontext()

    def init_boxed(self, rng: jax.Array, batch_size: int = 1,
                   lengths: Optional[Mapping[str, int]] = None):
        """Variables with their logical-axis metadata (flax `Partitioned` boxes)."""
        cfg = self._init_config()
        module = self.module if cfg is self.config else self.NETWORK(cfg)
        return module.init({"params": rng}, **self.dummy_batch(batch_size, lengths))

    def _init_config(self, **changes):
        """The config whose network draws this model's variables: the same parameters,
        with attention that traces on any machine (jax looks for cuDNN as it traces
        ATTENTION_IMPL='cudnn'; jax.nn's attention has the einsum's parameters)."""
        if self.config.attention_impl in ("dot_product", "cudnn"):
            changes.setdefault("attention_impl", "xla")
        return dataclasses.replace(self.config, **changes) if changes else self.config

    def init(self, rng: jax.Array, batch_size: int = 1,
             lengths: Optional[Mapping[str, int]] = None) -> Dict[str, Any]:
        """Freshly initialized variables (plain arrays), in this config's layout.

        The layers of a stack are drawn stacked, whatever SCAN_LAYERS says: the network
        with scanned layers (no remat) is initialized, one layer's initializers under
        `nn.scan`, and `layouts.convert_params` splits the stacks into `layers_{i}` when
        the config does not scan. So the initializer's program holds each kind of
        parameter's random draw once instead of once per layer (T5 large: 19 draws
        instead of 433), which is what its compile time grew with; and a fresh init is
        the same under SCAN_LAYERS True and False, and under every pipeline setting (a
        pipeline's repeats are cut from the one stack). Transformer Engine's modules keep
        their own per-layer init, and so does a stack of dense and mixture-of-experts
        layers that no block of MOE_EVERY layers repeats (settings.check refuses its
        scan)."""
        cfg = self.config
        try:
            stacked_cfg = self._init_config(scan_layers=True, remat_policy="none",
                                            pipeline_microbatches=None, pipeline_repeats=1)
        except ValueError:  # a stack no block of MOE_EVERY layers repeats
            stacked_cfg = None
        if self._uses_te() or stacked_cfg is None or (
                layouts.stacked(cfg) and layouts.repeats(cfg) == 1):
            return nn.meta.unbox(self.init_boxed(rng, batch_size, lengths))
        boxed = self.NETWORK(stacked_cfg).init({"params": rng},
                                               **self.dummy_batch(batch_size, lengths))
        return layouts.convert_params(nn.meta.unbox(boxed), stacked_cfg, cfg)

    def _uses_te(self) -> bool:
        return bool((self.config.fp8 and self.config.fp8_backend == "te")
                    or self.config.attention_impl == "te")

    def abstract_variables(self, batch_size: int = 1,
                           lengths: Optional[Mapping[str, int]] = None) -> Dict[str, Any]:
        """ShapeDtypeStruct tree of the variables; nothing is allocated. With the defaults
        (the variables' shapes do not depend on the batch), from the one trace per config
        that `logical_axes` reads too; each call gets its own tree."""
        if batch_size == 1 and lengths is None:
            return nn.meta.unbox(self._abstract_boxed())
        boxed = jax.eval_shape(lambda: self.init_boxed(jax.random.PRNGKey(0), batch_size,
                                                       lengths))
        return nn.meta.unbox(boxed)

    def logical_axes(self) -> Dict[str, Any]:
        """Tree of logical axis-name tuples (PartitionSpec of names), one per variable.
        Traced once per config (a run asks for it several times: its optimizer's plan,
        the step's shardings, the checkpoint's; eval and infer its abstract variables
        too); each call gets its own dicts."""
        return _copy_dicts(nn.get_partition_spec(self._abstract_boxed()))

    def _abstract_boxed(self):
        """`init_boxed`'s variables as ShapeDtypeStructs in their boxes (batch 1, the
        dummy lengths), traced once per config: the network's init traced once for the
        axis names and the abstract variables both."""
        cached = getattr(self, "_boxed", None)
        if cached is None or cached[0] is not self.config:
            boxed = jax.eval_shape(lambda: self.init_boxed(jax.random.PRNGKey(0)))
            cached = self._boxed = (self.config, boxed)
        return cached[1]

    # -- training -------------------------------------------------------------------
    def split_trainable(self, tree: Mapping[str, Any]) -> Tuple[Any, Dict[str, Any]]:
        """(trainable, frozen) parts of a `params` tree, or of a tree shaped like it
        (axis names, shardings): with LoRA on, the adapters and the frozen base
        (`lora.split_trainable`); off, the whole tree and {}."""
        return lora.split_trainable(tree, self.config)

    @staticmethod
    def join_trainable(trainable: Any, frozen: Mapping[str, Any]) -> Any:
        """The tree `split_trainable` cut, whole again."""
        return lora.join_trainable(trainable, frozen)

    # -- forward --------------------------------------------------------------------
    def logits(self, params, batch: Batch, rng: Optional[jax.Array] = None) -> jax.Array:
        """float32 [batch, length, vocab]; dropout is on iff `rng` is given."""
        rngs = {"dropout": rng} if rng is not None else {}
        return self.module.apply(params, **self._network_inputs(batch),
                                 deterministic=rng is None, rngs=rngs)

    def loss_sums(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        """Token sums, before normalization: (loss_sum, {name: sum} for the names in
        METRIC_SUMS). Sums add across microbatches, so accumulated gradients equal the
        whole batch's. A mixture-of-experts model adds its routers' statistics
        (`moe_metrics`), means over this batch's routing groups, not sums: `moe/objective`
        is the weighted router losses to add to the normalized loss."""
        rngs = {"dropout": rng} if rng is not None else {}
        batch, order = self.context_ordered(batch)
        logits, state = self.module.apply(params, **self._network_inputs(batch), **order,
                                          deterministic=rng is None, rngs=rngs,
                                          mutable=[moe.STATS_COLLECTION])
        targets = batch["decoder_target_tokens"]
        weights = self._weights(batch)
        tok_loss, tok_z = losses.cross_entropy_with_logits(logits, targets, self.z_loss,
                                                           self.label_smoothing)
        sums = {"z_loss": jnp.sum(tok_z * weights),
                "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
                "weight_sum": jnp.sum(weights),
                "nonpadding": jnp.sum(targets > 0).astype(jnp.float32),
                **self.moe_metrics(state.get(moe.STATS_COLLECTION, {}))}
        return jnp.sum(tok_loss * weights), sums

    def balances_context(self) -> bool:
        """Whether `context_ordered` reorders this model's tokens under a context axis."""
        return False

    def context_ordered(self, batch: Batch) -> Tuple[Batch, Dict[str, Any]]:
        """(batch, extra network arguments) as the loss reads them under context
        parallelism: unchanged here; a causal model may reorder its tokens so that
        each device of the context axis gets an equal share (`context_order`)."""
        return batch, {}

    def moe_metrics(self, stats) -> Dict[str, jax.Array]:
        """The routers' statistics sown by the MoE layers -> `moe.metrics`'s scalars."""
        return moe.metrics(stats, self.config)

    def microbatch_routing_change(self, batch_size: int, stack_lengths: Mapping[str, int],
                                  num_microbatches: int) -> Optional[str]:
        """What NUM_MICROBATCHES changes in a mixture of experts' routing, in one line
        (`moe.microbatch_routing_change`); None for a dense model or no change."""
        return moe.microbatch_routing_change(self.config, batch_size, stack_lengths,
                                             num_microbatches)

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
        return self.teacher_forced(params, batch)["log_likelihood"]

    def teacher_forced(self, params, batch: Batch) -> Dict[str, jax.Array]:
        """Per example [batch], over its target tokens with the loss weights:
        `log_likelihood` (the sum of log p(target), `score_batch`), `correct` (how many
        the argmax predicts) and `tokens` (the weights' sum). Cross entropy only: no
        z-loss, no label smoothing, no dropout."""
        logits = self.logits(params, batch)
        targets = batch["decoder_target_tokens"]
        weights = self._weights(batch)
        logp = jax.nn.log_softmax(logits, axis=-1)
        tok = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return {"log_likelihood": jnp.sum(tok * weights, axis=-1),
                "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights, axis=-1),
                "tokens": jnp.sum(weights, axis=-1)}

    # -- decoding -------------------------------------------------------------------
    def _decode_setup(self, decoder: decoding.DecoderSpec):
        """(decoder config, network for decoding, cache batch axis). Decoding never
        differentiates, so the network runs without remat (same parameters)."""
        spec = decoding.get_decoder(decoder)
        module = type(self.module)(dataclasses.replace(self.config, remat_policy="none"))
        cfg = self.config
        return spec, module, int(cfg.transpose_bs) + layouts.stack_depth(cfg)

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
        the model's embedding, ends its sequences with another EOS than the model, or
        has a token at id 0 (`zero_is_token`) where the model reads 0 as padding."""
        name = type(self.config).__name__
        if getattr(vocabulary, "zero_is_token", False) and \
                self.FEATURE_CONVERTER_KIND == "encoder_decoder":
            raise ConfigError(
                "the vocabulary (a tokenizer.json) has a token of text at id 0, which an "
                "encoder-decoder model takes for padding in its inputs; give T5 a "
                "SentencePiece model (VOCABULARY_PATH), or train a decoder-only model with "
                "this vocabulary")
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
        """Token ids of one inference input (or target) text of at most `length` that no
        task processes (`t5lite.infer` with RAW_PROMPTS, or a checkpoint whose training
        task is unknown; a known task's features process the text instead,
        `features.tokenize`): the family's own reading of plain text."""
        raise NotImplementedError

    def inference_batch(self, inputs: Sequence[Sequence[int]], lengths: Mapping[str, int],
                        targets: Optional[Sequence[Sequence[int]]] = None
                        ) -> Dict[str, np.ndarray]:
        """Token lists -> the numpy batch `predict_batch` (no targets) or `score_batch`
        (with targets) reads (`t5lite.models.common.features`)."""
        raise NotImplementedError


def _copy_dicts(tree):
    """`tree` with every Mapping node copied into a new dict (the leaves shared)."""
    if isinstance(tree, Mapping):
        return {k: _copy_dicts(v) for k, v in tree.items()}
    return tree
