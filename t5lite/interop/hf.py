"""Hugging Face interop: load a local HF model directory into t5lite, save one back.

    model, variables = load_pretrained("/models/t5-v1_1-small", dtype="float32")
    save_pretrained(model, variables, "/tmp/out")   # transformers can load /tmp/out

What loads: `config.json` plus safetensors weights (`model.safetensors`, or the shards
listed in `model.safetensors.index.json`, or else every `*.safetensors` file) for
`model_type` "t5" (T5 v1.1 and the original T5), "llama" and "mixtral" (its experts in
transformers 5's stacked layout or transformers 4's per-expert one). Pickle files
(`pytorch_model.bin`, `*.pt`, ...) are never opened: unpickling runs arbitrary code.

Weights that are not all there are refused in one line naming the file and tensor
(CheckpointDamagedError), before a byte of them is used: a file cut short (its 8-byte
header length, its JSON header or a tensor's byte range running past the end), a shard
the index names that is absent, a tensor the index names that its shard does not hold.

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
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from t5lite.errors import CheckpointDamagedError

from t5lite.interop.hf_config import (  # noqa: F401  (read_hf_config, config_from_hf: public API)
    CONFIG_NAME, SUPPORTED_MODEL_TYPES, PathLike, config_from_hf, read_hf_config)
from t5lite.interop.hf_families import IGNORED, family_of, hf_shape, to_hf, to_ours
from t5lite.models import layouts
from t5lite.models.model import BaseModel, model_for_config
from t5lite.models.common.param_paths import flatten, unflatten
from t5lite.runtime import metrics

Model = BaseModel
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
COPY_AGAIN = "it was copied incompletely: copy the model directory again"
MAX_HEADER_BYTES = 100_000_000  # safetensors refuses longer headers
# safetensors' dtype names -> bytes per element (the format's own table; a dtype not here
# is left to safetensors to check).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


# --------------------------------------------------------------------------- files


def _index_map(path: Path) -> Dict[str, str]:
    """tensor name -> shard file name, from model.safetensors.index.json."""
    index = path / INDEX_NAME
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointDamagedError(f"{index} is not a readable index ({type(e).__name__}: "
                                     f"{' '.join(str(e).split())[:200]}); {COPY_AGAIN}") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: no 'weight_map' object of tensor -> shard file names")
    return weight_map


def _weight_files(path: Path) -> List[Path]:
    """The safetensors files of a model directory; refuses pickle-only directories and
    an index naming a shard that is not there."""
    if (path / INDEX_NAME).is_file():
        weight_map = _index_map(path)
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not (path / shard).is_file():
                named = sorted(t for t, s in weight_map.items() if s == shard)
                raise CheckpointDamagedError(
                    f"the Hugging Face model {path} is missing shard {shard}: {INDEX_NAME} "
                    f"names it for {len(named)} tensor(s), e.g. {named[0]!r} "
                    f"({len(shards)} shards in all); {COPY_AGAIN}")
        return [path / shard for shard in shards]
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


def safetensors_header(file: PathLike) -> Dict[str, Dict[str, Any]]:
    """The tensors a safetensors file holds ({name: {dtype, shape, data_offsets}}),
    checked against the file's size: CheckpointDamagedError naming the file (and the
    first tensor past the end) when it is cut short or its header is not one."""
    file = Path(file)
    size = file.stat().st_size

    def damaged(what):
        return CheckpointDamagedError(f"the Hugging Face weights file {file} {what}; "
                                      f"{COPY_AGAIN}")

    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise damaged(f"is cut short: {size} bytes, not even the 8-byte header length")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER_BYTES:
            raise damaged(f"is not a safetensors file: its first 8 bytes give a header of "
                          f"{length} bytes, over the format's limit of {MAX_HEADER_BYTES}")
        if length > size - 8:
            raise damaged(f"is cut short: its header says {length} bytes of metadata follow, "
                          f"but the file has {size} bytes")
        try:
            header = json.loads(f.read(length))
            entries = {k: v for k, v in header.items() if k != "__metadata__"}
            spans = {k: (int(v["data_offsets"][0]), int(v["data_offsets"][1]),
                         int(np.prod([int(n) for n in v["shape"]])) *
                         DTYPE_BYTES.get(v["dtype"], -1)) for k, v in entries.items()}
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise damaged(f"has no readable safetensors header ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:120]})") from None
    data = size - 8 - length
    past = sorted((end, name) for name, (_, end, _) in spans.items() if end > data)
    if past:
        end, name = past[0]
        raise damaged(f"is cut short: tensor {name!r} ends at data byte {end} but the file "
                      f"holds {data} bytes of data ({len(past)} of its {len(spans)} tensors "
                      f"run past the end)")
    for name, (begin, end, nbytes) in spans.items():
        if begin < 0 or end < begin or (nbytes >= 0 and end - begin != nbytes):
            raise damaged(f"has a damaged header: tensor {name!r} spans bytes {begin}..{end}, "
                          f"not the {nbytes} bytes its dtype and shape take")
    return entries


def read_safetensors(path: PathLike) -> Dict[str, np.ndarray]:
    """Every tensor of a model directory's safetensors file(s), as float32 numpy arrays.
    Each file is checked complete first (`safetensors_header`), and with an index every
    tensor it names must be in the shard it names."""
    path = Path(path)
    files = _weight_files(path)
    weight_map = _index_map(path) if (path / INDEX_NAME).is_file() else {}
    headers = {file: safetensors_header(file) for file in files}
    for file, header in headers.items():
        absent = sorted(t for t, shard in weight_map.items()
                        if path / shard == file and t not in header)
        if absent:
            raise CheckpointDamagedError(
                f"the Hugging Face model {path} is missing data: {INDEX_NAME} names tensor "
                f"{absent[0]!r} in shard {file.name}, which does not hold it ({len(absent)} "
                f"tensor(s) missing); {COPY_AGAIN}")
    tensors: Dict[str, np.ndarray] = {}
    total = sum(len([t for t in h if t != "__metadata__"]) for h in headers.values())
    bar = metrics.Progress(total, desc="reading tensors")  # on a terminal only
    read_bytes = 0
    try:
        for file in headers:
            name = None
            try:
                with safe_open(str(file), framework="numpy") as f:
                    for name in f.keys():
                        if name in tensors:
                            raise ValueError(f"tensor {name!r} is in more than one shard "
                                             f"({file.name})")
                        tensors[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
                        read_bytes += tensors[name].nbytes
                        bar.update(len(tensors), {"GB": read_bytes / 1e9})
            except (SafetensorError, OSError) as e:
                tensor = f" (tensor {name!r})" if name is not None else ""
                raise CheckpointDamagedError(
                    f"the Hugging Face weights file {file} cannot be read{tensor}: "
                    f"{' '.join(str(e).split())[:200]}; {COPY_AGAIN}") from None
    finally:
        bar.close()
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
    parameter shape is refused. Raises FileNotFoundError for a missing directory or file,
    CheckpointDamagedError (a ValueError) for weights that are not all there, and
    ValueError for pickle-only directories and unsupported configs or weights."""
    path = Path(path)
    hf = read_hf_config(path)
    cfg = config_from_hf(hf)
    _weight_files(path)  # refuse pickle-only / empty dirs before anything else
    tensors = read_safetensors(path)

    family = family_of(cfg)
    tensors = family.read_layout(cfg, tensors, path)
    embed_name = next((n for n in family.embed_names if n in tensors), family.embed_names[0])
    if embed_name not in tensors:
        raise ValueError(f"{path}: the token embedding {embed_name!r} is missing")
    entries = family.entries(cfg)
    zero_groups = family.zero_bias_groups(cfg, hf)
    cfg, logits_kernel = family.decide_output_head(cfg, hf, tensors, embed_name)
    cfg = _apply_overrides(cfg, config_overrides)
    load_cfg = layouts.canonical_config(cfg, fp8=False)

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

    if cfg.fuse_qkv or layouts.stacked(cfg):  # numpy in, numpy out: nothing compiled
        variables = layouts.convert_params(variables, load_cfg, cfg)
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
    base = layouts.canonical_config(cfg)
    if cfg.fuse_qkv or layouts.stacked(cfg):  # host arrays convert in numpy
        tree = layouts.convert_params({"params": tree}, cfg, base)["params"]
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
    return hf_cfg, family.write_layout(cfg, state)


def save_pretrained(model: Model, variables: Mapping[str, Any], path: PathLike) -> Path:
    """Write config.json + model.safetensors (float32) that transformers'
    T5ForConditionalGeneration / LlamaForCausalLM / MixtralForCausalLM (a config with
    experts; transformers 5's layout) `.from_pretrained(path)` loads.
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
