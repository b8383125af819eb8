"""The mixture-of-experts feed-forward block: a float32 router, `routing`'s choice of
experts, and `num_experts` MLPs whose kernels carry a leading `expert` axis.

Parameters (under a layer's `mlp`, where a dense layer has its MLP)::

    router/kernel                  [embed, expert_logits]  float32, used in float32
    wi_0/kernel, wi_1/kernel       [expert, embed, mlp]    (wi/kernel when not gated)
    wo/kernel                      [expert, mlp, embed]
    wi*/bias [expert, mlp], wo/bias [expert, embed]        with use_bias

Tokens are taken in [batch, length] order (the routing never depends on the layout or
the mesh) and cut into routing groups of at most `group_size` tokens (`group_size_for`),
or ('sequence') each sequence its own group; an expert takes `expert_capacity` tokens of
a group when it is set, else the slots the capacity factor gives.
'capacity' routing gathers each group's tokens into its experts' slots
[expert, group, slot, embed] by index (`routing.dispatch`; XLA moves them with an
all-to-all when the expert axis is sharded) and gathers the outputs back
(`routing.combine`);
'dropless' routing sorts the tokens' choices by expert and runs the experts as ragged
matmuls (`jax.lax.ragged_dot`).

Statistics for the loss and the logs are sown into the "intermediates" collection
(`MOE_STATS`): each layer's aux_loss, z_loss, dropped_fraction and expert_load.
The experts' matmuls run in the activation dtype, also under FP8 (only the dense layers'
matmuls are FP8); the router's logits and softmax are float32 whatever the dtype.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from t5lite.models.activations import activated_product
from t5lite.models.moe import routing
from t5lite.models.moe.settings import SEQUENCE_GROUPS

Array = jax.Array
MOE_STATS = ("aux_loss", "z_loss", "dropped_fraction", "expert_load")
STATS_COLLECTION = "intermediates"


def expert_init(scale: float = 1.0):
    """Truncated-normal fan-in scaling of an [expert, in, out] kernel: each expert as a
    dense kernel [in, out] would be drawn."""
    return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal",
                                            in_axis=-2, out_axis=-1, batch_axis=(0,))


class MoeMLP(nn.Module):
    """x [batch, length, embed] -> the same shape: the sum over a token's kept choices of
    gate * expert_e(x). `activations`: one function (wi) or several, multiplied (a gated
    MLP: wi_0, wi_1, ...)."""

    num_experts: int
    top_k: int
    mlp_dim: int
    activations: Tuple[Callable, ...]
    routing_kind: str  # 'capacity' | 'dropless'
    capacity_factor: float
    eval_capacity_factor: float
    group_size: Union[int, str]  # 'sequence': each sequence its own group
    capacity_rule: str = "gshard"  # routing.expert_capacity's
    expert_capacity: Optional[int] = None  # slots per expert and group, instead of the factors
    batch_prioritized: bool = False  # routing.capacity_routing's (an encoder's only)
    dtype: jnp.dtype = jnp.bfloat16
    use_bias: bool = False
    dropout_rate: float = 0.0
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        batch, length, embed = x.shape
        flat = x.reshape(batch * length, embed)
        group = length if self.group_size == SEQUENCE_GROUPS else \
            group_size_for(self.group_size, flat.shape[0])
        # the groups split like the batch: each device routes its own tokens
        xg = _split_like_batch(flat.reshape(-1, group, embed))  # [groups, group, embed]
        router, _ = ExpertParams((embed, self.num_experts), ("embed", "expert_logits"),
                                 False, name="router")()
        logits = jnp.einsum("gsd,de->gse", xg.astype(jnp.float32), router,
                            precision=jax.lax.Precision.HIGHEST)  # float32
        logits = _split_like_batch(logits)
        probs = _split_like_batch(jax.nn.softmax(logits, axis=-1))
        experts = self._experts(embed)
        if self.routing_kind == "capacity":
            cf = self.eval_capacity_factor if self.deterministic else self.capacity_factor
            cap = (min(self.expert_capacity, group) if self.expert_capacity else
                   routing.expert_capacity(group, self.num_experts, cf, self.capacity_rule))
            r = routing.capacity_routing(probs, self.top_k, cap, self.batch_prioritized)
            slot = _split_like_batch(r.slot)
            dispatched = routing.dispatch(xg.astype(self.dtype), slot, self.num_experts * cap)
            dispatched = _split_like_batch(dispatched.reshape(-1, self.num_experts, cap, embed))
            # [groups, expert, slot] -> [expert, groups, slot]: an all-to-all over the
            # expert axis when the experts are sharded
            experts_axes = ("expert", "expert_groups", None, "embed")
            dispatched = nn.with_logical_constraint(dispatched.transpose(1, 0, 2, 3), experts_axes)
            out = nn.with_logical_constraint(experts(dispatched), experts_axes)
            out = _split_like_batch(out.transpose(1, 0, 2, 3))
            out = out.reshape(-1, self.num_experts * cap, embed)
            y = _split_like_batch(routing.combine(out, slot, r.gates))
            kept, ids = r.kept, r.ids
        else:
            ids, gates = routing.top_k_choices(probs, self.top_k)
            y = self._dropless(flat, ids.reshape(-1, self.top_k), gates.reshape(-1, self.top_k),
                               experts)
            kept = jnp.ones(ids.shape, bool)
        self._sow_stats(logits, probs, ids, kept)
        return y.reshape(batch, length, embed).astype(self.dtype)

    def _experts(self, embed: int) -> "_ExpertFn":
        """The experts' parameters, as a function of their inputs."""
        e, f = self.num_experts, self.mlp_dim
        names = ["wi"] if len(self.activations) == 1 else [
            f"wi_{i}" for i in range(len(self.activations))]
        wis = [ExpertParams((e, embed, f), ("expert", "embed", "mlp"), self.use_bias, name=n)()
               for n in names]
        wo = ExpertParams((e, f, embed), ("expert", "mlp", "embed"), self.use_bias, name="wo")()
        return _ExpertFn(wis, wo, self.activations, self.dtype,
                         nn.Dropout(self.dropout_rate), self.deterministic)

    def _dropless(self, flat: Array, ids: Array, gates: Array, experts) -> Array:
        """flat [tokens, embed]; ids / gates [tokens, k] -> [tokens, embed]."""
        tokens, k = ids.shape
        order = jnp.argsort(ids.reshape(-1), stable=True)
        sizes = jnp.bincount(ids.reshape(-1), length=self.num_experts).astype(jnp.int32)
        xs = jnp.take(flat.astype(self.dtype), order // k, axis=0)  # [tokens * k, embed]
        ys = experts.ragged(xs, sizes)
        ys = jnp.zeros_like(ys).at[order].set(ys).reshape(tokens, k, -1)
        return jnp.einsum("tkd,tk->td", ys, gates.astype(self.dtype))

    def _sow_stats(self, logits, probs, ids, kept):
        stats = {
            "aux_loss": routing.load_balancing_loss(probs, ids[..., 0]),
            "z_loss": routing.z_loss(logits),
            "dropped_fraction": 1.0 - jnp.mean(kept.astype(jnp.float32)),
            "expert_load": jax.lax.stop_gradient(routing.expert_load(ids, self.num_experts)),
        }
        for name in MOE_STATS:
            self.sow(STATS_COLLECTION, f"moe_{name}", stats[name])


class ExpertParams(nn.Module):
    """One kernel (and its bias over the trailing axis with `use_bias`), float32: the
    router's [embed, expert_logits] (drawn as a dense kernel), or an expert projection
    [expert, in, out] (each expert drawn as a dense kernel [in, out])."""

    shape: Sequence[int]
    axes: Sequence[str]
    use_bias: bool

    @nn.compact
    def __call__(self):
        kernel = self.param("kernel", nn.with_logical_partitioning(
            expert_init() if len(self.shape) == 3 else
            nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"),
            tuple(self.axes)), tuple(self.shape), jnp.float32)
        bias = None
        if self.use_bias:
            bias_shape = (self.shape[0], self.shape[-1])
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros_init(), (self.axes[0], self.axes[-1])), bias_shape,
                jnp.float32)
        return kernel, bias


