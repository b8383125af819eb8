"""How each model family's parameters map onto a Hugging Face `model_type`: weight tables,
the output-head decision, and the config.json of a saved model. `FAMILIES` is keyed by
model_type (`family_of`: the one a t5lite config is written as), so loading and saving
(t5lite.interop.hf) never branch on the family.

Output logits follow the installed transformers (5.x) semantics:

- T5: the decoder output is multiplied by d_model**-0.5 iff `scale_decoder_outputs`
  (when config.json lacks it: iff `tie_word_embeddings` is not false). The output
  projection is the shared embedding unless the file holds an `lm_head.weight` that
  differs from it. Scaled + tied -> `logits_via_embedding=True`; unscaled -> a separate
  `logits_dense` kernel (the lm_head, or a copy of the embedding); scaled with a distinct
  lm_head -> `logits_dense` with the scale folded into the kernel.
- LLaMA: `tie_word_embeddings` and no distinct `lm_head.weight` -> `tie_embeddings=True`.
- Mistral, Qwen2, Qwen3: as LLaMA, one weight table (Qwen2's query / key / value biases,
  Qwen3's `self_attn.q_norm` / `k_norm` where the config has them); a decoder-only config
  maps onto the model_type `hf_decoder_config.decoder_model_type` names.
- Mixtral: as LLaMA. A decoder-only config with experts (`num_experts` > 0) maps onto
  "mixtral". Its expert tensors come in two layouts, both read:
  transformers 5's stacked `mlp.experts.gate_up_proj` [expert, 2 * inter, hidden] (the
  gate, w1, first; then the up projection, w3) and `mlp.experts.down_proj`
  [expert, hidden, inter], and transformers 4's (which transformers 5 still writes by
  default) `block_sparse_moe.experts.{j}.w1/w3/w2.weight` and `block_sparse_moe.gate`.
  `Family.read_layout` turns either into the split names the weight table uses;
  `Family.write_layout` writes transformers 5's.
- Switch Transformers: as T5 (a T5Config with experts maps onto "switch_transformers"),
  the MLPs named `mlp`, a sparse layer's `mlp.router.classifier` and
  `mlp.experts.expert_{e}.wi/wo`, stacked on reading and split on writing
  (`t5lite.interop.hf_switch`).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from t5lite.interop import hf_switch
from t5lite.interop.hf_config import t5_hf_config, t5_scales_output
from t5lite.interop.hf_decoder_config import decoder_hf_config, decoder_model_type

# --------------------------------------------------------------------------- weight maps
#
# One table per family: (HF tensor name, t5lite path "a/b/c", kind). `kind` says how a
# torch tensor maps onto our array; shapes follow from our (abstract) parameter shapes.
#   copy        same array (embeddings, norm scales, biases of [embed]/[mlp])
#   transpose   torch Linear [out, in] <-> our [in, out]; T5 relpos [buckets, heads]
#   in_heads    torch [heads*kv, embed]  <-> our [embed, heads, kv]   (q, k, v kernels)
#   heads_out   torch [embed, heads*kv]  <-> our [heads, kv, embed]   (out kernel)
#   bias_heads  torch [heads*kv]         <-> our [heads, kv]          (q, k, v biases)
#   experts     torch [expert, out, in]  <-> our [expert, in, out]    (MoE expert kernels)

Entry = Tuple[str, str, str]


def hf_shape(kind: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    if kind == "copy":
        return shape
    if kind == "transpose":
        return shape[::-1]
    if kind == "in_heads":
        return (shape[1] * shape[2], shape[0])
    if kind == "heads_out":
        return (shape[2], shape[0] * shape[1])
    if kind == "bias_heads":
        return (shape[0] * shape[1],)
    if kind == "experts":
        return (shape[0], shape[2], shape[1])
    raise AssertionError(kind)


def to_ours(kind: str, a: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
    if kind in ("transpose", "in_heads", "heads_out"):
        a = a.T
    elif kind == "experts":
        a = np.swapaxes(a, 1, 2)
    return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)


def to_hf(kind: str, a: np.ndarray) -> np.ndarray:
    shape = hf_shape(kind, a.shape)
    if kind in ("transpose", "in_heads", "heads_out"):
        a = a.reshape(shape[::-1]).T
    elif kind == "experts":
        a = np.swapaxes(a, 1, 2)
    return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)


def _t5_entries(cfg, switch: bool = False) -> List[Entry]:
    """T5's weight table; `switch`: Switch Transformers' (an MLP is `mlp`, not
    `DenseReluDense`; a sparse layer's is a router and experts, `hf_switch.STACKED`)."""
    entries: List[Entry] = []
    mlp_names = ("wi",) if len(cfg.mlp_activations) == 1 else tuple(
        f"wi_{i}" for i in range(len(cfg.mlp_activations)))

    def attention(hf: str, ours: str) -> None:
        for a, b in (("q", "query"), ("k", "key"), ("v", "value")):
            entries.append((f"{hf}.{a}.weight", f"{ours}/{b}/kernel", "in_heads"))
        entries.append((f"{hf}.o.weight", f"{ours}/out/kernel", "heads_out"))

    def mlp(hf: str, ours: str, i: int) -> None:
        if switch and cfg.is_moe_layer(i):
            entries.append((f"{hf}.mlp.router.classifier.weight", f"{ours}/mlp/router/kernel",
                            "transpose"))
            entries.extend((f"{hf}.mlp.experts.{hf_switch.STACKED}.{n}", f"{ours}/mlp/{n}/kernel",
                            "experts") for n in ("wi", "wo"))
            return
        for n in mlp_names + ("wo",):
            entries.append((f"{hf}.{'mlp' if switch else 'DenseReluDense'}.{n}.weight",
                            f"{ours}/mlp/{n}/kernel", "transpose"))

    def norm(hf: str, ours: str) -> None:
        entries.append((f"{hf}.weight", f"{ours}/scale", "copy"))

    for stack, n_layers in (("encoder", cfg.num_encoder_layers),
                            ("decoder", cfg.num_decoder_layers)):
        entries.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                        f"{stack}/relpos_bias/rel_embedding", "transpose"))
        for i in range(n_layers):
            hf, ours = f"{stack}.block.{i}.layer", f"{stack}/layers_{i}"
            if stack == "encoder":
                norm(f"{hf}.0.layer_norm", f"{ours}/pre_attention_layer_norm")
                attention(f"{hf}.0.SelfAttention", f"{ours}/attention")
                norm(f"{hf}.1.layer_norm", f"{ours}/pre_mlp_layer_norm")
                mlp(f"{hf}.1", ours, i)
            else:
                norm(f"{hf}.0.layer_norm", f"{ours}/pre_self_attention_layer_norm")
                attention(f"{hf}.0.SelfAttention", f"{ours}/self_attention")
                norm(f"{hf}.1.layer_norm", f"{ours}/pre_cross_attention_layer_norm")
                attention(f"{hf}.1.EncDecAttention", f"{ours}/encoder_decoder_attention")
                norm(f"{hf}.2.layer_norm", f"{ours}/pre_mlp_layer_norm")
                mlp(f"{hf}.2", ours, i)
        norm(f"{stack}.final_layer_norm", f"{stack}/{stack}_norm")
    return entries


