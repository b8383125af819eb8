"""Small models and reference computations shared by the model tests: the tiny models'
cut-down sizes as Gin bindings, a jitted full forward pass, and greedy decoding by full
forward passes (no KV cache: the independent reference of the cached decoders)."""
from __future__ import annotations

from typing import Callable, List, Sequence

import jax
import numpy as np

# The tiny models cut where their size is not under test: 512 vocabulary entries (the
# test SentencePiece vocabularies' 400 ids: 300 pieces and 100 sentinels) and one layer a
# stack, so each trace, compile, step and checkpoint is a fraction of the cost.
SMALL = {"T5Config": {"vocab_size": 512, "num_encoder_layers": 1, "num_decoder_layers": 1},
         "DecoderConfig": {"vocab_size": 512, "num_layers": 1}}


def small_bindings(config: str = "T5Config") -> List[str]:
    """SMALL[config] as Gin bindings (`T5Config.vocab_size = 512`, ...)."""
    return [f"{config}.{name} = {value}" for name, value in SMALL[config].items()]


def small_flags(config: str = "T5Config") -> List[str]:
    """SMALL[config] as command-line flags (`--gin.T5Config.vocab_size=512`, ...)."""
    return [f"--gin.{config}.{name}={value}" for name, value in SMALL[config].items()]


def full_forward(model, variables) -> Callable[[np.ndarray], jax.Array]:
    """A decoder-only model's logits [batch, width, vocab] of a token array [batch, width]
    read whole (no cache), jitted: one program a shape (op by op, each primitive compiled
    a program of its own)."""
    return jax.jit(lambda tokens: model.logits(variables, {"decoder_input_tokens": tokens,
                                                           "decoder_target_tokens": tokens}))


def greedy_without_cache(logits_fn, prompts: Sequence[Sequence[int]], new_tokens: int,
                         width: int, eos_id: int) -> List[List[int]]:
    """Greedy continuation of each prompt (token ids, BOS included) by full forward passes
    over its growing sequence: the argmax of its last position's logits appended until
    `eos_id` (kept) or `new_tokens` tokens. The prompts are the rows of one batch, each
    right-padded to `width` (a causal model's earlier positions see neither the padding
    nor the other rows). Returns each row's new tokens."""
    rows, outs = [list(p) for p in prompts], [[] for _ in prompts]
    for _ in range(new_tokens):
        live = [i for i, out in enumerate(outs) if not out or out[-1] != eos_id]
        if not live:
            break
        tokens = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            tokens[i, :len(row)] = row
        logits = np.asarray(logits_fn(tokens))
        for i in live:
            token = int(np.argmax(logits[i, len(rows[i]) - 1]))
            outs[i].append(token)
            rows[i].append(token)
    return outs
