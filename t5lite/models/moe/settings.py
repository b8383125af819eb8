"""The mixture-of-experts settings (`MoeFields`, which both families' configs hold), their
values and their one-line checks (`check` needs only the config's attributes)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

EXPERT_MLPS = {"relu": ("relu",), "gelu": ("gelu",), "gelu_exact": ("gelu_exact",),
               "swiglu": ("silu", "linear"), "geglu": ("gelu", "linear")}
ROUTINGS = ("capacity", "dropless")
CAPACITY_RULES = ("gshard", "t5x")
SEQUENCE_GROUPS = "sequence"  # MOE_GROUP_SIZE: each sequence routed as its own group


# fields an encoder's layers read only: a decoder-only config leaves them at their default
# (configs/models/_moe.gin binds them for T5Config alone; `check` refuses them elsewhere)
ENCODER_ONLY = ("batch_prioritized_routing",)


def _setting(default, macro: str):
    """A field with its default and the gin macro that sets it in every model config
    (configs/models/_moe.gin binds it; `t5lite.convert` writes it), as the switches'."""
    return dataclasses.field(default=default, metadata={"macro": macro})


@dataclasses.dataclass(frozen=True)
class MoeFields:
    """Mixture of experts (docs/moe.md), each field set by its macro (NUM_EXPERTS,
    MOE_EVERY, ...: configs/models/_moe.gin); NUM_EXPERTS = 0 is a dense model."""

    num_experts: int = _setting(0, "NUM_EXPERTS")
    # layers moe_first, moe_first + moe_every, ... are sparse (GLaM: 0 / 2, the even
    # layers; Switch: 1 / 2, the odd ones, flaxformer's MIXED layout; Mixtral: 0 / 1)
    moe_every: int = _setting(1, "MOE_EVERY")
    moe_first: int = _setting(0, "MOE_FIRST")
    moe_top_k: int = _setting(2, "MOE_TOP_K")
    # EXPERT_MLPS (GLaM's experts: relu; Mixtral's: swiglu)
    expert_mlp: str = _setting("swiglu", "EXPERT_MLP")
    # capacity (GShard / GLaM / Switch) | dropless (Mixtral)
    routing: str = _setting("capacity", "ROUTING")
    # training; slots ~ capacity_factor * group / experts
    capacity_factor: float = _setting(2.0, "CAPACITY_FACTOR")
    eval_capacity_factor: float = _setting(2.0, "EVAL_CAPACITY_FACTOR")  # eval, decoding
    # slots from the factor: 'gshard' int(cf * group / E) up to a multiple of 4 (Praxis),
    # 't5x' max(round(cf * group / E), 4) (flaxformer), both at least 4
    capacity_rule: str = _setting("gshard", "CAPACITY_RULE")
    # the encoder's slots go to the most confident tokens first (T5X's batch-prioritized
    # routing), not in token order; an encoder-decoder's encoder only
    batch_prioritized_routing: bool = _setting(False, "BATCH_PRIORITIZED_ROUTING")
    # the most tokens routed together (`moe.group_size_for`); 'sequence': each sequence
    # its own group, whatever its length (transformers' Switch)
    moe_group_size: Union[int, str] = _setting(1024, "MOE_GROUP_SIZE")
    # slots per expert and group, in training and evaluation alike, instead of the
    # factors (transformers' Switch `expert_capacity`); None: from the factors
    expert_capacity: Optional[int] = _setting(None, "EXPERT_CAPACITY")
    # GShard's load balancing, and ST-MoE's router z-loss, averaged over MoE layers
    router_aux_loss: float = _setting(0.01, "ROUTER_AUX_LOSS")
    router_z_loss: float = _setting(0.0, "ROUTER_Z_LOSS")
    # dropout on the experts' hidden activations (Switch's finetuning: 0.4 there, 0.1
    # elsewhere); None: DROPOUT_RATE, as the dense MLPs
    expert_dropout_rate: Optional[float] = _setting(None, "EXPERT_DROPOUT_RATE")

    def is_moe_layer(self, i: int) -> bool:
        return (self.num_experts > 0 and i >= self.moe_first
                and (i - self.moe_first) % self.moe_every == 0)

    @property
    def expert_activations(self) -> Tuple[str, ...]:
        return EXPERT_MLPS[self.expert_mlp]

    @property
    def layer_period(self) -> int:
        """How many layers a scan repeats as one block (dense and sparse ones in turn)."""
        return self.moe_every if self.num_experts and self.moe_every > 1 else 1


