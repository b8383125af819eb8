"""One place knows what a checkpoint is (issue 46, part 5): `formats/checkpoint_kinds`
decides the kind of a path once, and every kind's reader gives the same tree. A tiny
Switch T5 (experts in its odd layers) written as a t5lite checkpoint in two layouts, as
a training state, as a T5X `contrib/moe` checkpoint in T5X's msgpack + zarr layout and
in its Orbax one, reads back into the model equal to what was written; a Hugging Face
directory and a step no save committed are one line; and no module outside `formats/`
asks the files what a checkpoint is."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from t5lite.errors import ConfigError
from t5lite.formats import checkpoint_kinds
from t5lite.interop import checkpoint_format
from t5lite.models import layouts
from t5lite.models.configs import T5Config
from t5lite.models.model import EncoderDecoderModel
from t5lite.models.param_paths import flatten, unflatten

import t5x_helpers as tx
from test_hf import random_variables

SWITCH = T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=2,
                  num_decoder_layers=2, mlp_dim=48, dtype="float32", num_experts=4,
                  moe_every=2, moe_first=1, moe_top_k=1, expert_mlp="relu")


def _abstract(model):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {"params": jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                                  sharding=device),
                                   model.abstract_variables()["params"])}


def _t5x_target(params):
    """t5lite's canonical tree as T5X's contrib/moe stores it: attention heads joined,
    a sparse layer's router and experts under flaxformer's names."""
    out = {}
    for name, x in flatten(params).items():
        x = np.asarray(x)
        if re.search(r"attention/(query|key|value)/kernel$", name):
            x = x.reshape(x.shape[0], -1)
        elif re.search(r"attention/out/kernel$", name):
            x = x.reshape(-1, x.shape[-1])
        name = re.sub(r"/mlp/router/kernel$", "/mlp/router/router_weights/w/kernel", name)
        if x.ndim == 3 and re.search(r"/mlp/(wi|wo)/kernel$", name):
            name = re.sub(r"/mlp/(wi|wo)/kernel$", r"/mlp/expert/\1/kernel", name)
        out[name] = x
    return unflatten(out)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{kind label: path} of one Switch T5's parameters written every way, and them."""
    root = tmp_path_factory.mktemp("kinds")
    model = EncoderDecoderModel(SWITCH)
    params = random_variables(model, 11)["params"]
    assert any("router" in n for n in flatten(params))
    paths = {"t5lite": root / "converted"}
    checkpoint_format.save_params(paths["t5lite"], {"params": params})
    fused_scanned = dataclasses.replace(SWITCH, fuse_qkv=True, scan_layers=True)
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        other = layouts.convert_params({"params": params}, SWITCH, fused_scanned)
    paths["t5lite fused scanned"] = root / "fused_scanned"
    checkpoint_format.save_params(paths["t5lite fused scanned"], other, step=3)
    target = _t5x_target(params)
    paths["t5x"] = tx.write_t5x_checkpoint(root / "checkpoint_7", target, step=7)
    paths["t5x orbax"] = tx.write_t5x_orbax_checkpoint(root / "t5x_run", target, step=7)
    return paths, params


@pytest.mark.parametrize("label,kind,layout", [
    ("t5lite", checkpoint_kinds.T5LITE, {}),
    ("t5lite fused scanned", checkpoint_kinds.T5LITE, {"fuse_qkv": True}),
    ("t5x", checkpoint_kinds.T5X, {"scan_layers": True}),
    ("t5x orbax", checkpoint_kinds.T5X, {})])
def test_every_kind_reads_the_same_tree(written, label, kind, layout):
    paths, params = written
    ckpt = checkpoint_kinds.open_checkpoint(paths[label], "INITIAL_CHECKPOINT_PATH")
    assert ckpt.kind == kind and ckpt.adapters is None
    if kind == checkpoint_kinds.T5X:
        assert ckpt.step == 7 and ckpt.recorded("anything") is None
    model = EncoderDecoderModel(dataclasses.replace(SWITCH, **layout))
    got = ckpt.read_params(model, _abstract(model))
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        want = layouts.convert_params({"params": params}, SWITCH, model.config)
    got, want = flatten(jax.device_get(got)["params"]), flatten(want["params"])
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), name)


def test_a_hugging_face_directory_is_one_line_naming_convert(tmp_path):
    from safetensors.numpy import save_file
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "switch_transformers"}))
    save_file({"shared.weight": np.zeros((4, 4), np.float32)}, str(tmp_path / "model.safetensors"))
    ckpt = checkpoint_kinds.open_checkpoint(tmp_path, "INITIAL_CHECKPOINT_PATH")
    assert ckpt.kind == checkpoint_kinds.HUGGING_FACE
    model = EncoderDecoderModel(SWITCH)
    with pytest.raises(ConfigError) as e:
        ckpt.read_params(model, _abstract(model))
    text = str(e.value)
    assert "\n" not in text and "python -m t5lite.convert --from=hf" in text, text


def test_a_step_no_save_committed_is_refused_for_every_setting(written, tmp_path):
    import shutil
    step = tmp_path / "run" / "checkpoints" / "0.orbax-checkpoint-tmp-17"
    shutil.copytree(written[0]["t5lite"] / "checkpoints" / "0", step)
    for what in ("INITIAL_CHECKPOINT_PATH", "CHECKPOINT_PATH", "--input"):
        with pytest.raises(FileNotFoundError) as e:
            checkpoint_kinds.open_checkpoint(step, what)
        text = str(e.value)
        assert "\n" not in text and text.startswith(f"{what} {step} is an incomplete "
                                                    f"checkpoint"), text
    with pytest.raises(ConfigError) as e:  # convert --from=t5x of a t5lite checkpoint
        checkpoint_kinds.open_checkpoint(written[0]["t5lite"], "--input",
                                         expect=checkpoint_kinds.T5X)
    assert "is not a T5X checkpoint" in str(e.value) and "\n" not in str(e.value)


def test_only_formats_asks_the_files_what_a_checkpoint_is():
    """The kind is decided in `formats/` (checkpoint_kinds): no module above asks the
    files themselves (T5X or not, which item) again."""
    package = Path(__file__).resolve().parents[1] / "t5lite"
    asking = re.compile(r"\b(is_t5x_checkpoint|resolve_item|_is_hugging_face)\(")
    askers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                    if p.parent.name != "formats" and asking.search(p.read_text()))
    assert askers == [], askers
