"""Mixture-of-experts routing: which expert each token goes to, with what weight, and the
router's losses. Pure functions of the router's float32 logits; `t5lite.models.moe` runs
the experts.

Two kinds (`ROUTING`):

- 'capacity' (GShard / GLaM, Switch for top-1): tokens are routed within groups of
  `group` tokens, each expert taking at most `capacity` of a group's tokens. A token's
  j-th choice is the j-th largest router probability; every first choice of the group
  outranks every second choice (slots fill first choices in token order, then second
  choices); a choice past the expert's capacity is dropped, and with all its choices
  dropped the token goes on through the residual alone. The result is a dispatch mask
  and combine weights [group, token, expert, slot].
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


def expert_capacity(group: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert and group, Praxis's GShard rule: int(capacity_factor * group /
    num_experts) rounded up to a multiple of 4, at least MIN_CAPACITY, and at most
    `group` (a token chooses an expert once). The factor counts every choice: GLaM's
    top-2 with factor 2.0 has room for both choices of evenly routed tokens."""
    cap = int(capacity_factor * group / num_experts)
    cap = -(-cap // MIN_CAPACITY) * MIN_CAPACITY
    return int(min(max(cap, MIN_CAPACITY), group))


def top_k_choices(probs: Array, top_k: int) -> Tuple[Array, Array]:
    """probs [..., expert] -> (expert ids [..., k] int32, gate weights [..., k] float32):
    the k largest probabilities in order (ties: the lower id first), renormalized over the
    k when k > 1 (see the module docstring)."""
    gates, ids = jax.lax.top_k(probs, top_k)
    if top_k > 1:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return ids.astype(jnp.int32), gates


class CapacityRouting(NamedTuple):
    """Capacity routing of [group, token] tokens: dispatch (bool) and combine (float32)
    [group, token, expert, slot]; `kept` [group, token, k] whether each choice got a
    slot; `ids` [group, token, k] the chosen experts."""

    dispatch: Array
    combine: Array
    kept: Array
    ids: Array


def capacity_routing(probs: Array, top_k: int, capacity: int) -> CapacityRouting:
    """probs [group, token, expert] float32 -> `CapacityRouting`: first choices take their
    expert's slots in token order, then second choices after every first choice kept, and
    so on; a choice that finds its expert full is dropped."""
    num_experts = probs.shape[-1]
    ids, gates = top_k_choices(probs, top_k)
    filled = jnp.zeros(probs.shape[:1] + (num_experts,), jnp.int32)  # [group, expert]
    dispatch = jnp.zeros(probs.shape + (capacity,), bool)
    combine = jnp.zeros(probs.shape + (capacity,), jnp.float32)
    kept_all = []
    for j in range(top_k):
        choice = jax.nn.one_hot(ids[..., j], num_experts, dtype=jnp.int32)  # [g, s, e]
        # slot of each token in its expert: the tokens before it that chose the same
        # expert at this rank, after the slots earlier ranks filled
        position = jnp.cumsum(choice, axis=1) - choice + filled[:, None, :]
        slot = jnp.sum(position * choice, axis=-1)  # [g, s]
        kept = slot < capacity
        kept_choice = choice * kept[..., None]
        filled = filled + jnp.sum(kept_choice, axis=1)
        where = (kept_choice[..., None] > 0) & (jax.nn.one_hot(slot, capacity, dtype=bool)
                                                [:, :, None, :])
        dispatch = dispatch | where
        combine = combine + where * gates[..., j, None, None]
        kept_all.append(kept)
    return CapacityRouting(dispatch, combine, jnp.stack(kept_all, axis=-1), ids)


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
    counts = jnp.sum(jax.nn.one_hot(ids.reshape(-1), num_experts, dtype=jnp.float32), axis=0)
    return jnp.max(counts) / jnp.maximum(jnp.mean(counts), 1e-9)