def check(cfg) -> None:
    """One line for each MoE setting that cannot work (checked even when dense)."""
    def whole(name, value, low):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")

    def positive(name, value, low_ok=False):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                value >= 0 if low_ok else value > 0):
            raise ValueError(f"{name} must be a number {'>=' if low_ok else '>'} 0, got "
                             f"{value!r}")

    whole("NUM_EXPERTS (num_experts)", cfg.num_experts, 0)
    whole("MOE_EVERY (moe_every)", cfg.moe_every, 1)
    whole("MOE_FIRST (moe_first)", cfg.moe_first, 0)
    whole("MOE_TOP_K (moe_top_k)", cfg.moe_top_k, 1)
    if cfg.moe_group_size != SEQUENCE_GROUPS:
        try:
            whole("MOE_GROUP_SIZE (moe_group_size)", cfg.moe_group_size, 1)
        except ValueError as e:
            raise ValueError(f"{e} (or '{SEQUENCE_GROUPS}': each sequence its own group)") \
                from None
    if cfg.expert_capacity is not None:
        whole("EXPERT_CAPACITY (expert_capacity)", cfg.expert_capacity, 1)
    positive("CAPACITY_FACTOR (capacity_factor)", cfg.capacity_factor)
    positive("EVAL_CAPACITY_FACTOR (eval_capacity_factor)", cfg.eval_capacity_factor)
    positive("ROUTER_AUX_LOSS (router_aux_loss)", cfg.router_aux_loss, low_ok=True)
    positive("ROUTER_Z_LOSS (router_z_loss)", cfg.router_z_loss, low_ok=True)
    rate = cfg.expert_dropout_rate
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                             or not 0 <= rate < 1):
        raise ValueError(f"EXPERT_DROPOUT_RATE (expert_dropout_rate) must be None or a number "
                         f">= 0 and < 1, got {rate!r}")
    if cfg.expert_mlp not in EXPERT_MLPS:
        raise ValueError(f"EXPERT_MLP (expert_mlp) must be one of {', '.join(EXPERT_MLPS)}; "
                         f"got {cfg.expert_mlp!r}")
    if cfg.routing not in ROUTINGS:
        raise ValueError(f"ROUTING (routing) must be one of {', '.join(ROUTINGS)}; got "
                         f"{cfg.routing!r}")
    if cfg.capacity_rule not in CAPACITY_RULES:
        raise ValueError(f"CAPACITY_RULE (capacity_rule) must be one of "
                         f"{', '.join(CAPACITY_RULES)}; got {cfg.capacity_rule!r}")
    if not isinstance(cfg.batch_prioritized_routing, bool):
        raise ValueError(f"BATCH_PRIORITIZED_ROUTING (batch_prioritized_routing) must be "
                         f"True or False, got {cfg.batch_prioritized_routing!r}")
    if cfg.batch_prioritized_routing and not hasattr(cfg, "num_encoder_layers"):
        raise ValueError("BATCH_PRIORITIZED_ROUTING=True ranks a group's tokens by the "
                         "router's confidence, so a decoder's token would take a slot by "
                         "looking at later tokens: it is for an encoder only (T5's); set it "
                         "False")
    if not cfg.num_experts:
        return
    if cfg.moe_top_k > cfg.num_experts:
        raise ValueError(f"MOE_TOP_K={cfg.moe_top_k} exceeds NUM_EXPERTS={cfg.num_experts}: "
                         f"a token chooses among the experts there are")
    if cfg.lora_rank:
        raise ValueError("LoRA (LORA_RANK > 0) does not adapt mixture-of-experts models yet: "
                         "set LORA_RANK=0, or NUM_EXPERTS=0 for a dense model")
    if cfg.fp8 and cfg.fp8_backend == "te":
        raise ValueError("FP8_BACKEND='te' does not run mixture-of-experts layers: use "
                         "FP8_BACKEND='native' (the experts then run in ACTIVATION_DTYPE)")
    stacks = [getattr(cfg, n) for n in ("num_layers", "num_encoder_layers",
                                        "num_decoder_layers") if hasattr(cfg, n)]
    stacked = cfg.scan_layers or getattr(cfg, "pipeline_microbatches", None)
    if stacked and (cfg.moe_first >= cfg.moe_every or any(n % cfg.moe_every for n in stacks)):
        how = "SCAN_LAYERS=True" if cfg.scan_layers else "a pipeline (PIPELINE_MICROBATCHES)"
        raise ValueError(f"{how} repeats a block of MOE_EVERY={cfg.moe_every} "
                         f"layers, which must divide the stack's {stacks} layers and hold "
                         f"the first sparse one (MOE_FIRST={cfg.moe_first}): use "
                         f"SCAN_LAYERS=False, or a MOE_EVERY / MOE_FIRST that do")
