"""The T5-style encoder-decoder wrapper (`T5Config`): its batches, FLOPs, inference
batches and KV-cache decoding from the encoded inputs (contract: `t5lite.models.common.base_model`).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from t5lite.models import decoding, flops
from t5lite.models.common import features
from t5lite.models.common import model_kinds
from t5lite.models.common.base_model import MODEL_EOS, Batch, BaseModel
from t5lite.models.encoder_decoder.network import T5


class EncoderDecoderModel(BaseModel):
    """T5-style encoder-decoder (`T5Config`)."""

    FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                "encoder_segment_ids", "decoder_segment_ids", "encoder_positions",
                "decoder_positions")
    FEATURE_CONVERTER_KIND = model_kinds.ENCODER_DECODER
    NETWORK = T5

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
        # trimmed, EOS appended: what every T5 task does to its inputs and targets
        return features.tokenize(vocabulary, text, length)

    def inference_batch(self, inputs, lengths, targets=None):
        return features.encdec_features(inputs, lengths, targets)


def _gather_self_attention_cache(cache, rows, axis: int):
    """Beam reordering for an encoder-decoder cache: only self-attention entries move;
    cross-attention keys/values are the same for every beam of an example."""
    def take(path, x):
        names = [getattr(p, "key", "") for p in path]
        if "encoder_decoder_attention" in names:
            return x
        return jnp.take(x, rows, axis=axis)

    return jax.tree_util.tree_map_with_path(take, cache)
