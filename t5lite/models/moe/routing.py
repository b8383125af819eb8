"""Mixture-of-experts routing: which expert each token goes to, with what weight, and the
router's losses. Pure functions of the router's float32 logits; `t5lite.models.moe` runs
the experts.

Two kinds (`ROUTING`):

- 'capacity' (GShard / GLaM, Switch for top-1): tokens are routed within groups of
  `group` tokens, each expert taking at most `capacity` of a group's tokens. A token's
  j-th choice is the j-th largest router probability; every first choice of the group
  outranks every second choice (slots fill first choices in token order, then second
  choices); a choice past the expert's capacity is dropped, and with all its choices
  dropped the token goes on through the residual alone. The result is, for each
  [group, token, choice], the place in its expert's buffer of `capacity` slots (an index,
  never a one-hot [group, token, expert, slot] tensor: at GLaM 64B's groups of 32,768
  tokens that tensor is 2^31 numbers a group) and the gate weight.
- 'dropless' (Mixtral): every token's top-k experts, no capacity; the result is
  (expert ids, weights) [tokens, k], computed by the experts as ragged matmuls.

Gate weights: with top_k > 1 the chosen probabilities are renormalized to sum to one
(GShard's top-2, Mixtral's softmax over the top-k logits: the same numbers); with
top_k = 1 the weight is the raw probability (Switch), so that the router still learns
from the main loss.

Losses, per group (the mean over groups is the layer's):

- load balancing, GShard's convention: E^2 * mean_e(f_e * P_e), f_e the fraction of
  the group's tokens whose first choice is e (before capacity), P_e the mean router
  probability of e. Balanced routing gives 1 (and so does a zero router: every token's
  first choice is expert 0, whose mean probability is 1/E). Switch and Mixtral's
  E * sum_e(f_e P_e) is the same number for top-1; Mixtral counts all k choices in f,
  which makes its balanced value k.
- z-loss (ST-MoE): mean over tokens of logsumexp(logits)^2; a zero router gives (ln E)^2.
"""
from __future__ import annotations

from typing import NamedTuple, Tuple

import jax
import jax.numpy as jnp

Array = jax.Array

MIN_CAPACITY = 4  # GShard / Praxis / T5X: an expert takes at least this many tokens


