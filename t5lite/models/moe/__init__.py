"""Mixture of experts: the routing (`routing`) and the MoE feed-forward block (`block`).

Needs nothing of t5lite (jax and flax only): the families' layers (`t5lite.models.common.layers
.moe_mlp`) build the block from a config, with the activations and the layout theirs.
"""
from t5lite.models.moe.block import (MOE_STATS, STATS_COLLECTION, MoeMLP,  # noqa: F401
                                     group_size_for, layer_stats, metrics,
                                     microbatch_routing_change)
