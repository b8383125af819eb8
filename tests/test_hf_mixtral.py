"""Mixtral from and to Hugging Face: a random tiny transformers MixtralForCausalLM (CPU,
float32) saved in transformers 5's stacked expert layout and in transformers 4's
per-expert one loads into t5lite with the same logits; t5lite writes it back, tensor for
tensor, in transformers 5's layout; gate and up are told apart; expert counts that
disagree with config.json, and MoE settings Mixtral cannot express, are one line."""
import functools
import json
import logging

import gin
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file, save_file  # noqa: E402

import test_hf as hf_tests  # noqa: E402
from test_hf import far_from_init  # noqa: E402
from t5lite import convert as convert_cli  # noqa: E402
from t5lite.interop import hf, hf_config, hf_families  # noqa: E402
from t5lite.models.configs import DecoderConfig  # noqa: E402
from t5lite.models.model import model_for_config  # noqa: E402

TOL = 1e-5
VOCAB, LAYERS, HIDDEN, EXPERTS, INTER = 128, 2, 32, 4, 48
DIMS = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
            num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=EXPERTS, num_experts_per_tok=2, max_position_embeddings=64,
            rope_theta=5000.0, router_aux_loss_coef=0.02)
WEIGHTS = "model.safetensors"


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)


# ----------------------------------------------------------------------------- helpers


def v4_name(i, j, w):
    return f"model.layers.{i}.block_sparse_moe.experts.{j}.{w}.weight"


def to_v4(state):
    """transformers 5's stacked expert tensors -> transformers 4's per-expert names."""
    out = {}
    for name, a in state.items():
        if ".mlp.experts.gate_up_proj" in name:
            i = int(name.split(".")[2])
            for j in range(a.shape[0]):
                out[v4_name(i, j, "w1")] = np.ascontiguousarray(a[j, :INTER])
                out[v4_name(i, j, "w3")] = np.ascontiguousarray(a[j, INTER:])
        elif ".mlp.experts.down_proj" in name:
            i = int(name.split(".")[2])
            for j in range(a.shape[0]):
                out[v4_name(i, j, "w2")] = np.ascontiguousarray(a[j])
        elif ".mlp.gate.weight" in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = a
        else:
            out[name] = a
    return out


def write_dir(path, config, state):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(state, str(path / WEIGHTS), metadata={"format": "pt"})
    return path


def lm_batch(seed, length=12, valid=(12, 7)):
    return hf_tests.lm_batch(seed, length, valid, vocab=VOCAB)


hf_logits = hf_tests.hf_lm_logits


@functools.lru_cache(maxsize=None)
def _jitted_logits(cfg):
    return jax.jit(model_for_config(cfg).logits)


def max_diff(model, variables, batch, reference):
    ours = np.asarray(_jitted_logits(model.config)(variables, batch))
    mask = batch["decoder_loss_weights"] > 0
    return float(np.max(np.abs(ours - reference)[mask]))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    """(HF model, its logits on lm_batch(0), v5 dir, v4 dir, config.json, v5 tensors)."""
    torch.manual_seed(3)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**DIMS)).eval()
    far_from_init(model)  # weights far from init's 0.02, so the experts matter
    v5 = tmp_path_factory.mktemp("mixtral_v5")
    model.save_pretrained(str(v5), save_original_format=False)
    config = json.loads((v5 / "config.json").read_text())
    state = load_file(v5 / WEIGHTS)
    gate_up = state["model.layers.0.mlp.experts.gate_up_proj"]  # the stacked layout
    assert gate_up.shape == (EXPERTS, 2 * INTER, HIDDEN)
    v4 = write_dir(tmp_path_factory.mktemp("mixtral_v4"), config, to_v4(state))
    return model, hf_logits(model, lm_batch(0)), v5, v4, config, state


def spy_v4(monkeypatch):
    """Counts the layers read through the per-expert (transformers 4) path."""
    calls = []
    real = hf_families._stack_v4

    def spy(path, cfg, i, *rest):
        calls.append(i)
        return real(path, cfg, i, *rest)

    monkeypatch.setattr(hf_families, "_stack_v4", spy)
    return calls


