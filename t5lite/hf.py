"""Hugging Face interop: load a local HF model directory into t5lite, save one back.

    model, variables = load_pretrained("/models/t5-v1_1-small", dtype="float32")
    save_pretrained(model, variables, "/tmp/out")   # transformers can load /tmp/out

What loads: `config.json` plus safetensors weights (`model.safetensors`, or the shards
listed in `model.safetensors.index.json`, or else every `*.safetensors` file) for
`model_type` "t5" (T5 v1.1 and the original T5) and "llama". Pickle files
(`pytorch_model.bin`, `*.pt`, ...) are never opened: unpickling runs arbitrary code.

Weights arrive as float32 host (numpy) arrays in the unfused, unscanned t5lite layout
(the tree documented in `t5lite.models.configs`); `config_overrides` such as
`fuse_qkv=True` or `scan_layers=True` convert them with `t5lite.models.layouts`.

Output logits follow the installed transformers (5.x) semantics:

- T5: the decoder output is multiplied by d_model**-0.5 iff `scale_decoder_outputs`
  (when config.json lacks it: iff `tie_word_embeddings` is not false). The output
  projection is the shared embedding unless the file holds an `lm_head.weight` that
  differs from it. Scaled + tied -> `logits_via_embedding=True`; unscaled -> a separate
  `logits_dense` kernel (the lm_head, or a copy of the embedding); scaled with a distinct
  lm_head -> `logits_dense` with the scale folded into the kernel.
- LLaMA: `tie_word_embeddings` and no distinct `lm_head.weight` -> `tie_embeddings=True`.

The config.json <-> t5lite config mapping lives in `t5lite.hf_config`; `read_hf_config`
and `config_from_hf` are re-exported here.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so bf16 files load)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from t5lite.hf_config import (  # noqa: F401  (read_hf_config, config_from_hf: public API)
    CONFIG_NAME, SUPPORTED_MODEL_TYPES, PathLike, config_from_hf, llama_hf_config,
    read_hf_config, t5_hf_config, t5_scales_output)
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.model import DecoderOnlyModel, EncoderDecoderModel

Model = Union[EncoderDecoderModel, DecoderOnlyModel]
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Fields an override may change without touching the parameter layout.
LAYOUT_FIELDS = ("fuse_qkv", "scan_layers")


# --------------------------------------------------------------------------- files


def _weight_files(path: Path) -> List[Path]:
    """The safetensors files of a model directory; refuses pickle-only directories."""
    index = path / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' object")
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shard(s) that do not exist: {missing}")
        return files
    if (path / WEIGHTS_NAME).is_file():
        return [path / WEIGHTS_NAME]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{path} holds only pickle weight files ({', '.join(pickles)}); t5lite refuses to "
            "unpickle them (loading a pickle can run arbitrary code). Convert them to "
            "safetensors first, in an environment you trust, e.g. "
            "`AutoModelForSeq2SeqLM.from_pretrained(dir).save_pretrained(out_dir, "
            "safe_serialization=True)` (AutoModelForCausalLM for LLaMA), then load out_dir.")
    raise FileNotFoundError(f"{path}: no {WEIGHTS_NAME}, {INDEX_NAME} or *.safetensors file")


def read_safetensors(path: PathLike) -> Dict[str, np.ndarray]:
    """Every tensor of a model directory's safetensors file(s), as float32 numpy arrays."""
    tensors: Dict[str, np.ndarray] = {}
    for file in _weight_files(Path(path)):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                if name in tensors:
                    raise ValueError(f"tensor {name!r} is in more than one shard ({file.name})")
                tensors[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
    return tensors


# --------------------------------------------------------------------------- weight maps
#
# One table per family: (HF tensor name, t5lite path "a/b/c", kind). `kind` says how a
# torch tensor maps onto our array; shapes follow from our (abstract) parameter shapes.
#   copy        same array (embeddings, norm scales, biases of [embed]/[mlp])
#   transpose   torch Linear [out, in] <-> our [in, out]; T5 relpos [buckets, heads]
#   in_heads    torch [heads*kv, embed]  <-> our [embed, heads, kv]   (q, k, v kernels)
#   heads_out   torch [embed, heads*kv]  <-> our [heads, kv, embed]   (out kernel)
#   bias_heads  torch [heads*kv]         <-> our [heads, kv]          (q, k, v biases)

Entry = Tuple[str, str, str]


def _hf_shape(kind: str, shape: Tuple[int, ...]) -> Tuple[int, ...]:
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
    raise AssertionError(kind)


def _to_ours(kind: str, a: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
    if kind in ("transpose", "in_heads", "heads_out"):
        a = a.T
    return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)


def _to_hf(kind: str, a: np.ndarray) -> np.ndarray:
    shape = _hf_shape(kind, a.shape)
    if kind in ("transpose", "in_heads", "heads_out"):
        a = a.reshape(shape[::-1]).T
    return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)


