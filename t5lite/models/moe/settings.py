"""The mixture-of-experts settings' values and their one-line checks (`MoeSettings` in
`t5lite.models.configs` holds them; this module needs only the config's attributes)."""
from __future__ import annotations

EXPERT_MLPS = {"relu": ("relu",), "gelu": ("gelu",), "gelu_exact": ("gelu_exact",),
               "swiglu": ("silu", "linear"), "geglu": ("gelu", "linear")}
ROUTINGS = ("capacity", "dropless")


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
    whole("MOE_TOP_K (moe_top_k)", cfg.moe_top_k, 1)
    whole("MOE_GROUP_SIZE (moe_group_size)", cfg.moe_group_size, 1)
    positive("CAPACITY_FACTOR (capacity_factor)", cfg.capacity_factor)
    positive("EVAL_CAPACITY_FACTOR (eval_capacity_factor)", cfg.eval_capacity_factor)
    positive("ROUTER_AUX_LOSS (router_aux_loss)", cfg.router_aux_loss, low_ok=True)
    positive("ROUTER_Z_LOSS (router_z_loss)", cfg.router_z_loss, low_ok=True)
    if cfg.expert_mlp not in EXPERT_MLPS:
        raise ValueError(f"EXPERT_MLP (expert_mlp) must be one of {', '.join(EXPERT_MLPS)}; "
                         f"got {cfg.expert_mlp!r}")
    if cfg.routing not in ROUTINGS:
        raise ValueError(f"ROUTING (routing) must be one of {', '.join(ROUTINGS)}; got "
                         f"{cfg.routing!r}")
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
    if cfg.scan_layers and cfg.moe_every != 1:
        raise ValueError(f"SCAN_LAYERS=True scans identical layers, and MOE_EVERY="
                         f"{cfg.moe_every} alternates dense and sparse ones: use "
                         f"SCAN_LAYERS=False (or MOE_EVERY=1)")