def one_line_error(excinfo, *fragments):
    text = str(excinfo.value)
    assert "\n" not in text, text
    for f in fragments:
        assert f in text, text
    return text


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("layout", ["v5", "v4"])
def test_logits_match_transformers(mixtral, layout, monkeypatch):
    _, reference, v5, v4, _, _ = mixtral
    calls = spy_v4(monkeypatch)
    model, variables = hf.load_pretrained(v5 if layout == "v5" else v4, dtype="float32")
    assert calls == ([] if layout == "v5" else list(range(LAYERS)))
    c = model.config
    assert (c.num_experts, c.moe_top_k, c.routing, c.moe_every, c.expert_mlp, c.mlp_dim) == \
        (EXPERTS, 2, "dropless", 1, "swiglu", INTER)
    assert (c.rope_theta, c.num_kv_heads, c.router_aux_loss, c.max_length) == \
        (5000.0, 2, 0.02, 64)
    assert variables["params"]["decoder"]["layers_1"]["mlp"]["router"]["kernel"].shape == \
        (HIDDEN, EXPERTS)
    assert max_diff(model, variables, lm_batch(0), reference) < TOL


def test_transformers_default_save_is_the_per_expert_layout(mixtral, tmp_path, monkeypatch):
    """transformers 5's save_pretrained writes transformers 4's names by default: read."""
    hf_model, reference, *_ = mixtral
    hf_model.save_pretrained(str(tmp_path))
    assert v4_name(1, 3, "w3") in load_file(tmp_path / WEIGHTS)
    calls = spy_v4(monkeypatch)
    model, variables = hf.load_pretrained(tmp_path, dtype="float32")
    assert calls == list(range(LAYERS))
    assert max_diff(model, variables, lm_batch(0), reference) < TOL


@pytest.mark.parametrize("layout", ["v5", "v4"])
def test_swapped_gate_and_up_change_the_logits(mixtral, layout, tmp_path):
    _, reference, _, _, config, state = mixtral
    swapped = dict(state)
    for i in range(LAYERS):
        name = f"model.layers.{i}.mlp.experts.gate_up_proj"
        swapped[name] = np.concatenate([state[name][:, INTER:], state[name][:, :INTER]], 1)
    swapped = to_v4(swapped) if layout == "v4" else swapped
    model, variables = hf.load_pretrained(write_dir(tmp_path, config, swapped),
                                          dtype="float32")
    assert max_diff(model, variables, lm_batch(0), reference) > 1000 * TOL


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("layout", ["v5", "v4"])
def test_round_trip_hf_t5lite_hf_is_exact(mixtral, layout, tmp_path):
    hf_model, reference, v5, v4, _, state = mixtral
    model, variables = hf.load_pretrained(v5 if layout == "v5" else v4)
    out = hf.save_pretrained(model, variables, tmp_path / "out")
    written = load_file(out / WEIGHTS)
    assert written.keys() == state.keys()
    for name, a in state.items():
        np.testing.assert_array_equal(written[name], a, err_msg=name)
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["model_type"] == "mixtral" and hf_cfg["num_local_experts"] == EXPERTS
    assert hf_cfg["router_aux_loss_coef"] == 0.02
    back = transformers.MixtralForCausalLM.from_pretrained(str(out)).eval()
    assert back.config.num_experts_per_tok == 2 and back.config.sliding_window is None
    np.testing.assert_array_equal(hf_logits(back, lm_batch(0)), reference)
    assert hf.load_pretrained(out)[0].config == model.config


def test_scanned_fused_layout_parity_and_back(mixtral, tmp_path):
    """The MoE leaves gain a leading layers axis under scan_layers and convert back."""
    _, reference, v5, _, _, state = mixtral
    model, variables = hf.load_pretrained(v5, dtype="float32", scan_layers=True,
                                          fuse_qkv=True)
    mlp = variables["params"]["decoder"]["layers"]["mlp"]
    assert mlp["wi_0"]["kernel"].shape == (LAYERS, EXPERTS, HIDDEN, INTER)
    assert mlp["router"]["kernel"].shape == (LAYERS, HIDDEN, EXPERTS)
    assert max_diff(model, variables, lm_batch(0), reference) < TOL
    written = load_file(hf.save_pretrained(model, variables, tmp_path) / WEIGHTS)
    assert written.keys() == state.keys()
    for name, a in state.items():
        np.testing.assert_array_equal(written[name], a, err_msg=name)


def test_cli_from_hf_and_back(mixtral, tmp_path, capsys):
    _, _, _, v4, _, state = mixtral
    text, written = hf_tests.convert_there_and_back(v4, tmp_path)
    lines = text.splitlines()  # the experts' settings as the shared macros
    assert "NUM_EXPERTS = 4" in lines and "ROUTING = 'dropless'" in lines
    assert "DecoderConfig.num_experts = %NUM_EXPERTS" in lines
    assert written.keys() == state.keys()
    for name, a in state.items():
        np.testing.assert_array_equal(written[name], a, err_msg=name)


