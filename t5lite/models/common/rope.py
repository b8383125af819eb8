"""Rotary position embedding (RoPE): its frequencies, plain or with LLaMA-3.1's scaling,
and their rotation of the queries and keys.

`Rope` is what an attention layer is given: theta and the scaling. Its frequencies are
numbers fixed by the config (numpy, float32, computed once when the program is traced),
so a scaled RoPE costs what a plain one does.

LLaMA-3.1's scaling ("llama3"; Meta's reference code, transformers' `rope_type`
'llama3'): of the plain frequencies theta^(-2i/d), those whose wavelength 2 pi / f is
longer than `original_length / low_freq_factor` are divided by `factor`; those shorter
than `original_length / high_freq_factor` are kept; those between are blended, with
weight s = (original_length / wavelength - low) / (high - low) on the kept frequency and
1 - s on the divided one. Positions past `original_length` then rotate the slow
dimensions as positions `factor` times nearer would have in pretraining.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
SCALINGS = ("default", "llama3")


@dataclasses.dataclass(frozen=True)
class Rope:
    """RoPE's settings (hashable: a flax module attribute)."""

    theta: float = 10000.0
    scaling: str = "default"          # "default" (none) or "llama3"
    factor: float = 8.0               # the scalings' fields (read by "llama3" only)
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_length: int = 8192

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"rope_scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.scaling == "llama3":
            if not (self.factor >= 1.0 and self.original_length >= 1):
                raise ValueError(f"llama3 RoPE scaling needs rope_factor >= 1 and "
                                 f"rope_original_length >= 1, got {self.factor} and "
                                 f"{self.original_length}")
            if not self.high_freq_factor > self.low_freq_factor > 0:
                raise ValueError(f"llama3 RoPE scaling needs rope_high_freq_factor > "
                                 f"rope_low_freq_factor > 0, got {self.high_freq_factor} "
                                 f"and {self.low_freq_factor}")

    def inverse_frequencies(self, dim: int) -> np.ndarray:
        """float32 [dim / 2]: the angle a position adds to each pair of dimensions."""
        inv_freq = 1.0 / (np.float32(self.theta)
                          ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
        inv_freq = inv_freq.astype(np.float32)
        if self.scaling == "default":
            return inv_freq
        low, high, orig = self.low_freq_factor, self.high_freq_factor, self.original_length
        wavelength = np.float32(2 * math.pi) / inv_freq
        scaled = np.where(wavelength > orig / low, inv_freq / np.float32(self.factor), inv_freq)
        smooth = (orig / wavelength - low) / (high - low)
        blended = (1 - smooth) * scaled / np.float32(self.factor) + smooth * scaled
        medium = (wavelength >= orig / high) & (wavelength <= orig / low)
        return np.where(medium, blended, scaled).astype(np.float32)


def apply_rope(x: Array, positions: Array, rope: Rope) -> Array:
    """Rotary embedding, half-split pairing (i, i + d/2). x [..., length, heads, kv] with
    positions [..., length] in the same (layout) order; computed in float32."""
    d = x.shape[-1]
    inv_freq = rope.inverse_frequencies(d)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., length, d/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[..., None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (xf * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)