def _llama_entries(cfg) -> List[Entry]:
    entries: List[Entry] = []
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}", f"decoder/layers_{i}"
        entries.append((f"{hf}.input_layernorm.weight",
                        f"{ours}/pre_self_attention_layer_norm/scale", "copy"))
        for a, b in (("q", "query"), ("k", "key"), ("v", "value")):
            entries.append((f"{hf}.self_attn.{a}_proj.weight",
                            f"{ours}/self_attention/{b}/kernel", "in_heads"))
            if cfg.use_bias or cfg.qkv_bias:
                entries.append((f"{hf}.self_attn.{a}_proj.bias",
                                f"{ours}/self_attention/{b}/bias", "bias_heads"))
        if cfg.qk_norm:  # Qwen3
            entries += [(f"{hf}.self_attn.{a}_norm.weight",
                         f"{ours}/self_attention/{b}_norm/scale", "copy")
                        for a, b in (("q", "query"), ("k", "key"))]
        entries.append((f"{hf}.self_attn.o_proj.weight", f"{ours}/self_attention/out/kernel",
                        "heads_out"))
        if cfg.use_bias:
            entries.append((f"{hf}.self_attn.o_proj.bias", f"{ours}/self_attention/out/bias",
                            "copy"))
        entries.append((f"{hf}.post_attention_layernorm.weight",
                        f"{ours}/pre_mlp_layer_norm/scale", "copy"))
        if cfg.is_moe_layer(i):
            entries += _moe_entries(hf, ours)
            continue
        for a, b in (("gate", "wi_0"), ("up", "wi_1"), ("down", "wo")):
            entries.append((f"{hf}.mlp.{a}_proj.weight", f"{ours}/mlp/{b}/kernel", "transpose"))
            if cfg.use_bias:
                entries.append((f"{hf}.mlp.{a}_proj.bias", f"{ours}/mlp/{b}/bias", "copy"))
    entries.append(("model.norm.weight", "decoder/decoder_norm/scale", "copy"))
    return entries