class _ExpertFn:
    """The experts' MLPs over their parameters (kernels [expert, in, out])."""

    def __init__(self, wis, wo, activations, dtype, dropout, deterministic):
        self.wis, self.wo, self.activations, self.dtype = wis, wo, activations, dtype
        self.dropout, self.deterministic = dropout, deterministic

    def _hidden(self, matmul, bias_shape) -> Array:
        ys = []
        for kernel, bias in self.wis:
            y = matmul(jnp.asarray(kernel, self.dtype))
            if bias is not None:
                y = y + bias_shape(jnp.asarray(bias, self.dtype))
            ys.append(y)
        hidden = checkpoint_name(activated_product(self.activations, ys), "mlpwi")
        return self.dropout(hidden, deterministic=self.deterministic)

    def __call__(self, x: Array) -> Array:
        """x [expert, group, slot, embed] -> the same shape."""
        hidden = self._hidden(lambda k: jnp.einsum("egcd,edf->egcf", x, k),
                              lambda b: b[:, None, None, :])
        kernel, bias = self.wo
        y = jnp.einsum("egcf,efd->egcd", hidden, jnp.asarray(kernel, self.dtype))
        if bias is not None:
            y = y + jnp.asarray(bias, self.dtype)[:, None, None, :]
        return checkpoint_name(y, "mlpwo")

    def ragged(self, xs: Array, sizes: Array) -> Array:
        """xs [rows, embed] sorted by expert, `sizes` [expert] rows each -> [rows, embed]."""
        row_expert = jnp.repeat(jnp.arange(sizes.shape[0]), sizes, total_repeat_length=xs.shape[0])
        hidden = self._hidden(lambda k: jax.lax.ragged_dot(xs, k, sizes),
                              lambda b: jnp.take(b, row_expert, axis=0))
        kernel, bias = self.wo
        y = jax.lax.ragged_dot(hidden, jnp.asarray(kernel, self.dtype), sizes)
        if bias is not None:
            y = y + jnp.take(jnp.asarray(bias, self.dtype), row_expert, axis=0)
        return checkpoint_name(y, "mlpwo")


