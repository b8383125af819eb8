"""Building blocks shared by every network: dense projections, MLP, norms, embeddings
and the batch/sequence layout helpers (attention: `t5lite.models.common.attention`).

Array shapes use logical axis names: `batch`, `length` (also `q_length`/`kv_length`),
`embed`, `heads`, `kv` (head_dim), `stack` (q/k/v slot of a fused kernel), `mlp`, `vocab`,
`relpos_buckets`. Activations run either as [batch, length, ...] ("BS") or, with the
transposed layout switch, as [length, batch, ...] ("SB"); `Layout` names the axes.
Parameters are float32; matmuls run in the activation dtype.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from t5lite.models import lora as lora_lib
from t5lite.models.activations import ACTIVATIONS, activated_product
from t5lite.models.common import precision
from t5lite.models import moe

Array = jax.Array


# ----------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class Layout:
    """Order of the batch and length axes of activations ([b, l, ...] or [l, b, ...])."""

    transposed: bool = False

    @property
    def length_axis(self) -> int:
        return 0 if self.transposed else 1

    def names(self, *rest: str) -> Tuple[str, ...]:
        """Logical axis names of an activation whose trailing axes are `rest`."""
        return (("length", "batch") if self.transposed else ("batch", "length")) + rest

    def to_internal(self, x: Array) -> Array:
        """[batch, length, ...] -> this layout."""
        return jnp.swapaxes(x, 0, 1) if self.transposed else x

    def to_external(self, x: Array) -> Array:
        """This layout -> [batch, length, ...]."""
        return jnp.swapaxes(x, 0, 1) if self.transposed else x

    def constrain(self, x: Array, *rest: str) -> Array:
        """A per-token activation (queries, attention outputs, MLP hidden, logits): its
        `length` is what context parallelism splits over `context`."""
        return self._constrain(x, "length", rest)

    def constrain_residual(self, x: Array) -> Array:
        """The residual stream between blocks, [batch, length, embed]: its length named
        `activation_length`, which context parallelism maps to `context` and sequence
        parallelism to `tensor` as well (the norms, dropout and residual adds then run
        on a slice of the sequence)."""
        return self._constrain(x, "activation_length", ("activation_embed",))

    def constrain_keys(self, x: Array) -> Array:
        """Keys or values, [batch, kv_length, heads, kv]: `kv_length` is never split, so
        under context parallelism each device all-gathers the whole sequence's keys and
        values for its slice of the queries."""
        return self._constrain(x, "kv_length", ("heads", "kv"))

    def _constrain(self, x: Array, length: str, rest: Sequence[str]) -> Array:
        """`x` constrained to (batch, `length`, *rest) in this layout; the length left
        whole where its mesh axes do not divide it (one decoding step's token, say)."""
        if not splits_evenly(x.shape[self.length_axis], length):
            length = None
        names = (length, "batch") if self.transposed else ("batch", length)
        return nn.with_logical_constraint(x, names + tuple(rest))


def splits_evenly(size: int, name: str) -> bool:
    """Whether an axis of `size` divides over the mesh axes its logical `name` maps to
    under the current mesh and rules (a parameter's spec leaves it whole otherwise)."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = nn.logical_to_mesh_axes((name,))[0] if not mesh.empty else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return size % int(np.prod([mesh.shape[a] for a in axes])) == 0


def get_dtype(name: str):
    return {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "float16": jnp.float16}[name]


# ----------------------------------------------------------------------------- init


def fan_in_init(scale: float = 1.0, n_in: int = 1) -> Callable:
    """Truncated-normal variance scaling over the first `n_in` (input) axes of a kernel."""

    def init(key, shape, dtype=jnp.float32):
        fan_in = int(np.prod(shape[:n_in]))
        flat = nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")(
            key, (fan_in, int(np.prod(shape[n_in:]))), dtype)
        return flat.reshape(shape)

    return init


# ----------------------------------------------------------------------------- dense


class Dense(nn.Module):
    """y = x . kernel, contracting the trailing `n_in` axes of x with the leading axes of
    kernel [*in, *features]; optional bias [*features]. `fp8` is a `precision.fp8_mode`:
    "" (the matmul in `dtype`), "native" (flax's FP8 op) or "te-<recipe>" (Transformer
    Engine's FP8 GEMM); FP8 scales and amax histories go to the FP8 collection.

    `lora` (a `lora.LoraSpec`) adds a low-rank adapter beside the kernel: y += (alpha /
    r) B(A(dropout(x))), with `lora_a` [*in, r] and `lora_b` [r, *features]; dropout only
    when not `deterministic`. `lora_adapters` > 0 (a fused q/k/v or k/v kernel): that
    many adapters, A [*in, lora_adapters, r], feeding the slots of the leading feature
    axis as `lora.slot_adapters` says. The adapters' matmuls run in `dtype`, not FP8.
    """

    features: Tuple[int, ...]
    kernel_axes: Tuple[str, ...]
    n_in: int = 1
    dtype: jnp.dtype = jnp.bfloat16
    use_bias: bool = False
    fp8: str = ""
    init_scale: float = 1.0
    lora: Optional[lora_lib.LoraSpec] = None
    lora_adapters: int = 0
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        in_shape = x.shape[x.ndim - self.n_in:]
        kernel = self.param(
            "kernel",
            nn.with_logical_partitioning(fan_in_init(self.init_scale, self.n_in), self.kernel_axes),
            tuple(in_shape) + tuple(self.features), jnp.float32)
        kernel = jnp.asarray(kernel, self.dtype)
        x = jnp.asarray(x, self.dtype)
        dims = (((tuple(range(x.ndim - self.n_in, x.ndim))), tuple(range(self.n_in))), ((), ()))
        y = precision.dot_general(self.fp8)(x, kernel, dims)
        if self.lora is not None:
            y = y + self._adapter(x, tuple(in_shape), dims)
        if self.use_bias:
            bias = self.param(
                "bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                     self.kernel_axes[self.n_in:]),
                tuple(self.features), jnp.float32)
            y = y + jnp.asarray(bias, self.dtype)
        return y

    def _adapter(self, x: Array, in_shape: Tuple[int, ...], dims) -> Array:
        """(alpha / r) B(A(dropout(x))), shaped like the kernel's output."""
        spec, n_in, rank_axis = self.lora, self.n_in, lora_lib.RANK_AXIS
        per_slot = (self.lora_adapters,) if self.lora_adapters else ()
        a = self.param(lora_lib.A, nn.with_logical_partitioning(
            fan_in_init(1.0, n_in),
            self.kernel_axes[:n_in] + (("stack",) if per_slot else ()) + (rank_axis,)),
            in_shape + per_slot + (spec.rank,), jnp.float32)
        b = self.param(lora_lib.B, nn.with_logical_partitioning(
            nn.initializers.zeros_init(), (rank_axis,) + tuple(self.kernel_axes[n_in:])),
            (spec.rank,) + tuple(self.features), jnp.float32)
        if spec.dropout > 0:
            x = nn.Dropout(spec.dropout, name="lora_dropout")(x, deterministic=self.deterministic)
        u = jax.lax.dot_general(x, jnp.asarray(a, self.dtype), dims)  # [..., (adapters,) r]
        b = jnp.asarray(b, self.dtype)
        if per_slot:  # [..., slots, r] . [r, slots, heads, kv]
            slots = np.asarray(lora_lib.slot_adapters(self.lora_adapters, self.features[0]))
            delta = jnp.einsum("...sr,rshd->...shd", jnp.take(u, slots, axis=-2), b)
        else:
            delta = jax.lax.dot_general(u, b, (((u.ndim - 1,), (0,)), ((), ())))
        return delta * jnp.asarray(spec.scale, self.dtype)


# ----------------------------------------------------------------------------- GEMM inputs


@jax.custom_vjp
def _gradient_tap(x: Array) -> Array:
    return x


def _gradient_tap_fwd(x):
    return x, None


def _gradient_tap_bwd(_, ct):
    return (jax.lax.optimization_barrier(ct),)


_gradient_tap.defvjp(_gradient_tap_fwd, _gradient_tap_bwd)


def gemm_input_views(x: Array, n: int) -> Tuple[Array, ...]:
    """n views of x (the same values) for n GEMMs that read it, so that on a GPU each
    GEMM's input gradient is added into the next one's in place (cuBLAS's C operand).

    Autodiff sums the n gradients of x in the order it meets them, each partial sum as
    the first operand of the next add; XLA folds an add into a GEMM only when the other
    operand is not already such a GEMM, so from the third reader on it writes each
    product apart and adds them in kernels of their own (T5 large: 23 [batch, length,
    embed] adds a step for the encoder output read by 48 GEMMs, and two arrays instead
    of one into each pre-attention norm's backward). Here view i + 1 is view i through
    an identity whose gradient goes behind an optimization barrier: every add then has
    one fresh GEMM product and one barrier, and XLA folds each into its GEMM."""
    views = [x]
    for _ in range(n - 1):
        views.append(_gradient_tap(views[-1]))
    return tuple(views)


# ----------------------------------------------------------------------------- norms


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def rms_norm(x: Array, scale: Array, epsilon: float, dtype) -> Array:
    """x * rsqrt(mean(x^2) + eps) * scale in float32, cast to `dtype`. x [..., embed]
    (any float dtype), scale [embed] float32.

    Its gradient is written out, so that the backward pass keeps x in its own dtype and
    one float32 number a token (1 / rms), instead of the float32 copy of x autodiff keeps:
    dx = r * (g - x r^2 mean(g x)), g = dy * scale, r = 1 / rms; dscale = sum dy x r."""
    return _rms_norm_fwd(x, scale, epsilon, dtype)[0]


def _rms_norm_fwd(x, scale, epsilon, dtype):
    xf = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + epsilon)
    return (xf * r * scale).astype(dtype), (x, r, scale)


def _rms_norm_bwd(epsilon, dtype, res, dy):
    del epsilon, dtype
    x, r, scale = res
    xf, dyf = x.astype(jnp.float32), dy.astype(jnp.float32)
    g = dyf * scale
    dx = r * (g - xf * (r * r) * jnp.mean(g * xf, axis=-1, keepdims=True))
    dscale = jnp.sum((dyf * xf * r).reshape(-1, x.shape[-1]), axis=0)
    return dx.astype(x.dtype), dscale


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def residual_add(x: Array, y: Array, dropout_rate: float, deterministic: bool) -> Array:
    """The residual stream x [..., embed] plus a sublayer's output y [..., embed] (its last
    GEMM's, after the sublayer's dropout of `dropout_rate`, off when `deterministic`).

    Plainly, XLA on a GPU folds the add into that GEMM (cuBLAS's C operand, written in
    place); in a training step x is also kept for the backward pass (the next norm's
    input), so XLA first copies x: one copy of the residual stream a sublayer. With y
    behind an optimization barrier the add moves into the next norm's reduction instead,
    the GEMM reads no C and nothing is copied (T5 large, batch 32, H200: 120 copies, 2.2
    GB a step less). Only in a training step whose dropout is off: not without a
    backward pass (`deterministic`: there the in-place add is free) nor with dropout
    between the GEMM and the add (its kernel does the add)."""
    apart = not deterministic and dropout_rate == 0
    return x + (jax.lax.optimization_barrier(y) if apart else y)


class RMSNorm(nn.Module):
    """T5 "LayerNorm": x * rsqrt(mean(x^2) + eps) * scale, in float32 (`rms_norm`).
    x: [..., embed] (or [..., kv], `axis` "kv": Qwen3's norm of each head's query / key)."""

    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.bfloat16
    axis: str = "embed"  # the logical name of the normalized (last) axis

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                                 (self.axis,)),
                           (x.shape[-1],), jnp.float32)
        return rms_norm(x, scale, self.epsilon, self.dtype)


