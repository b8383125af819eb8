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

How each family's tensors map (and how the output head is decided) lives in
`t5lite.interop.hf_families`; the config.json <-> t5lite config mapping in
`t5lite.interop.hf_config` (`read_hf_config` and `config_from_hf` are re-exported here).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Tuple

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so bf16 files load)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from t5lite.interop.hf_config import (  # noqa: F401  (read_hf_config, config_from_hf: public API)
    CONFIG_NAME, SUPPORTED_MODEL_TYPES, PathLike, config_from_hf, read_hf_config)
from t5lite.interop.hf_families import IGNORED, family_of, hf_shape, to_hf, to_ours
from t5lite.models.model import BaseModel, model_for_config
from t5lite.models.param_paths import flatten, unflatten

Model = BaseModel
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


# --------------------------------------------------------------------------- trees


def _abstract_shapes(cfg) -> Dict[str, Tuple[int, ...]]:
    """path -> shape of every parameter of `cfg`'s model (nothing is allocated)."""
    abstract = model_for_config(cfg).abstract_variables()["params"]
    return {k: tuple(v.shape) for k, v in flatten(abstract).items()}


def _on_host(fn: Callable, *args):
    """Run a jax computation on the CPU device and return numpy leaves."""
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        out = fn(*args)
    return jax.tree.map(np.asarray, out)


# --------------------------------------------------------------------------- load


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

    family = family_of(cfg)
    embed_name = next((n for n in family.embed_names if n in tensors), family.embed_names[0])
    if embed_name not in tensors:
        raise ValueError(f"{path}: the token embedding {embed_name!r} is missing")
    entries = family.entries(cfg)
    zero_groups = family.zero_bias_groups(cfg, hf)
    cfg, logits_kernel = family.decide_output_head(cfg, hf, tensors, embed_name)
    cfg = _apply_overrides(cfg, config_overrides)
    load_cfg = dataclasses.replace(cfg, **{f: False for f in LAYOUT_FIELDS}, fp8=False)

    shapes = _abstract_shapes(load_cfg)
    flat: Dict[str, np.ndarray] = {}
    used = {embed_name, "lm_head.weight"}
    missing = []
    for hf_name, ours, kind in entries:
        if ours not in shapes:
            raise ValueError(f"config override(s) {sorted(config_overrides)} change the "
                             f"architecture: {ours} is not a parameter of the result")
        want = hf_shape(kind, shapes[ours])
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
        flat[ours] = to_ours(kind, tensors[hf_name], shapes[ours])
        used.add(hf_name)
    if missing:
        raise ValueError(f"{path}: {len(missing)} tensor(s) missing from the checkpoint, e.g. "
                         f"{missing[:3]}")
    unexpected = sorted(n for n in tensors if n not in used and not IGNORED.match(n))
    if unexpected:
        raise ValueError(f"{path}: {len(unexpected)} tensor(s) t5lite does not know how to "
                         f"place (unsupported feature?), e.g. {unexpected[:3]}")
    flat["token_embedder/embedding"] = np.ascontiguousarray(tensors[embed_name])
    if logits_kernel is not None:
        flat[family.head_key] = np.ascontiguousarray(logits_kernel, dtype=np.float32)
    for name, shape in shapes.items():
        if name not in flat:
            raise ValueError(f"{name}: no tensor in the checkpoint fills it (config override?)")
        if flat[name].shape != shape:
            raise ValueError(f"{name}: shape {flat[name].shape} from the checkpoint, but the "
                             f"config gives {shape} (config override?)")
    variables = {"params": unflatten(flat)}

    if cfg.fuse_qkv or cfg.scan_layers:
        from t5lite.models import layouts
        variables = _on_host(layouts.convert_params, variables, load_cfg, cfg)
    model = model_for_config(cfg)
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
    flat = {k: np.asarray(v, dtype=np.float32) for k, v in flatten(tree).items()}
    family = family_of(cfg)
    hf_cfg, entries = family.hf_config(cfg), family.entries(cfg)
    state: Dict[str, np.ndarray] = {}
    wanted = [(family.embed_names[0], "token_embedder/embedding", "copy")] + entries
    if family.has_head(cfg):
        wanted.append(("lm_head.weight", family.head_key, "transpose"))
    missing = [ours for _, ours, _ in wanted if ours not in flat]
    if missing:
        raise ValueError(f"save_pretrained: parameters missing for this config, e.g. {missing[:3]}")
    for hf_name, ours, kind in wanted:
        state[hf_name] = to_hf(kind, flat[ours])
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