def _t5_entries(cfg: T5Config) -> List[Entry]:
    entries: List[Entry] = []
    mlp_names = ("wi",) if len(cfg.mlp_activations) == 1 else tuple(
        f"wi_{i}" for i in range(len(cfg.mlp_activations)))

    def attention(hf: str, ours: str) -> None:
        for a, b in (("q", "query"), ("k", "key"), ("v", "value")):
            entries.append((f"{hf}.{a}.weight", f"{ours}/{b}/kernel", "in_heads"))
        entries.append((f"{hf}.o.weight", f"{ours}/out/kernel", "heads_out"))

    def mlp(hf: str, ours: str) -> None:
        for n in mlp_names + ("wo",):
            entries.append((f"{hf}.DenseReluDense.{n}.weight", f"{ours}/mlp/{n}/kernel",
                            "transpose"))

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
                mlp(f"{hf}.1", ours)
            else:
                norm(f"{hf}.0.layer_norm", f"{ours}/pre_self_attention_layer_norm")
                attention(f"{hf}.0.SelfAttention", f"{ours}/self_attention")
                norm(f"{hf}.1.layer_norm", f"{ours}/pre_cross_attention_layer_norm")
                attention(f"{hf}.1.EncDecAttention", f"{ours}/encoder_decoder_attention")
                norm(f"{hf}.2.layer_norm", f"{ours}/pre_mlp_layer_norm")
                mlp(f"{hf}.2", ours)
        norm(f"{stack}.final_layer_norm", f"{stack}/{stack}_norm")
    return entries


def _llama_entries(cfg: DecoderConfig) -> List[Entry]:
    entries: List[Entry] = []
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}", f"decoder/layers_{i}"
        entries.append((f"{hf}.input_layernorm.weight",
                        f"{ours}/pre_self_attention_layer_norm/scale", "copy"))
        for a, b in (("q", "query"), ("k", "key"), ("v", "value")):
            entries.append((f"{hf}.self_attn.{a}_proj.weight",
                            f"{ours}/self_attention/{b}/kernel", "in_heads"))
            if cfg.use_bias:
                entries.append((f"{hf}.self_attn.{a}_proj.bias",
                                f"{ours}/self_attention/{b}/bias", "bias_heads"))
        entries.append((f"{hf}.self_attn.o_proj.weight", f"{ours}/self_attention/out/kernel",
                        "heads_out"))
        if cfg.use_bias:
            entries.append((f"{hf}.self_attn.o_proj.bias", f"{ours}/self_attention/out/bias",
                            "copy"))
        entries.append((f"{hf}.post_attention_layernorm.weight",
                        f"{ours}/pre_mlp_layer_norm/scale", "copy"))
        for a, b in (("gate", "wi_0"), ("up", "wi_1"), ("down", "wo")):
            entries.append((f"{hf}.mlp.{a}_proj.weight", f"{ours}/mlp/{b}/kernel", "transpose"))
            if cfg.use_bias:
                entries.append((f"{hf}.mlp.{a}_proj.bias", f"{ours}/mlp/{b}/bias", "copy"))
    entries.append(("model.norm.weight", "decoder/decoder_norm/scale", "copy"))
    return entries


# Tensors transformers writes or accepts that carry nothing t5lite needs.
_IGNORED = re.compile(
    r"^(encoder\.embed_tokens\.weight|decoder\.embed_tokens\.weight"
    r"|decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"
    r"|model\.rotary_emb\.inv_freq|model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)$")


# --------------------------------------------------------------------------- trees


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _unflatten(flat: Mapping[str, Any]) -> Dict[str, Any]:
    tree: Dict[str, Any] = {}
    for path, v in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


def _make_model(cfg) -> Model:
    return EncoderDecoderModel(cfg) if isinstance(cfg, T5Config) else DecoderOnlyModel(cfg)


def _abstract_shapes(cfg) -> Dict[str, Tuple[int, ...]]:
    """path -> shape of every parameter of `cfg`'s model (nothing is allocated)."""
    abstract = _make_model(cfg).abstract_variables()["params"]
    return {k: tuple(v.shape) for k, v in _flatten(abstract).items()}


