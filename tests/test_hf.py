"""Hugging Face interop: random-weight transformers models (PyTorch, CPU, float32) saved
as safetensors load into t5lite with the same logits; t5lite models saved with
`save_pretrained` load back exactly and into transformers with the same logits."""
import dataclasses
import functools
import json
import logging

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from t5lite.interop import hf  # noqa: E402
from t5lite.models.configs import DecoderConfig, T5Config  # noqa: E402
from t5lite.models.model import DecoderOnlyModel, EncoderDecoderModel  # noqa: E402

TOL = 1e-4
VOCAB = 160
T5_DIMS = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
               num_decoder_layers=2, num_heads=4, dropout_rate=0.0)
LLAMA_DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  max_position_embeddings=128)


@pytest.fixture(autouse=True)
def _quiet_transformers():
    # "both tied weights are present with different values": expected for untied T5.
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)


# ----------------------------------------------------------------------------- helpers


def make_hf_t5(seed, untie=False, **kw):
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(
        transformers.T5Config(**{**T5_DIMS, **kw})).eval()
    if untie:  # transformers 5.x ties lm_head at init; give it its own weights
        model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, T5_DIMS["d_model"]))
    return model


def make_hf_llama(seed, **kw):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**{**LLAMA_DIMS, **kw})).eval()


def far_from_init(model):
    """Give a transformers model's weights scales far from its init (norm scales near 1,
    matrices std 1/sqrt(fan-in)), so that every part (experts, routers) matters."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return model


def convert_there_and_back(hf_dir, tmp_path):
    """`python -m t5lite.convert --from=hf` of `hf_dir`, then `--to=hf` of the checkpoint
    with the model.gin it wrote: (that model.gin's text, the written tensors)."""
    import gin
    from safetensors.numpy import load_file
    from t5lite import convert as convert_cli
    ckpt, out = tmp_path / "ckpt", tmp_path / "hf"
    assert convert_cli.main(["--from=hf", f"--input={hf_dir}", f"--output={ckpt}"]) == 0
    try:
        assert convert_cli.main(["--to=hf", f"--input={ckpt}", f"--output={out}",
                                 f"--gin_file={ckpt / 'model.gin'}"]) == 0
    finally:
        gin.clear_config()
    assert_macros_reach(ckpt / "model.gin")
    return (ckpt / "model.gin").read_text(), load_file(out / "model.safetensors")


def assert_macros_reach(model_gin):
    """A converted model.gin takes the shared macros as a shipped model file does: a
    switch (REMAT_POLICY) and a mixture-of-experts setting (CAPACITY_FACTOR, the one
    docs/moe.md tells users to set) given after it reach the config."""
    import dataclasses
    import gin
    from t5lite.config import parsing
    try:
        parsing.parse_gin([str(model_gin)])
        plain = parsing.resolve_macro("MODEL").config
        parsing.parse_gin([str(model_gin)], ["REMAT_POLICY = 'full'", "CAPACITY_FACTOR = 1.5"])
        changed = parsing.resolve_macro("MODEL").config
    finally:
        gin.clear_config()
    assert changed == dataclasses.replace(plain, remat_policy="full", capacity_factor=1.5)


def save_hf(model, path, **kw):
    model.save_pretrained(str(path), safe_serialization=True, **kw)
    return path


def t5_batch(seed, enc_len=40, dec_len=24, enc_valid=(40, 25, 33), dec_valid=(24, 10, 19)):
    """Right-padded batch (pad 0); decoder inputs = targets shifted right with 0."""
    rng = np.random.RandomState(seed)
    enc = rng.randint(2, VOCAB, size=(len(enc_valid), enc_len)).astype(np.int32)
    tgt = rng.randint(2, VOCAB, size=(len(dec_valid), dec_len)).astype(np.int32)
    for i, (e, d) in enumerate(zip(enc_valid, dec_valid)):
        enc[i, e:] = 0
        tgt[i, d:] = 0
    return {"encoder_input_tokens": enc, "decoder_target_tokens": tgt,
            "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0)))}


def hf_t5_logits(model, batch):
    enc, tgt = batch["encoder_input_tokens"], batch["decoder_target_tokens"]
    with torch.no_grad():
        out = model(input_ids=torch.tensor(enc, dtype=torch.long),
                    attention_mask=torch.tensor(enc != 0, dtype=torch.long),
                    decoder_input_ids=torch.tensor(batch["decoder_input_tokens"],
                                                   dtype=torch.long),
                    decoder_attention_mask=torch.tensor(tgt != 0, dtype=torch.long))
    return out.logits.float().numpy()


def lm_batch(seed, length=20, valid=(20, 13), vocab=VOCAB):
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, vocab, size=(len(valid), length + 1)).astype(np.int32)
    mask = np.arange(length)[None, :] < np.asarray(valid)[:, None]
    return {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
            "decoder_loss_weights": mask.astype(np.float32)}


def hf_lm_logits(model, batch):
    mask = batch["decoder_loss_weights"] > 0
    with torch.no_grad():
        out = model(input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long))
    return out.logits.float().numpy()


