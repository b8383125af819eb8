"""T5X checkpoints written here in T5X's own layout, for the tests: a flax msgpack
`checkpoint` file ({"version": 3, "optimizer": {"target", "state"}}) beside one zarr v2
array per partitioned leaf, referenced from the msgpack by a TensorStore spec whose path
is relative to the checkpoint directory (T5X's `checkpoints.py` layout). The parameter
tree comes from a Hugging Face T5 by the correspondence of transformers' own T5X
conversion (kernel = weight.T, the heads joined)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import numpy as np
from flax import serialization


def spec(relative: str, dtype: str, shape, chunks) -> Dict[str, Any]:
    """The TensorStore spec T5X stores in the msgpack for a partitioned leaf."""
    return {"driver": "zarr", "dtype": dtype,
            "kvstore": {"driver": "file", "path": relative + "/"},
            "metadata": {"chunks": list(chunks), "compressor": {"id": "gzip", "level": 1},
                         "shape": list(shape)}}


def write_zarr_by_hand(directory: Path, array: np.ndarray, chunks, dtype_name: str) -> None:
    """zarr v2 with gzip chunks, C order; the edge chunks padded to full size."""
    directory.mkdir(parents=True)
    (directory / ".zarray").write_text(json.dumps({
        "chunks": list(chunks), "compressor": {"id": "gzip", "level": 1},
        "dimension_separator": ".", "dtype": dtype_name, "fill_value": None,
        "filters": None, "order": "C", "shape": list(array.shape), "zarr_format": 2}))
    grid = [-(-n // c) for n, c in zip(array.shape, chunks)]
    for index in np.ndindex(*grid):
        block = np.zeros(chunks, array.dtype)
        part = array[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, chunks))]
        block[tuple(slice(0, n) for n in part.shape)] = part
        (directory / ".".join(map(str, index))).write_bytes(gzip.compress(block.tobytes("C")))


def write_zarr_with_tensorstore(directory: Path, array: np.ndarray, chunks) -> None:
    import tensorstore as ts
    dtype = "bfloat16" if array.dtype.name == "bfloat16" else array.dtype.str
    store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(directory) + "/"},
                     "metadata": {"shape": list(array.shape), "chunks": list(chunks),
                                  "dtype": dtype, "compressor": {"id": "gzip"}}},
                    create=True).result()
    store.write(array).result()


def t5x_tree_from_hf(state: Mapping[str, Any], num_layers: int) -> Dict[str, Any]:
    """T5X's examples/t5 parameter tree from a Hugging Face T5 state dict (v1.1: gated MLP
    wi_0 / wi_1 and logits_dense; v1.0: mlp/wi and logits via the embedding)."""
    w = {k: v.detach().float().numpy().T.copy() for k, v in state.items()}
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in state
    tree = {"token_embedder": {"embedding": w["shared.weight"].T.copy()},
            "encoder": {"relpos_bias": {"rel_embedding":
                        w["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]},
                        "encoder_norm": {"scale": w["encoder.final_layer_norm.weight"]}},
            "decoder": {"relpos_bias": {"rel_embedding":
                        w["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]},
                        "decoder_norm": {"scale": w["decoder.final_layer_norm.weight"]}}}
    if "lm_head.weight" in state and gated:
        tree["decoder"]["logits_dense"] = {"kernel": w["lm_head.weight"]}

    def attention(prefix):
        return {t5x: {"kernel": w[f"{prefix}.{hf}.weight"]}
                for hf, t5x in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out"))}

    def mlp(prefix):
        names = ("wi_0", "wi_1", "wo") if gated else ("wi", "wo")
        return {name: {"kernel": w[f"{prefix}.{name}.weight"]} for name in names}

    for i in range(num_layers):
        e, d = f"encoder.block.{i}.layer", f"decoder.block.{i}.layer"
        tree["encoder"][f"layers_{i}"] = {
            "pre_attention_layer_norm": {"scale": w[f"{e}.0.layer_norm.weight"]},
            "attention": attention(f"{e}.0.SelfAttention"),
            "pre_mlp_layer_norm": {"scale": w[f"{e}.1.layer_norm.weight"]},
            "mlp": mlp(f"{e}.1.DenseReluDense")}
        tree["decoder"][f"layers_{i}"] = {
            "pre_self_attention_layer_norm": {"scale": w[f"{d}.0.layer_norm.weight"]},
            "self_attention": attention(f"{d}.0.SelfAttention"),
            "pre_cross_attention_layer_norm": {"scale": w[f"{d}.1.layer_norm.weight"]},
            "encoder_decoder_attention": attention(f"{d}.1.EncDecAttention"),
            "pre_mlp_layer_norm": {"scale": w[f"{d}.2.layer_norm.weight"]},
            "mlp": mlp(f"{d}.2.DenseReluDense")}
    return tree


def _to_disk(node, ckpt: Path, prefix: str, dtype: Optional[str]):
    """Leaves of 2+ dims go to zarr arrays (as T5X writes partitioned leaves), the rest
    stays in the msgpack; `dtype` ('bfloat16' / 'float32') casts the target's leaves."""
    if isinstance(node, Mapping):
        return {k: _to_disk(v, ckpt, f"{prefix}.{k}", dtype) for k, v in node.items()}
    array = np.asarray(node)
    if dtype is not None and array.dtype.kind == "f":
        import ml_dtypes
        array = array.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    if array.ndim < 2:
        return array
    write_zarr_with_tensorstore(ckpt / prefix, array, [max(1, n // 2) for n in array.shape])
    name = "bfloat16" if array.dtype.name == "bfloat16" else array.dtype.name
    return spec(prefix, name, array.shape, [max(1, n // 2) for n in array.shape])


def write_t5x_checkpoint(ckpt: Path, target: Mapping[str, Any], step: int = 0,
                         param_states: Optional[Mapping[str, Any]] = None,
                         dtype: Optional[str] = None) -> Path:
    """A `checkpoint_<step>` directory in T5X's layout (version 3). The target's leaves
    are cast to `dtype` when given (T5X's SaveCheckpointConfig.dtype); Adafactor's
    param_states keep their own dtypes, their 2+-dim leaves in zarr as in T5X."""
    ckpt = Path(ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    state = {"step": np.int32(step),
             "param_states": _to_disk(param_states or {}, ckpt, "state.param_states", None)}
    (ckpt / "checkpoint").write_bytes(serialization.msgpack_serialize(
        {"version": 3, "optimizer": {"target": _to_disk(target, ckpt, "target", dtype),
                                     "state": state}}))
    return ckpt


def t5x_factored_dims(shape, min_dim: int = 128):
    """T5X Adafactor's heuristic for a (at most 2-D) parameter: (d1, d0) = (second
    largest, largest) dimension, ties in axis order; None when unfactored."""
    if len(shape) < 2:
        return None
    order = np.argsort(shape, kind="stable")
    if shape[order[-2]] < min_dim:
        return None
    return int(order[-2]), int(order[-1])


def adafactor_slots(view: Mapping[str, np.ndarray], rng, beta1=None) -> Dict[str, Dict]:
    """Random T5X Adafactor state {m, v, v_row, v_col} per parameter of a flat T5X tree
    (`v_row` over d1, `v_col` over d0 when factored; unused slots float32 zeros [1])."""
    slots = {}
    for name, p in view.items():
        dims = t5x_factored_dims(p.shape)
        s = {k: np.zeros((1,), np.float32) for k in ("m", "v", "v_row", "v_col")}
        if dims is not None:
            s["v_row"] = rng.uniform(0.5, 2.0, p.shape[dims[0]]).astype(np.float32)
            s["v_col"] = rng.uniform(0.5, 2.0, p.shape[dims[1]]).astype(np.float32)
        else:
            s["v"] = rng.uniform(0.5, 2.0, p.shape).astype(np.float32)
        if beta1 is not None:
            s["m"] = (1e-3 * rng.normal(size=p.shape)).astype(np.float32)
        slots[name] = s
    return slots


def param_states(slots: Mapping[str, Mapping[str, np.ndarray]]) -> Dict[str, Any]:
    """T5X's `state/param_states` tree from {param name: slots}."""
    tree: Dict[str, Any] = {}
    for name, s in slots.items():
        node = tree
        for part in name.split("/"):
            node = node.setdefault(part, {})
        node.update(s)
    return tree


def write_t5x_orbax_checkpoint(model_dir: Path, target: Mapping[str, Any], step: int = 0,
                               param_states: Optional[Mapping[str, Any]] = None) -> Path:
    """`model_dir/checkpoint_<step>` in T5X's Orbax layout (`train.use_orbax=True`), as
    T5X's OrbaxCheckpointManagerInterface writes it: a CheckpointManager with the
    'checkpoint' step prefix, the state dict {"target", "state": {"step",
    "param_states"}} as the `state` item of a PyTreeCheckpointHandler with OCDBT, and a
    `dataset` item (empty when the dataset is not saved)."""
    import orbax.checkpoint as ocp
    state = {"target": target, "state": {"step": np.int32(step),
                                         "param_states": param_states or {}}}
    options = ocp.CheckpointManagerOptions(step_prefix="checkpoint", max_to_keep=None,
                                           create=True)
    with ocp.CheckpointManager(Path(model_dir), options=options,
                               item_handlers={"state": ocp.PyTreeCheckpointHandler(
                                   use_ocdbt=True)}) as manager:
        manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)),
                     force=True)
        manager.wait_until_finished()
    ckpt = Path(model_dir) / f"checkpoint_{step}"
    (ckpt / "dataset").mkdir(exist_ok=True)
    return ckpt


def t5x_moe_view(params: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """A t5lite T5's parameters (the canonical layout) as T5X's `contrib/moe` checkpoint
    holds them, flat: attention kernels with the heads joined, a sparse layer's router
    under router/router_weights/w and its experts under expert/ (kernels [experts, in,
    out]). A dense T5's is T5X's `examples/t5` tree."""
    import re

    from t5lite.models.common import param_paths
    out = {}
    for name, value in param_paths.flatten(params).items():
        value = np.asarray(value, np.float32)
        if re.search(r"(query|key|value)/kernel$", name):
            value = value.reshape(value.shape[0], -1)
        elif name.endswith("out/kernel"):
            value = value.reshape(-1, value.shape[-1])
        name = re.sub(r"/mlp/router/kernel$", "/mlp/router/router_weights/w/kernel", name)
        if value.ndim == 3:  # an expert kernel
            name = re.sub(r"/mlp/(wi|wo)/kernel$", r"/mlp/expert/\1/kernel", name)
        out[name] = value
    return out
