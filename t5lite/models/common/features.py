"""Inference batches from token lists, in numpy: what each model family's `predict_batch`
and `score_batch` read. The model wrappers choose between them
(`model.inference_batch`); callers need not know the family.

    encoder-decoder   encoder_input_tokens [rows, inputs]; with targets also
                      decoder_target_tokens / decoder_input_tokens / decoder_loss_weights
                      [rows, targets] (seqio.EncDecFeatureConverter(pack=False)'s layout)
    decoder-only      decoder_input_tokens [rows, inputs + 1] = BOS + prompt and
                      decoder_prompt_lengths [rows]; with targets the prompt and target
                      joined [rows, inputs + targets], loss weights on the target only
                      (seqio.PrefixLMFeatureConverter's sequence, unpacked)
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np



def _pad(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
    out = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        r = list(r)[:length]
        out[i, :len(r)] = r
    return out


def encdec_features(inputs: Sequence[Sequence[int]], lengths: Mapping[str, int],
                    targets: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, np.ndarray]:
    """seqio.EncDecFeatureConverter(pack=False)'s output for token lists (already with
    EOS and trimmed): encoder_input_tokens, and with targets decoder_target_tokens,
    decoder_input_tokens (targets shifted right, BOS 0) and decoder_loss_weights."""
    batch = {"encoder_input_tokens": _pad(inputs, lengths["inputs"])}
    if targets is not None:
        tgt = _pad(targets, lengths["targets"])
        dec_in = np.zeros_like(tgt)
        dec_in[:, 1:] = tgt[:, :-1]
        batch.update(decoder_target_tokens=tgt, decoder_input_tokens=dec_in,
                     decoder_loss_weights=(tgt > 0).astype(np.float32))
    return batch


def decoder_only_features(prompts: Sequence[Sequence[int]], lengths: Mapping[str, int],
                          targets: Optional[Sequence[Sequence[int]]] = None,
                          bos_id: int = 0) -> Dict[str, np.ndarray]:
    """A decoder-only model's batch for token lists (a task's inputs and targets end in
    EOS, as do an INPUT_FILE's processed as the task's; raw prompts do not). Every
    sequence starts with `bos_id` (the model's), as the LM and prefix-LM feature
    converters' decoder_input_tokens do in training; a prompt longer than
    `lengths["inputs"]` tokens keeps its last tokens.

    Without targets (predict): decoder_input_tokens [rows, inputs + 1] = BOS + prompt and
    decoder_prompt_lengths [rows]. With targets (score): decoder_target_tokens
    [rows, inputs + targets] = prompt + target, decoder_input_tokens (shifted right, BOS
    first), decoder_loss_weights 1 on the target tokens only and decoder_causal_attention 1 on
    BOS and the prompt (seqio.PrefixLMFeatureConverter's, read by a bidirectional-prefix
    model)."""
    keep = lengths["inputs"]
    prompts = [list(p)[-keep:] if keep > 0 else [] for p in prompts]
    if targets is None:
        rows = [[bos_id] + p for p in prompts]
        return {"decoder_input_tokens": _pad(rows, lengths["inputs"] + 1),
                "decoder_prompt_lengths": np.array([len(r) for r in rows], np.int32)}
    width = lengths["inputs"] + lengths["targets"]
    tgt, weights = np.zeros((len(prompts), width), np.int32), np.zeros((len(prompts), width),
                                                                      np.float32)
    prompt = np.zeros((len(prompts), width), np.int32)
    for i, (p, t) in enumerate(zip(prompts, targets)):
        t = list(t)[: lengths["targets"]]
        tgt[i, :len(p) + len(t)] = p + t
        weights[i, len(p):len(p) + len(t)] = 1.0
        prompt[i, :len(p) + 1] = 1  # BOS and the prompt: a prefix LM's inputs
    dec_in = np.zeros_like(tgt)
    dec_in[:, 0] = bos_id
    dec_in[:, 1:] = tgt[:, :-1]
    return {"decoder_target_tokens": tgt, "decoder_input_tokens": dec_in,
            "decoder_loss_weights": weights, "decoder_causal_attention": prompt}


def tokenize(vocabulary, text: str, length: int, add_eos: bool = True) -> List[int]:
    """`text` as a SeqIO task's feature of `length` tokens: encoded (seqio's `tokenize`),
    then, for a feature with `add_eos` (every t5lite task's), trimmed to `length - 1` and
    the vocabulary's EOS appended (seqio's `append_eos_after_trim`); without, trimmed to
    `length` (`Task.get_dataset`'s trim)."""
    ids = [int(t) for t in vocabulary.encode(text)]
    if not add_eos:
        return ids[:length]
    return ids[: length - 1] + [int(vocabulary.eos_id)]


def decode_tokens(vocabulary, tokens: Iterable[int]) -> str:
    """Token ids -> text, stopping at the first EOS (seqio's Vocabulary.decode)."""
    return vocabulary.decode([int(t) for t in tokens])
