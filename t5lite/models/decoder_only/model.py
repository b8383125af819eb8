"""The GPT / LLaMA-style decoder-only wrapper (`DecoderConfig`): its batches, FLOPs,
inference batches (BOS + prompt) and KV-cache continuation of prompts (contract:
`t5lite.models.common.base_model`).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import decoding, flops
from t5lite.models.common import context_order, features
from t5lite.models.common import model_kinds
from t5lite.models.common.base_model import MODEL_EOS, Batch, BaseModel
from t5lite.models.decoder_only.network import DecoderOnly


class DecoderOnlyModel(BaseModel):
    """GPT / LLaMA-style decoder-only language model (`DecoderConfig`)."""

    FEATURES = ("decoder_input_tokens", "decoder_target_tokens", "decoder_segment_ids",
                "decoder_positions", "decoder_causal_attention")
    FEATURE_CONVERTER_KIND = model_kinds.DECODER_ONLY
    NETWORK = DecoderOnly

    def balances_context(self) -> bool:
        """A dense model whose attention masks by positions: not a mixture of experts,
        not relative biases (`context_ordered`)."""
        c = self.config
        return not c.num_experts and c.position_embedding != "relative"

    def context_ordered(self, batch: Batch):
        """Under context parallelism (a context axis over 1 in the mesh being traced
        under), the loss's tokens in `context_order.balanced_order` (each device a chunk
        from the front and one from the back), masked by their positions. Not for a
        mixture of experts (reordered tokens would fill its routing groups differently
        from one device's) nor relative position biases (made by places): they keep
        the natural order, each device a contiguous slice."""
        shards = context_order.context_size()
        if shards == 1 or not self.balances_context():
            return batch, {}
        length = batch["decoder_target_tokens"].shape[1]
        order = context_order.balanced_order(length, shards)
        return context_order.reorder(batch, order), {"causal_by_positions": True}

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
        # a raw prompt: plain ids, no EOS (a pretrained LM continues text as it is); a
        # prompt keeps its last tokens, a target is scored as the continuation
        # (inference_batch trims both). A task's inputs end in EOS instead
        # (features.tokenize with the task's add_eos).
        return [int(t) for t in vocabulary.encode(text)]

    def inference_batch(self, inputs, lengths, targets=None):
        return features.decoder_only_features(inputs, lengths, targets, bos_id=self.bos_id)