def test_shipped_tiny_config_exports_with_the_same_logits(tmp_path):
    """t5lite -> HF: configs/models/mixtral/tiny.gin with random weights, written and read
    by transformers, gives t5lite's logits."""
    import dataclasses

    import t5lite.config.registry  # noqa: F401  (gin registrations)
    from t5lite.config import parsing
    try:
        parsing.parse_gin(["models/mixtral/tiny.gin"])
        cfg = dataclasses.replace(parsing.resolve_macro("MODEL").config, dtype="float32")
    finally:
        gin.clear_config()
    model = model_for_config(cfg)
    rng = np.random.RandomState(5)
    variables = jax.tree.map(
        lambda s: (1.0 + 0.2 * rng.normal(size=s.shape) if len(s.shape) == 1 else
                   rng.normal(size=s.shape) / np.sqrt(s.shape[-2])).astype(np.float32),
        model.abstract_variables())
    hf.save_pretrained(model, variables, tmp_path)
    back = transformers.MixtralForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert back.config.num_local_experts == cfg.num_experts == 4
    batch = lm_batch(1)
    assert max_diff(model, variables, batch, hf_logits(back, batch)) < TOL


# ----------------------------------------------------------------------------- refusals


def test_expert_count_disagreements_are_one_line(mixtral, tmp_path, capsys):
    _, _, _, _, config, state = mixtral
    v4 = to_v4(state)
    for w in ("w1", "w2", "w3"):
        del v4[v4_name(1, 3, w)]
    path = write_dir(tmp_path / "v4_missing", config, v4)
    with pytest.raises(ValueError) as e:
        hf.load_pretrained(path)
    one_line_error(e, "model.layers.1.block_sparse_moe holds 3 expert(s)",
                   "num_local_experts is 4", "expert(s) [3] missing")
    assert convert_cli.main(["--from=hf", f"--input={path}",
                             f"--output={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "[3] missing" in err[0]

    v4 = to_v4(state)
    del v4[v4_name(0, 2, "w3")]
    with pytest.raises(ValueError) as e:
        hf.load_pretrained(write_dir(tmp_path / "v4_w3", config, v4))
    one_line_error(e, v4_name(0, 2, "w3"), "is missing")

    short = dict(state)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    short[name] = np.ascontiguousarray(state[name][:3])
    with pytest.raises(ValueError) as e:
        hf.load_pretrained(write_dir(tmp_path / "v5_short", config, short))
    one_line_error(e, name, "3 experts, but config.json's num_local_experts is 4")

    with pytest.raises(ValueError) as e:  # config.json says 5: both layouts say so
        hf.load_pretrained(write_dir(tmp_path / "v5_cfg", {**config, "num_local_experts": 5},
                                     state))
    one_line_error(e, "4 experts, but config.json's num_local_experts is 5")
    with pytest.raises(ValueError) as e:
        hf.load_pretrained(write_dir(tmp_path / "v4_cfg", {**config, "num_local_experts": 5},
                                     to_v4(state)))
    one_line_error(e, "holds 4 expert(s), but config.json's num_local_experts is 5",
                   "expert(s) [4] missing")


@pytest.mark.parametrize("change,fragment", [
    ({"sliding_window": 0}, "sliding_window: expected a whole number >= 1"),
    ({"num_experts_per_tok": 1}, "num_experts_per_tok: 1 is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_unsupported_mixtral_configs_are_one_line(mixtral, change, fragment):
    config = mixtral[4]
    with pytest.raises(ValueError) as e:
        hf_config.config_from_hf({**config, **change})
    one_line_error(e, fragment)
    wide = hf_config.config_from_hf({**config, "sliding_window": 64})  # the whole context
    assert wide.num_experts == EXPERTS and wide.sliding_window is None
    # a window shorter than the context is Mistral's, which t5lite's masks hold
    assert hf_config.config_from_hf({**config, "sliding_window": 16}).sliding_window == 16


MOE_TINY = dict(vocab_size=VOCAB, emb_dim=HIDDEN, num_heads=4, num_kv_heads=2, head_dim=8,
                num_layers=LAYERS, mlp_dim=INTER, num_experts=EXPERTS, routing="dropless")


@pytest.mark.parametrize("change,fragment", [
    ({"routing": "capacity"}, "routing='capacity'"),
    ({"moe_every": 2}, "moe_every=2"),
    ({"expert_mlp": "relu"}, "expert_mlp='relu'"),
    ({"moe_top_k": 1}, "moe_top_k=1"),
])
def test_save_refuses_moe_settings_mixtral_lacks(change, fragment, tmp_path):
    model = model_for_config(DecoderConfig(**{**MOE_TINY, **change}))
    with pytest.raises(ValueError) as e:
        hf.save_pretrained(model, {"params": {}}, tmp_path)
    one_line_error(e, "writes mixture-of-experts decoders as Mixtral", fragment)
    assert not (tmp_path / WEIGHTS).exists()
