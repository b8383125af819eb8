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
from t5lite.models.common.param_paths import flatten, unflatten

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
    target = unflatten(tx.t5x_moe_view(params))
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


def test_a_bad_moe_checkpoint_is_one_line_and_writes_nothing(written, tmp_path, capsys):
    """`convert` of a Switch checkpoint whose experts do not fit the model: T5X's layout
    with 3 experts where the model has 4, a router kernel transposed, an expert kernel
    missing; and t5lite's with 3 experts (`--to=hf`). Each is one line naming the
    parameter (and the expert counts), exit 2, and no output."""
    from t5lite import convert
    from t5lite.interop.convert import model_gin
    (tmp_path / "model.gin").write_text(model_gin(SWITCH))
    view = tx.t5x_moe_view(written[1])
    router = "encoder/layers_1/mlp/router/router_weights/w/kernel"
    three = {n: (v[..., :3] if n.endswith("router_weights/w/kernel") else
                 v[:3] if "/expert/" in n else v) for n, v in view.items()}
    fewer = {n: v[:3] if n.endswith("decoder/layers_1/mlp/expert/wo/kernel") else v
             for n, v in view.items()}
    cases = {
        "three": (three, "layers_1/mlp/router/kernel' has shape [32, 3], the model needs "
                         "[32, 4] (3 experts in the checkpoint, NUM_EXPERTS=4"),
        "fewer": (fewer, "'decoder/layers_1/mlp/wo/kernel' has shape [3, 48, 32], the model "
                         "needs [4, 48, 32] (3 experts in the checkpoint, NUM_EXPERTS=4"),
        "router": ({**view, router: view[router].T},
                   "'encoder/layers_1/mlp/router/kernel' has shape [4, 32]"),
        "missing": ({n: v for n, v in view.items() if not n.endswith("1/mlp/expert/wi/kernel")},
                    "lacks parameter 'decoder/layers_1/mlp/wi/kernel'")}
    for name, (tree, needle) in cases.items():
        ckpt = tx.write_t5x_checkpoint(tmp_path / name / "checkpoint_1", unflatten(tree))
        out = tmp_path / f"out_{name}"
        code = convert.main(["--from=t5x", f"--input={ckpt}", f"--output={out}",
                             f"--gin_file={tmp_path / 'model.gin'}"])
        lines = [l for l in capsys.readouterr().err.splitlines() if l]
        assert code == 2 and len(lines) == 1 and needle in lines[0], (name, lines)
        assert not out.exists() or not any(out.iterdir()), name
    ours = {n: (v[..., :3] if n.endswith("router/kernel") else
                v[:3] if "/mlp/w" in n and v.ndim == 3 else v)
            for n, v in flatten(written[1]).items()}
    checkpoint_format.save_params(tmp_path / "ours", {"params": unflatten(ours)})
    out = tmp_path / "hf_out"
    code = convert.main(["--to=hf", f"--input={tmp_path / 'ours'}", f"--output={out}",
                         f"--gin_file={tmp_path / 'model.gin'}"])
    lines = [l for l in capsys.readouterr().err.splitlines() if l]
    assert code == 2 and len(lines) == 1, lines
    assert ("params/decoder/layers_1/mlp/router/kernel has shape (32, 3) in the checkpoint but "
            "(32, 4) in the model (3 experts in the checkpoint, NUM_EXPERTS=4 in the model)"
            in lines[0]), lines
    assert not out.exists() or not any(out.iterdir())
