"""Convert between a local Hugging Face model directory and a t5lite checkpoint (the
library of `python -m t5lite.convert`):

    python -m t5lite.convert --from=hf --input=HF_DIR --output=CKPT_DIR \\
        [--fuse_qkv] [--scan_layers] [--dtype=bfloat16]

writes CKPT_DIR/checkpoints/0/params (Orbax, see `t5lite.interop.checkpoint_format`) and
CKPT_DIR/model.gin, which binds MODEL to the matching architecture. Use them as::

    --gin_file=CKPT_DIR/model.gin --gin.INITIAL_CHECKPOINT_PATH=\\"CKPT_DIR\\"

and back, after training or finetuning (`export_hf`):

    python -m t5lite.convert --to=hf --input=MODEL_DIR --output=HF_DIR \\
        --gin_file=CKPT_DIR/model.gin [--gin.NAME=VALUE ...]

writes HF_DIR/config.json and model.safetensors (float32) from the parameters of
MODEL_DIR's latest complete step (or a step directory, or a converted checkpoint), read
as the model the gin files bind.

and from a T5X checkpoint (`convert_t5x`; T5X's own msgpack + zarr layout):

    python -m t5lite.convert --from=t5x --input=/ckpt/checkpoint_1000000 \\
        --output=CKPT_DIR --gin_file=configs/models/t5_1_1/base.gin [--fuse_qkv] ...

writes the same two files, the parameters under the T5X checkpoint's step.

Bad input (missing directory, pickle-only weights, unsupported model, a non-empty
output directory) raises ValueError / OSError with a one-line message.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Tuple

import jax

from t5lite.interop import checkpoint_format, hf
from t5lite.models.configs import moe_macros, switch_macros
from t5lite.models.moe import settings as moe_settings
from t5lite.models.model import model_for_config

GIN_NAME = "model.gin"
# Config fields bound through the shared macros (configs/models/_switches.gin and
# _moe.gin), so `--gin.FUSE_QKV=...`, `--gin.CAPACITY_FACTOR=...` and the rest work with a
# converted model.gin as with a shipped one.
SWITCH_MACROS = switch_macros()
MOE_MACROS = moe_macros()
MACROS = {**SWITCH_MACROS, **MOE_MACROS}


def model_gin(cfg, source: str = "") -> str:
    """Gin text binding MODEL to a model built from `cfg` (every field spelled out). The
    gin names are the class names of the config and of its family's model wrapper."""
    model_name = type(model_for_config(cfg)).__name__
    cfg_name = type(cfg).__name__
    values = dataclasses.asdict(cfg)
    lines = [f"# t5lite model converted by `python -m t5lite.convert`{source}.",
             "# The parameters live in checkpoints/<step>/params next to this file; they are",
             "# stored in the fuse_qkv / scan_layers layout below (other layouts convert on load).",
             "", "# Switches (same macros as configs/models/_switches.gin)."]
    for field, macro in SWITCH_MACROS.items():
        lines.append(f"{macro} = {_gin_value(values[field])}")
    lines += ["", "# Mixture of experts (same macros as configs/models/_moe.gin)."]
    encoder = hasattr(cfg, "num_encoder_layers")
    macros = {f: m for f, m in MACROS.items() if encoder or f not in moe_settings.ENCODER_ONLY}
    for field, macro in MOE_MACROS.items():
        if field in macros:
            lines.append(f"{macro} = {_gin_value(values[field])}")
    lines += ["", f"MODEL = @{model_name}()", f"{model_name}.config = @{cfg_name}()", ""]
    for field in dataclasses.fields(cfg):
        rhs = (f"%{macros[field.name]}" if field.name in macros
               else _gin_value(values[field.name]))
        lines.append(f"{cfg_name}.{field.name} = {rhs}")
    return "\n".join(lines) + "\n"


def _gin_value(value) -> str:
    return repr(tuple(value) if isinstance(value, list) else value)


def _new_output(output_dir: str) -> Path:
    out = Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--output={out} exists and is not an empty directory; "
                              "choose a new path")
    return out


def convert_hf(input_dir: str, output_dir: str, *, fuse_qkv: bool = False,
               scan_layers: bool = False, dtype: Optional[str] = None, step: int = 0) -> Path:
    """Library form of the CLI's --from=hf; returns the output directory."""
    out = _new_output(output_dir)
    overrides = {"fuse_qkv": fuse_qkv, "scan_layers": scan_layers}
    if dtype:
        overrides["dtype"] = dtype
    model, variables = hf.load_pretrained(input_dir, **overrides)
    checkpoint_format.save_params(out, variables, step=step)
    (out / GIN_NAME).write_text(model_gin(model.config, f" from {Path(input_dir).absolute()}"))
    return out


def convert_t5x(input_dir: str, output_dir: str, model, *, fuse_qkv: bool = False,
                scan_layers: bool = False, dtype: Optional[str] = None,
                step: Optional[int] = None) -> Tuple[Path, int]:
    """Library form of the CLI's --from=t5x: the parameters of the T5X checkpoint at
    `input_dir`, read as `model` (the gin files' MODEL, in the layout and dtype asked
    for), written as a converted checkpoint under `step` (default: the T5X step).
    Returns (output directory, step)."""
    from t5lite.formats import checkpoint_kinds
    from t5lite.runtime.checkpointing import finetune_restore
    out = _new_output(output_dir)
    overrides = {"fuse_qkv": fuse_qkv, "scan_layers": scan_layers}
    if dtype:
        overrides["dtype"] = dtype
    model = model_for_config(dataclasses.replace(model.config, **overrides))
    ckpt = checkpoint_kinds.open_checkpoint(input_dir, "--input", expect=checkpoint_kinds.T5X)
    if step is None:
        step = ckpt.step
    params = finetune_restore.restore_params_for_finetuning(ckpt, model, _host_abstract(model),
                                                            what="--input")
    checkpoint_format.save_params(out, params, step=step)
    (out / GIN_NAME).write_text(model_gin(model.config,
                                          f" from T5X {Path(input_dir).absolute()}"))
    return out, step


def _host_abstract(model):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {"params": jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
        model.abstract_variables()["params"])}


def export_hf(checkpoint_path: str, output_dir: str, model) -> Path:
    """The parameters at `checkpoint_path` (a MODEL_DIR's latest complete step, a step
    directory or a converted checkpoint), read as `model`, written as a Hugging Face
    directory (`hf.save_pretrained`). A LoRA model's adapters (LORA_RANK, LORA_TARGETS,
    LORA_ALPHA as trained) are merged into the kernels first (`lora.merge_lora`): the
    output is a plain model; a LoRA run's checkpoint exported without its LORA_* settings
    brings them itself, as eval and infer read it (`lora_restore.adopt_adapters`).
    Returns the output directory."""
    from t5lite.formats import checkpoint_kinds
    from t5lite.models import lora
    from t5lite.runtime.checkpointing import finetune_restore, lora_restore
    out = _new_output(output_dir)
    ckpt = checkpoint_kinds.open_checkpoint(checkpoint_path, "--input")
    model = lora_restore.adopt_adapters(model, ckpt, "--input")
    params = finetune_restore.restore_params_for_finetuning(ckpt, model, _host_abstract(model),
                                                            what="--input")
    if lora.enabled(model.config):
        params, merged_cfg = lora.merge_lora(params, model.config)
        model = model_for_config(merged_cfg)
    return hf.save_pretrained(model, params, out)