def _split_like_batch(x: Array) -> Array:
    """x [groups, ...]: the groups over the batch's mesh axes, the rest unsplit."""
    return nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 1))


def group_size_for(group_size: int, tokens: int) -> int:
    """The routing group of a call with `tokens` tokens, from `group_size` (MOE_GROUP_SIZE,
    the largest group) and the tokens alone, never the mesh: the fewest groups, at least
    tokens / group_size, that split the tokens evenly (flaxformer's rule, without its
    expert-partition term). Tokens a multiple of group_size: groups of exactly group_size;
    fewer tokens (a decoding step): one group of them all."""
    groups = -(-tokens // group_size)
    while tokens % groups:
        groups += 1
    return tokens // groups

def microbatch_routing_change(cfg, batch_size: int, stack_lengths, num_microbatches: int
                              ) -> Optional[str]:
    """What NUM_MICROBATCHES changes in the routing, in one line (None: nothing). Each
    microbatch is routed on its own: its tokens form groups by `group_size_for`, as the
    whole batch's do. Where both come out the same size, a microbatch holds whole groups
    of the whole batch (the microbatches are its rows in order): the same routing,
    capacity and drops, and the routers' losses, means over groups, average to the whole
    batch's. Where they do not, capacity and the load-balancing loss differ.
    `stack_lengths`: the length of each stack's sequences ({"inputs", "targets"} or
    {"targets"})."""
    if not cfg.num_experts or num_microbatches <= 1 or cfg.moe_group_size == SEQUENCE_GROUPS:
        return None
    rows = batch_size // num_microbatches
    names = ({"inputs": "encoder ", "targets": "decoder "} if len(stack_lengths) > 1
             else {})
    for key, length in sorted(stack_lengths.items()):
        stack = names.get(key, "")
        micro, whole = rows * int(length), batch_size * int(length)
        ours, theirs = (group_size_for(cfg.moe_group_size, micro),
                        group_size_for(cfg.moe_group_size, whole))
        if ours != theirs:
            # the largest group a microbatch splits evenly (the whole batch, k of them, too)
            fits = next(d for d in range(min(cfg.moe_group_size, micro), 0, -1)
                        if micro % d == 0)
            return (f"NUM_MICROBATCHES={num_microbatches} changes the mixture-of-experts "
                    f"routing: a microbatch's {micro} {stack}tokens are routed in groups of "
                    f"{ours}, the whole batch's {whole} in groups of {theirs} "
                    f"(MOE_GROUP_SIZE={cfg.moe_group_size}), so capacity, drops and the "
                    f"load-balancing loss are not the one-microbatch step's; "
                    f"MOE_GROUP_SIZE={fits} (or 'sequence') gives the same step")
    return None


def layer_stats(stats) -> dict:
    """The "intermediates" a network's MoE layers sowed -> {stat: [moe layers] float32},
    in layer order (a scanned stack's sow holds all its layers at once); {} when none."""
    found = {name: [] for name in MOE_STATS}

    def visit(tree, path):
        if isinstance(tree, dict):
            for key in sorted(tree, key=_layer_order):
                visit(tree[key], path + (key,))
            return
        name = path[-1][len("moe_"):] if path and path[-1].startswith("moe_") else None
        if name in found:
            for value in tree:  # sow keeps a tuple of the calls' values
                found[name].append(jnp.reshape(value, (-1,)))

    visit(stats, ())
    if not found["aux_loss"]:
        return {}
    return {name: jnp.concatenate(values) for name, values in found.items()}


def metrics(stats, cfg) -> dict:
    """The "intermediates" a network's MoE layers sowed -> `moe/<stat>` (the mean over MoE
    layers), `moe/dropped_fraction/<layer>` (`layer_<i>`; `decoder/layer_<i>`,
    `encoder/layer_<i>` in an encoder-decoder), and `moe/objective`: ROUTER_AUX_LOSS *
    moe/aux_loss + ROUTER_Z_LOSS * moe/z_loss. Empty when dense."""
    per_layer = layer_stats(stats)
    if not per_layer:
        return {}
    if hasattr(cfg, "num_encoder_layers"):  # `layer_stats` visits decoder, then encoder
        names = [f"{stack}/layer_{i}" for stack, n in (
            ("decoder", cfg.num_decoder_layers), ("encoder", cfg.num_encoder_layers))
            for i in range(n) if cfg.is_moe_layer(i)]
    else:
        names = [f"layer_{i}" for i in range(cfg.num_layers) if cfg.is_moe_layer(i)]
    out = {f"moe/{name}": jnp.mean(per_layer[name]) for name in MOE_STATS}
    for name, value in zip(names, per_layer["dropped_fraction"], strict=True):
        out[f"moe/dropped_fraction/{name}"] = value
    out["moe/objective"] = (cfg.router_aux_loss * out["moe/aux_loss"]
                            + cfg.router_z_loss * out["moe/z_loss"])
    return out


def _layer_order(key: str):
    """layers_10 after layers_9: sort `layers_<i>` by number, other keys by name."""
    head, _, tail = key.rpartition("_")
    return (head, int(tail)) if tail.isdigit() else (key, -1)