def _on_host(fn: Callable, *args):
    """Run a jax computation on the CPU device and return numpy leaves."""
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        out = fn(*args)
    return jax.tree.map(np.asarray, out)


# --------------------------------------------------------------------------- load


def _decide_output_head(cfg, hf: Mapping[str, Any], tensors: Dict[str, np.ndarray],
                        embed_name: str) -> Tuple[Any, Optional[np.ndarray]]:
    """Returns (cfg with the tying field set, logits_dense kernel [embed, vocab] or None)."""
    embedding = tensors[embed_name]
    lm_head = tensors.get("lm_head.weight")
    tied = lm_head is None or (lm_head.shape == embedding.shape
                               and np.array_equal(lm_head, embedding))
    if isinstance(cfg, T5Config):
        if t5_scales_output(hf):
            if tied:
                return dataclasses.replace(cfg, logits_via_embedding=True), None
            # transformers 5.x unties a distinct lm_head and still scales: fold the scale.
            return cfg, lm_head.T * np.float32(cfg.emb_dim ** -0.5)
        return cfg, (embedding if tied else lm_head).T
    if hf.get("tie_word_embeddings", False) and tied:
        return dataclasses.replace(cfg, tie_embeddings=True), None
    if lm_head is None:
        raise ValueError("lm_head.weight is missing and tie_word_embeddings is false")
    return dataclasses.replace(cfg, tie_embeddings=False), lm_head.T


def _apply_overrides(cfg, overrides: Mapping[str, Any]):
    names = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown config override(s) {unknown} for {type(cfg).__name__}")
    return dataclasses.replace(cfg, **overrides)


def load_pretrained(path: PathLike, **config_overrides) -> Tuple[Model, Dict[str, Any]]:
    """Load a local HF model directory: returns (model, variables) with variables =
    {"params": tree of float32 numpy arrays} in the layout of the final config.

    `config_overrides` replace fields of the derived config (e.g. dtype="float32",
    fuse_qkv=True, scan_layers=True, remat_policy="full"); an override that changes a
    parameter shape is refused. Raises FileNotFoundError for a missing directory or file
    and ValueError for pickle-only directories and unsupported configs or weights."""
    path = Path(path)
    hf = read_hf_config(path)
    cfg = config_from_hf(hf)
    _weight_files(path)  # refuse pickle-only / empty dirs before anything else
    tensors = read_safetensors(path)

    if isinstance(cfg, T5Config):
        embed_name = next((n for n in ("shared.weight", "encoder.embed_tokens.weight",
                                       "decoder.embed_tokens.weight") if n in tensors),
                          "shared.weight")
        entries = _t5_entries(cfg)
    else:
        embed_name = "model.embed_tokens.weight"
        entries = None
    if embed_name not in tensors:
        raise ValueError(f"{path}: the token embedding {embed_name!r} is missing")
    cfg, logits_kernel = _decide_output_head(cfg, hf, tensors, embed_name)
    cfg = _apply_overrides(cfg, config_overrides)
    load_cfg = dataclasses.replace(cfg, **{f: False for f in LAYOUT_FIELDS}, fp8=False)
    if entries is None:
        entries = _llama_entries(load_cfg)
    # Biases of a group the file does not have (LLaMA attention_bias != mlp_bias) are 0.
    zero_groups = tuple(g for g, flag in (("self_attn.", "attention_bias"), ("mlp.", "mlp_bias"))
                        if isinstance(cfg, DecoderConfig) and cfg.use_bias and not hf.get(flag))

    shapes = _abstract_shapes(load_cfg)
    flat: Dict[str, np.ndarray] = {}
    used = {embed_name, "lm_head.weight"}
    missing = []
    for hf_name, ours, kind in entries:
        if ours not in shapes:
            raise ValueError(f"config override(s) {sorted(config_overrides)} change the "
                             f"architecture: {ours} is not a parameter of the result")
        want = _hf_shape(kind, shapes[ours])
        if hf_name not in tensors:
            if hf_name.endswith(".bias") and any(g in hf_name for g in zero_groups):
                flat[ours] = np.zeros(shapes[ours], np.float32)
                continue
            missing.append(hf_name)
            continue
        got = tensors[hf_name].shape
        if tuple(got) != want:
            raise ValueError(f"{hf_name}: shape {tuple(got)} in the checkpoint, but the config "
                             f"gives {want}")
        flat[ours] = _to_ours(kind, tensors[hf_name], shapes[ours])
        used.add(hf_name)
    if missing:
        raise ValueError(f"{path}: {len(missing)} tensor(s) missing from the checkpoint, e.g. "
                         f"{missing[:3]}")
    unexpected = sorted(n for n in tensors if n not in used and not _IGNORED.match(n))
    if unexpected:
        raise ValueError(f"{path}: {len(unexpected)} tensor(s) t5lite does not know how to "
                         f"place (unsupported feature?), e.g. {unexpected[:3]}")
    flat["token_embedder/embedding"] = np.ascontiguousarray(tensors[embed_name])
    if logits_kernel is not None:
        key = "decoder/logits_dense/kernel" if isinstance(cfg, T5Config) else "logits_dense/kernel"
        flat[key] = np.ascontiguousarray(logits_kernel, dtype=np.float32)
    for name, shape in shapes.items():
        if name not in flat:
            raise ValueError(f"{name}: no tensor in the checkpoint fills it (config override?)")
        if flat[name].shape != shape:
            raise ValueError(f"{name}: shape {flat[name].shape} from the checkpoint, but the "
                             f"config gives {shape} (config override?)")
    variables = {"params": _unflatten(flat)}

    if cfg.fuse_qkv or cfg.scan_layers:
        from t5lite.models import layouts
        variables = _on_host(layouts.convert_params, variables, load_cfg, cfg)
    model = _make_model(cfg)
    if cfg.fp8:  # FP8 statistics are not in HF files: start them fresh
        import jax

        def fresh():
            v = model.init(jax.random.PRNGKey(0))
            return {k: x for k, x in v.items() if k != "params"}

        variables.update(_on_host(jax.jit(fresh)))
    return model, variables