class LayerNorm(nn.Module):
    """LayerNorm with bias (GPT), in float32. x: [..., embed]."""

    epsilon: float = 1e-5
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = jnp.asarray(x, jnp.float32)
        d = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                                 ("embed",)), (d,), jnp.float32)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                               ("embed",)), (d,), jnp.float32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
        return jnp.asarray(y * scale + bias, self.dtype)


def make_norm(kind: str, epsilon: float, dtype, name: str) -> nn.Module:
    return (RMSNorm if kind == "rms" else LayerNorm)(epsilon=epsilon, dtype=dtype, name=name)


# ----------------------------------------------------------------------------- embeddings


class Embed(nn.Module):
    """Token table [vocab, embed]; `attend` gives logits against the same table."""

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.bfloat16
    axes: Tuple[str, str] = ("vocab", "embed")
    init_std: float = 1.0  # T5: 1.0; GPT / LLaMA: 0.02 (tied logits stay O(1) at init)

    def setup(self):
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(nn.initializers.normal(self.init_std), self.axes),
            (self.num_embeddings, self.features), jnp.float32)

    def _table(self) -> Array:
        """The table as it is read: whole over its embed axis (gathered, as FSDP gathers a
        kernel), its rows split as its own sharding splits them. Left to itself, XLA
        spreads the lookup and the tied logits over a mesh axis the batch leaves idle (a
        pipeline's stages) and gathers the logits back."""
        rows = self.axes[0] if splits_evenly(self.num_embeddings, self.axes[0]) else None
        return nn.with_logical_constraint(jnp.asarray(self.embedding, self.dtype), (rows, None))

    def __call__(self, ids: Array) -> Array:
        """ids [...] int -> [..., embed]."""
        return jnp.take(self._table(), ids, axis=0)

    def attend(self, x: Array) -> Array:
        """x [..., embed] -> [..., vocab]."""
        return jnp.einsum("...d,vd->...v", jnp.asarray(x, self.dtype), self._table())