@functools.lru_cache(maxsize=None)
def _jitted_logits(cfg):
    model = (EncoderDecoderModel if isinstance(cfg, T5Config) else DecoderOnlyModel)(cfg)
    return jax.jit(model.logits)


def logits(model, variables, batch):
    """t5lite logits, one compilation per (config, shapes) across the module."""
    return np.asarray(_jitted_logits(model.config)(variables, batch))


def random_variables(model, seed):
    """Random float32 weights for `model` (cheaper than `model.init` on CPU): norm scales
    near 1, matrices with std 1/sqrt(leading dim)."""
    rng = np.random.RandomState(seed)

    def draw(s):
        if len(s.shape) == 1:
            return (1.0 + 0.2 * rng.normal(size=s.shape)).astype(np.float32)
        return (rng.normal(size=s.shape) / np.sqrt(s.shape[0])).astype(np.float32)

    return jax.tree.map(draw, model.abstract_variables())


def valid_positions(batch):
    if "decoder_loss_weights" in batch:
        return batch["decoder_loss_weights"] > 0
    return batch["decoder_target_tokens"] != 0


def max_diff(ours, theirs, batch):
    mask = valid_positions(batch)
    return float(np.max(np.abs(np.asarray(ours) - theirs)[mask]))


def leaves(tree):
    return {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def assert_trees_equal(a, b):
    la, lb = leaves(a), leaves(b)
    assert la.keys() == lb.keys()
    for k in la:
        assert la[k].dtype == lb[k].dtype == np.float32, k
        np.testing.assert_array_equal(la[k], lb[k], err_msg=k)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def t5_v11(tmp_path_factory):
    """T5 v1.1: gated-gelu, untied lm_head, 16 buckets / max distance 16."""
    model = make_hf_t5(0, untie=True, feed_forward_proj="gated-gelu",
                       tie_word_embeddings=False, relative_attention_num_buckets=16,
                       relative_attention_max_distance=16)
    return model, save_hf(model, tmp_path_factory.mktemp("t5_v11"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = make_hf_llama(2, rope_theta=5000.0)
    return model, save_hf(model, tmp_path_factory.mktemp("llama"))


# ----------------------------------------------------------------------------- parity


def test_t5_v11_parity_padding_beyond_max_distance(t5_v11):
    hf_model, path = t5_v11
    model, variables = hf.load_pretrained(path, dtype="float32")
    cfg = model.config
    assert cfg.mlp_activations == ("gelu", "linear") and not cfg.logits_via_embedding
    assert (cfg.relpos_num_buckets, cfg.relpos_max_distance) == (16, 16)
    assert (cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (32, 4, 8, 64)
    np.testing.assert_array_equal(variables["params"]["decoder"]["logits_dense"]["kernel"],
                                  hf_model.lm_head.weight.detach().numpy().T)
    batch = t5_batch(0)
    diff = max_diff(logits(model, variables, batch), hf_t5_logits(hf_model, batch), batch)
    print(f"\nT5 v1.1 (untied, padded, lengths 40/24 > max distance 16): max |diff| = {diff:.3g}")
    assert diff <= TOL


def test_t5_v11_parity_default_max_distance(tmp_path):
    hf_model = make_hf_t5(1, untie=True, feed_forward_proj="gated-gelu",
                          tie_word_embeddings=False)
    model, variables = hf.load_pretrained(save_hf(hf_model, tmp_path), dtype="float32")
    assert (model.config.relpos_num_buckets, model.config.relpos_max_distance) == (32, 128)
    batch = t5_batch(1, 140, 132, enc_valid=[140, 97], dec_valid=[132, 60])
    diff = max_diff(logits(model, variables, batch), hf_t5_logits(hf_model, batch), batch)
    print(f"\nT5 v1.1 (max distance 128, lengths 140/132): max |diff| = {diff:.3g}")
    assert diff <= TOL


def test_t5_original_tied_relu_parity(tmp_path):
    hf_model = make_hf_t5(3, feed_forward_proj="relu", relative_attention_num_buckets=16,
                          relative_attention_max_distance=16)  # tie_word_embeddings default
    assert hf_model.config.scale_decoder_outputs
    model, variables = hf.load_pretrained(save_hf(hf_model, tmp_path), dtype="float32")
    assert model.config.mlp_activations == ("relu",) and model.config.logits_via_embedding
    assert "logits_dense" not in variables["params"]["decoder"]
    batch = t5_batch(3)
    diff = max_diff(logits(model, variables, batch), hf_t5_logits(hf_model, batch), batch)
    print(f"\nT5 original (relu, tied, d_model**-0.5): max |diff| = {diff:.3g}")
    assert diff <= TOL


@pytest.mark.parametrize("untie, tie, scaled", [(False, False, False), (True, None, True)],
                         ids=["v11_lm_head_is_embedding", "scaled_distinct_lm_head"])
def test_t5_output_head_variants(tmp_path, untie, tie, scaled):
    """transformers 5.x: an unscaled T5 whose lm_head stays tied to `shared` (a fresh
    v1.1 model) -> logits_dense is a copy of the embedding; a scaled one with a distinct
    lm_head -> logits_dense with d_model**-0.5 folded in."""
    kw = {} if tie is None else {"tie_word_embeddings": tie}
    hf_model = make_hf_t5(4, untie=untie, feed_forward_proj="gated-gelu",
                          relative_attention_num_buckets=16,
                          relative_attention_max_distance=16, **kw)
    assert hf_model.config.scale_decoder_outputs == scaled
    model, variables = hf.load_pretrained(save_hf(hf_model, tmp_path), dtype="float32")
    assert not model.config.logits_via_embedding
    batch = t5_batch(4)
    diff = max_diff(logits(model, variables, batch), hf_t5_logits(hf_model, batch), batch)
    print(f"\nT5 head variant (lm_head distinct={untie}, scaled={scaled}): "
          f"max |diff| = {diff:.3g}")
    assert diff <= TOL


def test_t5_tied_file_with_lm_head_copy(tmp_path):
    """tie_word_embeddings with an lm_head.weight equal to shared (old conversions)."""
    hf_model = make_hf_t5(3, feed_forward_proj="relu")
    path = save_hf(hf_model, tmp_path)
    from safetensors.numpy import load_file, save_file
    state = load_file(str(path / "model.safetensors"))
    state["lm_head.weight"] = state["shared.weight"].copy()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("scale_decoder_outputs", None)  # a config written by transformers 4.x
    (path / "config.json").write_text(json.dumps(cfg))
    model, _ = hf.load_pretrained(path)
    assert model.config.logits_via_embedding


def test_llama_gqa_parity(llama):
    hf_model, path = llama
    model, variables = hf.load_pretrained(path, dtype="float32")
    cfg = model.config
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.rope_theta == 5000.0 and cfg.layer_norm_epsilon == 1e-5
    assert not cfg.tie_embeddings
    batch = lm_batch(2)
    diff = max_diff(logits(model, variables, batch), hf_lm_logits(hf_model, batch), batch)
    print(f"\nLLaMA (4 heads, 2 kv heads): max |diff| = {diff:.3g}")
    assert diff <= TOL


def test_llama_attention_bias_only_parity(tmp_path):
    """attention_bias without mlp_bias: use_bias with zero MLP biases."""
    hf_model = make_hf_llama(6, attention_bias=True)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    model, variables = hf.load_pretrained(save_hf(hf_model, tmp_path), dtype="float32")
    assert model.config.use_bias
    assert not np.any(variables["params"]["decoder"]["layers_0"]["mlp"]["wo"]["bias"])
    batch = lm_batch(6)
    diff = max_diff(logits(model, variables, batch), hf_lm_logits(hf_model, batch), batch)
    print(f"\nLLaMA (attention_bias only): max |diff| = {diff:.3g}")
    assert diff <= TOL


def test_llama_bfloat16_file_loads(tmp_path):
    hf_model = make_hf_llama(4).to(torch.bfloat16)
    model, variables = hf.load_pretrained(save_hf(hf_model, tmp_path))
    emb = variables["params"]["token_embedder"]["embedding"]
    assert emb.dtype == np.float32
    np.testing.assert_array_equal(
        emb, hf_model.model.embed_tokens.weight.detach().float().numpy())


# ----------------------------------------------------------------------------- round trip

# The same architectures as the transformers-built models above (one compilation each).
T5_V11_TINY = T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=4, head_dim=8,
                       num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64,
                       relpos_num_buckets=16, relpos_max_distance=16, dtype="float32")
T5_ORIG_TINY = dataclasses.replace(T5_V11_TINY, mlp_activations=("relu",),
                                   logits_via_embedding=True)
LLAMA_TINY = DecoderConfig(vocab_size=VOCAB, emb_dim=64, num_heads=4, num_kv_heads=2,
                           head_dim=16, num_layers=2, mlp_dim=96, rope_theta=5000.0,
                           layer_norm_epsilon=1e-5, max_length=128, dtype="float32")
LLAMA_TIED = dataclasses.replace(LLAMA_TINY, tie_embeddings=True, num_kv_heads=None)


@pytest.mark.parametrize("cfg", [T5_V11_TINY, T5_ORIG_TINY, LLAMA_TINY, LLAMA_TIED],
                         ids=["t5_v11", "t5_tied", "llama_gqa", "llama_tied"])
def test_round_trip_t5lite_hf_t5lite(cfg, tmp_path):
    is_t5 = isinstance(cfg, T5Config)
    model = (EncoderDecoderModel if is_t5 else DecoderOnlyModel)(cfg)
    variables = random_variables(model, 0)
    hf.save_pretrained(model, variables, tmp_path)
    assert not list(tmp_path.glob("*.bin"))

    model2, variables2 = hf.load_pretrained(tmp_path, dtype="float32")
    assert model2.config == cfg
    assert_trees_equal(variables, variables2)

    auto = (transformers.T5ForConditionalGeneration if is_t5
            else transformers.LlamaForCausalLM)
    hf_model = auto.from_pretrained(str(tmp_path)).eval()
    if is_t5:
        batch = t5_batch(5)
        theirs = hf_t5_logits(hf_model, batch)
    else:
        batch = lm_batch(5)
        theirs = hf_lm_logits(hf_model, batch)
    diff = max_diff(logits(model, variables, batch), theirs, batch)
    print(f"\nsave_pretrained -> transformers ({model.config.__class__.__name__}): "
          f"max |diff| = {diff:.3g}")
    assert diff <= TOL


def test_sharded_checkpoint_loads(t5_v11, tmp_path):
    hf_model, single = t5_v11
    save_hf(hf_model, tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert not (tmp_path / "model.safetensors").exists()
    model_a, vars_a = hf.load_pretrained(single)
    model_b, vars_b = hf.load_pretrained(tmp_path)
    assert model_a.config == model_b.config
    assert_trees_equal(vars_a, vars_b)


# ----------------------------------------------------------------------------- layouts


def test_fused_scanned_overrides(t5_v11, llama, tmp_path):
    from t5lite.models import layouts
    for (_, path), batch in ((t5_v11, t5_batch(7)), (llama, lm_batch(7))):
        base_model, base_vars = hf.load_pretrained(path, dtype="float32")
        for over in ({"fuse_qkv": True}, {"scan_layers": True}):
            model, variables = hf.load_pretrained(path, dtype="float32", **over)
            assert model.config == dataclasses.replace(base_model.config, **over)
            want = layouts.convert_params(base_vars, base_model.config, model.config)
            assert_trees_equal(want, variables)
        model, variables = hf.load_pretrained(path, dtype="float32", fuse_qkv=True,
                                              scan_layers=True)
        shapes = jax.tree.map(lambda s: s.shape, model.abstract_variables())
        assert jax.tree.map(np.shape, variables) == shapes
        np.testing.assert_allclose(logits(model, variables, batch),
                                   logits(base_model, base_vars, batch), atol=TOL, rtol=0)
        # saving from the fused + scanned layout gives back the plain layout exactly
        out = tmp_path / type(model.config).__name__
        hf.save_pretrained(model, variables, out)
        _, again = hf.load_pretrained(out, dtype="float32")
        assert_trees_equal(base_vars, again)


# ----------------------------------------------------------------------------- refusals


def test_pickle_only_directory_refused_without_unpickling(tmp_path, monkeypatch):
    import pickle
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", **T5_DIMS}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04garbage, not a pickle" * 8)

    def boom(*a, **k):
        raise AssertionError("something tried to unpickle")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(torch, "load", boom)
    with pytest.raises(ValueError, match=r"pickle.*refuses to unpickle.*safetensors"):
        hf.load_pretrained(tmp_path)


def test_missing_directory_and_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        hf.load_pretrained(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **LLAMA_DIMS}))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        hf.load_pretrained(tmp_path)


def _hf_dir(tmp_path, name, source, weights: bytes):
    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text((source / "config.json").read_text())
    (out / "model.safetensors").write_bytes(weights)
    return out


def _refused(path, *parts):
    from t5lite.errors import CheckpointDamagedError
    with pytest.raises(CheckpointDamagedError) as e:
        hf.load_pretrained(path)
    message = str(e.value)
    assert "\n" not in message and "copied incompletely" in message, message
    for part in parts:
        assert part in message, (part, message)


def test_weights_not_all_there_are_refused_naming_file_and_tensor(t5_v11, tmp_path):
    """A safetensors file cut short (in its data, its header, its header length), a header
    whose byte ranges disagree with the shapes, a shard the index names that is absent, a
    tensor the index names that its shard lacks: one line naming the file and tensor."""
    from safetensors.numpy import load_file, save_file
    hf_model, single = t5_v11
    data = (single / "model.safetensors").read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    names = [k for k in header if k != "__metadata__"]
    last = max(names, key=lambda k: header[k]["data_offsets"][1])
    cut = _hf_dir(tmp_path, "cut", single, data[:-1])
    _refused(cut, f"{cut / 'model.safetensors'} is cut short", f"tensor {last!r}",
             f"1 of its {len(names)} tensors run past the end")
    half = _hf_dir(tmp_path, "half", single, data[:8 + length // 2])
    _refused(half, str(half / "model.safetensors"), f"its header says {length} bytes")
    _refused(_hf_dir(tmp_path, "stub", single, data[:5]), "5 bytes, not even")

    first = min(names, key=lambda k: header[k]["data_offsets"][0])
    header[first]["shape"] = [1]
    text = json.dumps(header).encode()
    _refused(_hf_dir(tmp_path, "header", single, len(text).to_bytes(8, "little") + text +
                     data[8 + length:]), f"tensor {first!r} spans bytes", "damaged header")

    sharded = save_hf(hf_model, tmp_path / "sharded", max_shard_size="20KB")
    weight_map = json.loads((sharded / hf.INDEX_NAME).read_text())["weight_map"]
    head_shard = sharded / weight_map["lm_head.weight"]
    tensors = load_file(head_shard)
    del tensors["lm_head.weight"]  # read anyway, the head would silently become the tied one
    save_file(tensors, head_shard, metadata={"format": "pt"})
    _refused(sharded, "names tensor 'lm_head.weight'", f"in shard {head_shard.name}",
             str(sharded))
    other = sorted(set(weight_map.values()) - {head_shard.name})[0]
    (sharded / other).unlink()
    _refused(sharded, f"missing shard {other}", str(sharded))


@pytest.mark.parametrize("change, field", [
    ({"model_type": "bert"}, "model_type"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "rope_parameters"),
    ({"hidden_act": "gelu_fast"}, "hidden_act"),
])
def test_unsupported_config_fields_named(llama, tmp_path, change, field):
    _, path = llama
    cfg = {**json.loads((path / "config.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
    with pytest.raises(ValueError, match=field):
        hf.load_pretrained(tmp_path)


def test_bad_overrides_refused(llama):
    _, path = llama
    with pytest.raises(ValueError, match="unknown config override"):
        hf.load_pretrained(path, not_a_field=1)
    with pytest.raises(ValueError, match="shape|architecture"):
        hf.load_pretrained(path, emb_dim=128)


def test_save_pretrained_refuses_gpt(tmp_path):
    cfg = DecoderConfig(vocab_size=VOCAB, emb_dim=32, num_heads=4, head_dim=8, num_layers=1,
                        mlp_dim=48, mlp_activations=("gelu",), norm_type="layer",
                        position_embedding="learned", max_length=32, use_bias=True)
    model = DecoderOnlyModel(cfg)
    with pytest.raises(ValueError, match="norm_type.*position_embedding"):
        hf.save_pretrained(model, random_variables(model, 0), tmp_path)


def test_special_token_ids_travel_both_ways():
    """bos / eos ids from an HF config into the t5lite config and back out: transformers'
    defaults when absent (LLaMA 1 / 2, T5 EOS 1), the first of an EOS list, and a
    t5lite-trained model's own ids (0 / 1) written as they are."""
    from t5lite.interop import hf_config, hf_decoder_config
    llama = hf_decoder_config.decoder_hf_config(LLAMA_TINY)
    assert (llama["bos_token_id"], llama["eos_token_id"]) == (0, 1)  # T5-style vocabulary
    del llama["bos_token_id"], llama["eos_token_id"]
    cfg = hf_config.config_from_hf(llama)
    assert (cfg.bos_id, cfg.eos_id) == (1, 2)  # LlamaConfig's defaults
    cfg = hf_config.config_from_hf({**llama, "bos_token_id": 5, "eos_token_id": [7, 9]})
    assert (cfg.bos_id, cfg.eos_id) == (5, 7)
    out = hf_decoder_config.decoder_hf_config(cfg)
    assert (out["bos_token_id"], out["eos_token_id"]) == (5, 7)
    t5 = hf_config.t5_hf_config(dataclasses.replace(T5_V11_TINY, eos_id=3))
    assert t5["eos_token_id"] == 3 and hf_config.config_from_hf(t5).eos_id == 3
    with pytest.raises(ValueError, match="eos_token_id"):
        hf_config.config_from_hf({**llama, "eos_token_id": "</s>"})
