"""Matmul precision: bf16 by default, native XLA FP8 through flax's fp8 ops.

Native FP8 keeps per-matmul scales and amax histories (input, kernel, output gradient) in
the flax collection `FP8_COLLECTION` ("_overwrite_with_gradient"): not parameters. The
trainer takes gradients with respect to that collection and uses them as the new state
(flax's "overwrite with gradient" contract), combines them across microbatches with max,
and never feeds them to the optimizer, clipping or weight decay.
"""
from __future__ import annotations

from flax.linen import fp8_ops

FP8_COLLECTION = fp8_ops.OVERWRITE_WITH_GRADIENT
AMAX_HISTORY_LENGTH = 1024


def fp8_dot_general(name: str):
    """A flax module usable as `dot_general(x, kernel, dimension_numbers)` that quantizes
    x and kernel to e4m3 and the output gradient to e5m2 with delayed scaling."""
    return fp8_ops.Fp8DirectDotGeneralOp(amax_history_length=AMAX_HISTORY_LENGTH, name=name)