# --------------------------------------------------------------------------- save


def to_hf_state_dict(model: Model, variables: Mapping[str, Any]
                     ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(HF config dict, HF state dict of float32 numpy arrays) for a t5lite model."""
    cfg = model.config
    tree = variables["params"] if "params" in variables else variables
    base = dataclasses.replace(cfg, **{f: False for f in LAYOUT_FIELDS})
    if cfg.fuse_qkv or cfg.scan_layers:
        from t5lite.models import layouts
        tree = _on_host(layouts.convert_params, {"params": tree}, cfg, base)["params"]
    flat = {k: np.asarray(v, dtype=np.float32) for k, v in _flatten(tree).items()}
    if isinstance(cfg, T5Config):
        hf_cfg, entries = t5_hf_config(cfg), _t5_entries(cfg)
        embed_name, head_key = "shared.weight", "decoder/logits_dense/kernel"
        has_head = not cfg.logits_via_embedding
    elif isinstance(cfg, DecoderConfig):
        hf_cfg, entries = llama_hf_config(cfg), _llama_entries(cfg)
        embed_name, head_key = "model.embed_tokens.weight", "logits_dense/kernel"
        has_head = not cfg.tie_embeddings
    else:
        raise ValueError(f"save_pretrained: unsupported config type {type(cfg).__name__}")
    state: Dict[str, np.ndarray] = {}
    wanted = [(embed_name, "token_embedder/embedding", "copy")] + entries
    if has_head:
        wanted.append(("lm_head.weight", head_key, "transpose"))
    missing = [ours for _, ours, _ in wanted if ours not in flat]
    if missing:
        raise ValueError(f"save_pretrained: parameters missing for this config, e.g. {missing[:3]}")
    for hf_name, ours, kind in wanted:
        state[hf_name] = _to_hf(kind, flat[ours])
    extra = sorted(set(flat) - {ours for _, ours, _ in wanted})
    if extra:
        raise ValueError(f"save_pretrained: parameters with no HF name, e.g. {extra[:3]}")
    return hf_cfg, state


def save_pretrained(model: Model, variables: Mapping[str, Any], path: PathLike) -> Path:
    """Write config.json + model.safetensors (float32) that transformers'
    T5ForConditionalGeneration / LlamaForCausalLM `.from_pretrained(path)` loads.
    Fused or scanned parameters are converted back to the unfused, unscanned layout."""
    hf_cfg, state = to_hf_state_dict(model, variables)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # A stale sharded checkpoint would take precedence over the file written here.
    index = path / INDEX_NAME
    if index.is_file():
        for shard in set(json.loads(index.read_text()).get("weight_map", {}).values()):
            if Path(shard).name == shard and shard.endswith(".safetensors"):
                (path / shard).unlink(missing_ok=True)
        index.unlink()
    save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
    (path / CONFIG_NAME).write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
    return path
