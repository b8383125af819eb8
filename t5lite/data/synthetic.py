"""Synthetic batches for benchmarks and tests: numpy only, no TensorFlow or SeqIO.

Every row of every batch is a pure function of (seed, step, row): row r of step s comes
from its own generator, `PCG64(SeedSequence([seed, s, r]))`. So the global batch of a
step is the same on every run, mesh and process count, and a host computes only its own
rows (cost scales with the host's slice, not the global batch).

Features carry the T5X feature-converter names:

    encoder_decoder:  encoder_input_tokens   [B, inputs]   int32
                      decoder_target_tokens  [B, targets]  int32
                      decoder_input_tokens   [B, targets]  int32  targets shifted right, 0 first
                      decoder_loss_weights   [B, targets]  float32  1.0 where target != 0
    decoder_only:     decoder_input_tokens   [B, targets]  int32
                      decoder_target_tokens  [B, targets]  int32  inputs shifted left by one
                      decoder_loss_weights   [B, targets]  float32  all 1.0 (no padding)

Encoder-decoder rows hold tokens in [2, vocab) and an EOS (1) at a random position, so
that the sequence with its EOS fills at least half the feature length; 0 pads the rest.
Decoder-only rows are one random sequence of length+1 tokens in [2, vocab), with no
padding. The streams are stable for a given numpy version.

    task = SyntheticTask({"inputs": 512, "targets": 128}, vocab_size=32128,
                         kind="encoder_decoder", seed=0)
    iterator = SyntheticIterator(task, partitioner.data_layout(256))
    batch = next(iterator)                  # this process's rows of step 0 (its data shard)
    state = iterator.get_state()            # {"step": 1}: the next unseen batch
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

import numpy as np

from t5lite.data.sharding.layout import DataLayout
from t5lite.errors import check_positive_int
from t5lite.models.common.model_kinds import ENCODER_DECODER, MODEL_KINDS

KINDS = MODEL_KINDS
PAD_ID = 0
EOS_ID = 1
FIRST_TOKEN_ID = 2  # tokens are drawn from [FIRST_TOKEN_ID, vocab_size)


class SyntheticTask:
    """Deterministic random batches with T5X feature names (see the module docstring).

    feature_lengths: encoder_decoder: {"inputs": n, "targets": m};
        decoder_only: {"targets": n} ("inputs" may be present only as None or 0).
    """

    def __init__(self, feature_lengths: Mapping[str, Optional[int]], vocab_size: int,
                 kind: str = ENCODER_DECODER, seed: int = 0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.vocab_size = check_positive_int("vocab_size", vocab_size, error=ValueError)
        if self.vocab_size <= FIRST_TOKEN_ID:
            raise ValueError(f"vocab_size must be at least {FIRST_TOKEN_ID + 1} (0 = pad, "
                             f"1 = EOS, then real tokens), got {vocab_size}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        lengths = dict(feature_lengths)
        if kind == ENCODER_DECODER:
            wanted = {"inputs", "targets"}
            if set(lengths) != wanted:
                raise ValueError(f"an encoder_decoder task needs feature_lengths with keys "
                                 f"'inputs' and 'targets', got {sorted(lengths)}")
            self.inputs_length = check_positive_int("feature_lengths['inputs']",
                                                    lengths["inputs"], error=ValueError)
        else:
            extra = set(lengths) - {"targets", "inputs"}
            if "targets" not in lengths or extra or lengths.get("inputs"):
                raise ValueError(f"a decoder_only task needs feature_lengths "
                                 f"{{'targets': seq_length}}, got {lengths}")
            self.inputs_length = None
        self.targets_length = check_positive_int("feature_lengths['targets']",
                                                 lengths["targets"], error=ValueError)

    @property
    def feature_lengths(self) -> Dict[str, int]:
        """The widths of its batches: {"inputs", "targets"} or {"targets"}."""
        if self.kind == ENCODER_DECODER:
            return {"inputs": self.inputs_length, "targets": self.targets_length}
        return {"targets": self.targets_length}

    def __repr__(self) -> str:
        return (f"SyntheticTask({self.feature_lengths}, vocab_size={self.vocab_size}, "
                f"kind={self.kind!r}, seed={self.seed})")

    # -- shapes -------------------------------------------------------------------------
    def feature_specs(self, batch_size: int) -> Dict[str, tuple]:
        """{feature name: (shape, numpy dtype)} of a batch of `batch_size` rows."""
        t = (batch_size, self.targets_length)
        specs = {"decoder_input_tokens": (t, np.dtype(np.int32)),
                 "decoder_target_tokens": (t, np.dtype(np.int32)),
                 "decoder_loss_weights": (t, np.dtype(np.float32))}
        if self.kind == ENCODER_DECODER:
            specs = {"encoder_input_tokens": ((batch_size, self.inputs_length),
                                              np.dtype(np.int32)), **specs}
        return specs

    # -- rows ---------------------------------------------------------------------------
    def _generator(self, step: int, row: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            [self.seed, int(step), int(row)])))

    def _padded_sequence(self, rng: np.random.Generator, length: int) -> np.ndarray:
        """Tokens, then EOS, then padding; tokens + EOS fill >= half of `length`."""
        used = int(rng.integers((length + 1) // 2, length + 1))  # tokens + EOS
        out = np.zeros(length, np.int32)
        out[:used - 1] = rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=used - 1,
                                      dtype=np.int32)
        out[used - 1] = EOS_ID
        return out

    def _fill_row(self, batch: Dict[str, np.ndarray], i: int, step: int, row: int) -> None:
        rng = self._generator(step, row)
        if self.kind == ENCODER_DECODER:
            batch["encoder_input_tokens"][i] = self._padded_sequence(rng, self.inputs_length)
            batch["decoder_target_tokens"][i] = self._padded_sequence(rng, self.targets_length)
        else:
            seq = rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=self.targets_length + 1,
                               dtype=np.int32)
            batch["decoder_input_tokens"][i] = seq[:-1]
            batch["decoder_target_tokens"][i] = seq[1:]

    # -- batches ------------------------------------------------------------------------
    def host_batch(self, step: int, layout: DataLayout) -> Dict[str, np.ndarray]:
        """Rows [layout.start, layout.stop) of `global_batch(step, layout.batch_size)`,
        computing only those rows."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        rows = range(layout.start, layout.stop)
        batch = {name: np.zeros(shape, dtype) for name, (shape, dtype)
                 in self.feature_specs(len(rows)).items()}
        for i, row in enumerate(rows):
            self._fill_row(batch, i, step, row)
        targets = batch["decoder_target_tokens"]
        if self.kind == ENCODER_DECODER:
            batch["decoder_input_tokens"][:, 1:] = targets[:, :-1]  # shift right, BOS = 0
            batch["decoder_loss_weights"][:] = targets != PAD_ID
        else:
            batch["decoder_loss_weights"][:] = 1.0
        return batch

    def global_batch(self, step: int, batch_size: int) -> Dict[str, np.ndarray]:
        """The whole global batch of `step`: a function of (seed, step, batch_size) only."""
        return self.host_batch(step, DataLayout(batch_size))


class SyntheticIterator:
    """This process's rows (`layout`) of the batches of steps start_step, start_step+1,
    ...; state = next step."""

    def __init__(self, task: SyntheticTask, layout: DataLayout, start_step: int = 0):
        self.task = task
        self.layout = layout
        self.sequence_lengths = task.feature_lengths  # the batches' widths
        self.step = int(start_step)

    def __iter__(self) -> "SyntheticIterator":
        return self

    def __next__(self) -> Dict[str, np.ndarray]:
        batch = self.task.host_batch(self.step, self.layout)
        self.step += 1
        return batch

    def get_state(self) -> Dict[str, int]:
        """{"step": the step of the next batch `__next__` returns}."""
        return {"step": self.step}

    def set_state(self, state: Mapping[str, int], allow_changed_inputs: bool = False) -> None:
        """Continue at `state["step"]` (random batches read no files:
        `allow_changed_inputs` has nothing to allow)."""
        if "step" not in state:
            raise ValueError(f"synthetic iterator state needs a 'step' entry, got {dict(state)}")
        step = int(np.asarray(state["step"]))
        if step < 0:
            raise ValueError(f"synthetic iterator step must be >= 0, got {step}")
        self.step = step