# ----------------------------------------------------------------------------- mlp

class MLP(nn.Module):
    """wo(act_0(wi_0 x) * act_1(wi_1 x) ...): gated when two activations are given.
    x: [..., embed] -> [..., embed]; hidden [..., mlp]."""

    mlp_dim: int
    activations: Sequence[str]
    layout: Layout
    dtype: jnp.dtype = jnp.bfloat16
    use_bias: bool = False
    fp8: str = ""  # a precision.fp8_mode
    dropout_rate: float = 0.0
    deterministic: bool = True
    lora: Optional[lora_lib.LoraSpec] = None  # adapters on the projections it names

    def _dense(self, features: int, axes: Tuple[str, str], name: str) -> Dense:
        return Dense((features,), axes, dtype=self.dtype, use_bias=self.use_bias, fp8=self.fp8,
                     lora=self.lora and self.lora.for_target(name),
                     deterministic=self.deterministic, name=name)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        names = ["wi"] if len(self.activations) == 1 else [
            f"wi_{i}" for i in range(len(self.activations))]
        hidden = activated_product([ACTIVATIONS[a] for a in self.activations],
                                   [self._dense(self.mlp_dim, ("embed", "mlp"), n)(x)
                                    for n in names])
        hidden = checkpoint_name(self.layout.constrain(hidden, "mlp"), "mlpwi")
        hidden = nn.Dropout(self.dropout_rate, broadcast_dims=(self.layout.length_axis,))(
            hidden, deterministic=self.deterministic)
        y = self._dense(x.shape[-1], ("mlp", "embed"), "wo")(hidden)
        return checkpoint_name(y, "mlpwo")


def moe_mlp(cfg, deterministic: bool, encoder: bool = False) -> "moe.MoeMLP":
    """The mixture-of-experts block a config's sparse layers hold (named "mlp", as a
    dense MLP; it takes and returns [batch, length, embed]); an `encoder`'s may route
    batch-prioritized."""
    return moe.MoeMLP(num_experts=cfg.num_experts, top_k=cfg.moe_top_k, mlp_dim=cfg.mlp_dim,
                      activations=tuple(ACTIVATIONS[a] for a in cfg.expert_activations),
                      routing_kind=cfg.routing, capacity_factor=cfg.capacity_factor,
                      eval_capacity_factor=cfg.eval_capacity_factor,
                      group_size=cfg.moe_group_size, capacity_rule=cfg.capacity_rule,
                      expert_capacity=cfg.expert_capacity,
                      batch_prioritized=encoder and cfg.batch_prioritized_routing,
                      dtype=get_dtype(cfg.dtype), use_bias=getattr(cfg, "use_bias", False),
                      dropout_rate=(cfg.dropout_rate if cfg.expert_dropout_rate is None
                                    else cfg.expert_dropout_rate),
                      deterministic=deterministic, name="mlp")