# ----------------------------------------------------------------------- Mixtral experts
#
# The weight table names the halves of transformers 5's gate_up_proj apart (GATE_HALF,
# UP_HALF: [expert, inter, hidden] each); read_layout / write_layout turn the file's
# tensors into these names and back.

GATE_HALF, UP_HALF = "gate_up_proj[gate half]", "gate_up_proj[up half]"
_V4_EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])"
                        r"\.weight$")


def _moe_entries(hf: str, ours: str) -> List[Entry]:
    experts = f"{hf}.mlp.experts"
    return [(f"{hf}.mlp.gate.weight", f"{ours}/mlp/router/kernel", "transpose"),
            (f"{experts}.{GATE_HALF}", f"{ours}/mlp/wi_0/kernel", "experts"),
            (f"{experts}.{UP_HALF}", f"{ours}/mlp/wi_1/kernel", "experts"),
            (f"{experts}.down_proj", f"{ours}/mlp/wo/kernel", "experts")]


def _v4_experts(tensors: Dict[str, np.ndarray]) -> Dict[int, Dict[Tuple[int, str], str]]:
    """layer -> {(expert, w1 | w2 | w3): tensor name} of the per-expert layout."""
    found: Dict[int, Dict[Tuple[int, str], str]] = {}
    for name in tensors:
        m = _V4_EXPERT.match(name)
        if m:
            found.setdefault(int(m.group(1)), {})[(int(m.group(2)), m.group(3))] = name
    return found