def expert_capacity(group: int, num_experts: int, capacity_factor: float,
                    rule: str = "gshard") -> int:
    """Slots per expert and group. 'gshard' (Praxis): int(capacity_factor * group /
    num_experts) rounded up to a multiple of 4; 't5x' (flaxformer):
    round(capacity_factor * group / num_experts); both at least MIN_CAPACITY and at most
    `group` (a token chooses an expert once). The factor counts every choice: GLaM's
    top-2 with factor 2.0 has room for both choices of evenly routed tokens."""
    if rule == "t5x":
        cap = int(round(capacity_factor * group / num_experts))
    else:
        cap = int(capacity_factor * group / num_experts)
        cap = -(-cap // MIN_CAPACITY) * MIN_CAPACITY
    return int(min(max(cap, MIN_CAPACITY), group))


def top_k_choices(probs: Array, top_k: int) -> Tuple[Array, Array]:
    """probs [..., expert] -> (expert ids [..., k] int32, gate weights [..., k] float32):
    the k largest probabilities in order (ties: the lower id first), renormalized over the
    k when k > 1 (see the module docstring)."""
    # k rounds of argmax (the lowest id among equals, as top_k): reductions XLA splits
    # like the groups, where its TopK call would gather every group onto each device
    ids, rest = [], probs
    for _ in range(top_k):
        ids.append(jnp.argmax(rest, axis=-1))
        rest = jnp.where(jax.nn.one_hot(ids[-1], probs.shape[-1], dtype=bool), -1.0, rest)
    ids = jnp.stack(ids, axis=-1)
    gates = jnp.take_along_axis(probs, ids, axis=-1)
    if top_k > 1:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return ids.astype(jnp.int32), gates


class CapacityRouting(NamedTuple):
    """Capacity routing of [group, token] tokens, each array [group, token, k]:

    - `slot` int32: the choice's place among all experts' slots, expert * capacity +
      position, or num_experts * capacity (one past the last slot) when it was dropped;
    - `gates` float32: its weight, zero when dropped;
    - `kept` bool: whether it got a slot; `ids` int32: the chosen expert."""

    slot: Array
    gates: Array
    kept: Array
    ids: Array


def capacity_routing(probs: Array, top_k: int, capacity: int,
                     batch_prioritized: bool = False) -> CapacityRouting:
    """probs [group, token, expert] float32 -> `CapacityRouting`: first choices take their
    expert's slots in token order (`batch_prioritized`: in order of the tokens' largest
    probability, the most confident first, ties in token order: T5X's batch-prioritized
    routing, for an encoder), then second choices after every first choice kept, and so
    on; a choice that finds its expert full is dropped."""
    num_experts = probs.shape[-1]
    ids, gates = top_k_choices(probs, top_k)
    if batch_prioritized:  # route the tokens in priority order, then put them back
        order = jnp.argsort(-jnp.max(probs, axis=-1), axis=1, stable=True)
        back = jnp.argsort(order, axis=1)
        r = capacity_routing(jnp.take_along_axis(probs, order[..., None], axis=1), top_k,
                             capacity)
        return CapacityRouting(*(jnp.take_along_axis(a, back[..., None], axis=1) for a in r))
    filled = jnp.zeros(probs.shape[:1] + (num_experts,), jnp.int32)  # [group, expert]
    slots, kept_all = [], []
    for j in range(top_k):
        choice = jax.nn.one_hot(ids[..., j], num_experts, dtype=jnp.int32)  # [g, s, e]
        # position of each token in its expert: the tokens before it that chose the same
        # expert at this rank, after the slots earlier ranks filled
        position = jnp.cumsum(choice, axis=1) - choice + filled[:, None, :]
        position = jnp.sum(position * choice, axis=-1)  # [g, s]
        kept = position < capacity
        filled = filled + jnp.sum(choice * kept[..., None], axis=1)
        slots.append(jnp.where(kept, ids[..., j] * capacity + position,
                               num_experts * capacity))
        kept_all.append(kept)
    kept = jnp.stack(kept_all, axis=-1)
    return CapacityRouting(jnp.stack(slots, axis=-1).astype(jnp.int32),
                           jnp.where(kept, gates, 0.0), kept, ids)


def dispatch(x: Array, slot: Array, num_slots: int) -> Array:
    """x [group, token, embed], `slot` [group, token, k] -> [group, num_slots, embed]: each
    slot holds the token routed to it, or zeros. A gather by each slot's token (its
    gradient a scatter-add), linear in the tokens; mapped over the groups, so that a
    partitioner splitting the groups keeps each group's gather on its device."""
    return jax.vmap(lambda xg, sg: _dispatch_group(xg, sg, num_slots))(x, slot)


def _dispatch_group(x: Array, slot: Array, num_slots: int) -> Array:
    tokens, k = slot.shape
    token_ids = jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32)[:, None], slot.shape)
    # each slot's token (`tokens`: none); dropped choices all land on the extra last slot
    owner = jnp.full((num_slots + 1,), tokens, jnp.int32).at[slot].set(
        token_ids, mode="promise_in_bounds")
    padded = jnp.concatenate([x, jnp.zeros_like(x[:1])], axis=0)
    return padded.at[owner[:num_slots]].get(mode="promise_in_bounds")


def combine(y: Array, slot: Array, gates: Array) -> Array:
    """y [group, num_slots, embed] (the experts' outputs by slot), `slot` / `gates`
    [group, token, k] -> [group, token, embed]: the sum over a token's kept choices of
    gate * its slot's output."""
    def one_group(yg, sg, gg):
        padded = jnp.concatenate([yg, jnp.zeros_like(yg[:1])], axis=0)
        picked = padded.at[sg].get(mode="promise_in_bounds")  # [token, k, embed]
        return jnp.einsum("skd,sk->sd", picked, gg.astype(yg.dtype))
    return jax.vmap(one_group)(y, slot, gates)


def load_balancing_loss(probs: Array, first_choice: Array) -> Array:
    """GShard's E^2 * mean_e(f_e * P_e) per group, averaged over groups. probs
    [group, token, expert] float32; first_choice [group, token] int expert ids."""
    num_experts = probs.shape[-1]
    f = jnp.mean(jax.nn.one_hot(first_choice, num_experts, dtype=jnp.float32), axis=1)
    p = jnp.mean(probs, axis=1)
    return jnp.mean(jnp.mean(f * p, axis=-1)) * num_experts ** 2


def z_loss(logits: Array) -> Array:
    """Mean over tokens of logsumexp(logits)^2 (logits [..., expert] float32)."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1)))


def expert_load(ids: Array, num_experts: int) -> Array:
    """max / mean tokens per expert over every choice in `ids` [..., k] (1: balanced)."""
    # summed over the axes as they are (no reshape of `ids`: flattening split groups would
    # gather every group's choices onto each device)
    counts = jnp.sum(jax.nn.one_hot(ids, num_experts, dtype=jnp.float32),
                     axis=tuple(range(ids.ndim)))
    return jnp.max(counts) / jnp.maximum(jnp.mean(counts), 1e-9)