def _stack_v4(path, cfg, i: int, names: Dict[Tuple[int, str], str],
              tensors: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Layer i's w1, w3, w2 of every expert, stacked: [expert, inter, hidden] twice and
    [expert, hidden, inter]; one line when an expert (or one of its three) is amiss."""
    e, inter, hidden = cfg.num_experts, cfg.mlp_dim, cfg.emb_dim
    have = sorted({j for j, _ in names})
    if have != list(range(e)):
        missing = sorted(set(range(e)) - set(have))
        beyond = [j for j in have if j >= e]
        raise ValueError(
            f"{path}: model.layers.{i}.block_sparse_moe holds {len(have)} expert(s), but "
            f"config.json's num_local_experts is {e}"
            + (f"; expert(s) {missing[:4]} missing" if missing else "")
            + (f"; expert(s) {beyond[:4]} beyond it" if beyond else ""))
    out = []
    for w, want in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
        parts = []
        for j in range(e):
            name = f"model.layers.{i}.block_sparse_moe.experts.{j}.{w}.weight"
            if (j, w) not in names:
                raise ValueError(f"{path}: {name} is missing (expert {j} of layer {i} in the "
                                 f"per-expert layout needs w1, w2 and w3)")
            if tuple(tensors[name].shape) != want:
                raise ValueError(f"{name}: shape {tuple(tensors[name].shape)} in the "
                                 f"checkpoint, but the config gives {want}")
            parts.append(tensors.pop(name))
        out.append(np.stack(parts))
    return out[0], out[1], out[2]


def _stacked(path, name: str, tensors: Dict[str, np.ndarray],
             want: Tuple[int, ...]) -> np.ndarray:
    """A stacked expert tensor of transformers 5's layout, taken out of `tensors`."""
    if name not in tensors:
        raise ValueError(f"{path}: {name} is missing from the checkpoint")
    a = tensors.pop(name)
    if tuple(a.shape) != want:
        what = (f" ({a.shape[0]} experts, but config.json's num_local_experts is {want[0]})"
                if a.ndim and a.shape[0] != want[0] else "")
        raise ValueError(f"{name}: shape {tuple(a.shape)} in the checkpoint, but the config "
                         f"gives {want}{what}")
    return a


def _mixtral_read_layout(cfg, tensors: Dict[str, np.ndarray], path) -> Dict[str, np.ndarray]:
    """A Mixtral file's expert tensors, either layout, under the weight table's names."""
    tensors = dict(tensors)
    e, inter, hidden = cfg.num_experts, cfg.mlp_dim, cfg.emb_dim
    v4 = _v4_experts(tensors)
    for i in filter(cfg.is_moe_layer, range(cfg.num_layers)):
        hf = f"model.layers.{i}"
        old_router, router = f"{hf}.block_sparse_moe.gate.weight", f"{hf}.mlp.gate.weight"
        if old_router in tensors and router not in tensors:
            tensors[router] = tensors.pop(old_router)
        experts = f"{hf}.mlp.experts"
        if f"{experts}.gate_up_proj" in tensors or f"{experts}.down_proj" in tensors:
            gate_up = _stacked(path, f"{experts}.gate_up_proj", tensors,
                               (e, 2 * inter, hidden))
            down = _stacked(path, f"{experts}.down_proj", tensors, (e, hidden, inter))
            gate, up = gate_up[:, :inter], gate_up[:, inter:]
        elif i in v4:
            gate, up, down = _stack_v4(path, cfg, i, v4[i], tensors)
        else:
            raise ValueError(f"{path}: layer {i}'s experts are missing: neither "
                             f"{experts}.gate_up_proj nor {hf}.block_sparse_moe.experts.0."
                             f"w1.weight is in the checkpoint")
        tensors.update({f"{experts}.{GATE_HALF}": gate, f"{experts}.{UP_HALF}": up,
                        f"{experts}.down_proj": down})
    return tensors


def _mixtral_write_layout(cfg, state: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The weight table's split halves joined into transformers 5's gate_up_proj."""
    state = dict(state)
    for i in filter(cfg.is_moe_layer, range(cfg.num_layers)):
        experts = f"model.layers.{i}.mlp.experts"
        state[f"{experts}.gate_up_proj"] = np.concatenate(
            [state.pop(f"{experts}.{GATE_HALF}"), state.pop(f"{experts}.{UP_HALF}")], axis=1)
    return state


# Tensors transformers writes or accepts that carry nothing t5lite needs.
IGNORED = re.compile(
    r"^(encoder\.embed_tokens\.weight|decoder\.embed_tokens\.weight"
    r"|decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"
    r"|model\.rotary_emb\.inv_freq|model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)$")


def _t5_output_head(cfg, hf: Mapping[str, Any], embedding: np.ndarray,
                    lm_head: Optional[np.ndarray], tied: bool):
    if t5_scales_output(hf):
        if tied:
            return dataclasses.replace(cfg, logits_via_embedding=True), None
        # transformers 5.x unties a distinct lm_head and still scales: fold the scale.
        return cfg, lm_head.T * np.float32(cfg.emb_dim ** -0.5)
    return cfg, (embedding if tied else lm_head).T


def _llama_output_head(cfg, hf: Mapping[str, Any], embedding: np.ndarray,
                       lm_head: Optional[np.ndarray], tied: bool):
    if hf.get("tie_word_embeddings", False) and tied:
        return dataclasses.replace(cfg, tie_embeddings=True), None
    if lm_head is None:
        raise ValueError("lm_head.weight is missing and tie_word_embeddings is false")
    return dataclasses.replace(cfg, tie_embeddings=False), lm_head.T


def _llama_zero_bias_groups(cfg, hf: Mapping[str, Any]) -> Tuple[str, ...]:
    """Biases of a group the file does not have (attention_bias != mlp_bias) are 0."""
    if not cfg.use_bias:
        return ()
    return tuple(g for g, flag in (("self_attn.", "attention_bias"), ("mlp.", "mlp_bias"))
                 if not hf.get(flag))


@dataclasses.dataclass(frozen=True)
class Family:
    """One family's mapping onto an HF model_type."""

    model_type: str
    embed_names: Tuple[str, ...]  # HF names of the token embedding; the first present wins
    head_key: str                 # our path of an untied output kernel [embed, vocab]
    entries: Callable[[Any], List[Entry]]
    output_head: Callable         # (cfg, hf, embedding, lm_head, tied) -> (cfg, kernel)
    has_head: Callable[[Any], bool]
    hf_config: Callable[[Any], Dict[str, Any]]
    zero_bias_groups: Callable[[Any, Mapping[str, Any]], Tuple[str, ...]] = \
        lambda cfg, hf: ()
    # (cfg, the file's tensors, path) -> the tensors under the weight table's names, and
    # (cfg, state under those names) -> the file's tensors
    read_layout: Callable = lambda cfg, tensors, path: tensors
    write_layout: Callable = lambda cfg, state: state

    def decide_output_head(self, cfg, hf: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                           embed_name: str):
        """(cfg with the tying field set, logits_dense kernel [embed, vocab] or None)."""
        embedding = tensors[embed_name]
        lm_head = tensors.get("lm_head.weight")
        tied = lm_head is None or (lm_head.shape == embedding.shape
                                   and np.array_equal(lm_head, embedding))
        return self.output_head(cfg, hf, embedding, lm_head, tied)


def _decoder_family(model_type: str, **layout) -> Family:
    """LLaMA and its kin: one weight table (the config says which tensors there are)."""
    return Family(model_type, ("model.embed_tokens.weight",), "logits_dense/kernel",
                  _llama_entries, _llama_output_head, lambda cfg: not cfg.tie_embeddings,
                  decoder_hf_config, _llama_zero_bias_groups, **layout)


FAMILIES: Dict[str, Family] = {
    "t5": Family("t5", ("shared.weight", "encoder.embed_tokens.weight",
                        "decoder.embed_tokens.weight"),
                 "decoder/logits_dense/kernel", _t5_entries, _t5_output_head,
                 lambda cfg: not cfg.logits_via_embedding, t5_hf_config),
    **{kind: _decoder_family(kind) for kind in ("llama", "mistral", "qwen2", "qwen3")},
    "mixtral": _decoder_family("mixtral", read_layout=_mixtral_read_layout,
                               write_layout=_mixtral_write_layout),
    "switch_transformers": Family(
        "switch_transformers", ("shared.weight", "encoder.embed_tokens.weight",
                                "decoder.embed_tokens.weight"),
        "decoder/logits_dense/kernel", lambda cfg: _t5_entries(cfg, switch=True),
        _t5_output_head, lambda cfg: not cfg.logits_via_embedding,
        lambda cfg: hf_switch.switch_hf_config(cfg, t5_hf_config),
        read_layout=hf_switch.read_layout, write_layout=hf_switch.write_layout),
}


def family_of(cfg) -> Family:
    """The HF mapping of a t5lite config (`cfg.HF_MODEL_TYPE`: "t5", with experts
    "switch_transformers"; "llama": the decoder kin `decoder_model_type` names)."""
    kind = getattr(cfg, "HF_MODEL_TYPE", None)
    if kind == "llama":
        kind = decoder_model_type(cfg)
    elif kind == "t5" and getattr(cfg, "num_experts", 0):
        kind = "switch_transformers"
    if kind not in FAMILIES:
        raise ValueError(f"no Hugging Face mapping for config type {type(cfg).__name__}")
    return FAMILIES[kind]
