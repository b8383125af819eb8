"""LLaMA's kin from and to Hugging Face: random tiny transformers models (CPU, float32) of
LLaMA-3.1 (its "llama3" RoPE scaling, read from transformers 5's `rope_parameters` and
4's `rope_scaling`), Mistral (a sliding window shorter than the sequence), Qwen2 (query /
key / value biases) and Qwen3 (per-head query / key norms) load into t5lite with the same
logits, decode greedily with the KV cache as transformers' `generate` does, and convert
back tensor for tensor; what t5lite cannot hold is one line naming the field."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import test_hf as hf_tests  # noqa: E402
from test_hf import convert_there_and_back, far_from_init, hf_lm_logits, lm_batch  # noqa: E402
from t5lite.interop import hf, hf_config  # noqa: E402

TOL = 1e-4
VOCAB, EOS = 160, 2
DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            max_position_embeddings=128, bos_token_id=1, eos_token_id=EOS)
# head_dim 16 at theta 500: wavelengths 6.3, 13.3, 28, 59, ... tokens, so with an original
# context of 16 and frequency factors 1 / 2 the three bands are all there (6.3 kept, 13.3
# blended, the rest divided by 4), and positions 16.. of a 20-token row lie past it.
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
          "high_freq_factor": 2.0, "original_max_position_embeddings": 16}
KIN = {
    "llama3_1": (transformers.LlamaForCausalLM, transformers.LlamaConfig,
                 dict(rope_parameters=LLAMA3)),
    "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig,
                dict(sliding_window=6, rope_theta=5000.0)),
    "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, dict(rope_theta=5000.0)),
    "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config, dict(rope_theta=5000.0)),
}


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()


@functools.lru_cache(maxsize=None)
def _saved(kind, root):
    model_cls, config_cls, extra = KIN[kind]
    torch.manual_seed(len(kind))
    model = far_from_init(model_cls(config_cls(**{**DIMS, **extra})).eval())
    path = root / kind
    model.save_pretrained(str(path), safe_serialization=True)
    return model, path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("kin")
    return lambda kind: _saved(kind, root)


@pytest.mark.parametrize("kind", sorted(KIN))
def test_logits_equal_transformers_and_convert_back(kind, saved, tmp_path):
    hf_model, path = saved(kind)
    model, variables = hf.load_pretrained(path, dtype="float32")
    cfg = model.config
    assert (cfg.rope_scaling == "llama3") == (kind == "llama3_1")
    assert cfg.sliding_window == (6 if kind == "mistral" else None)
    assert (cfg.qkv_bias, cfg.qk_norm) == (kind == "qwen2", kind == "qwen3")
    batch = lm_batch(3, length=20, valid=(20, 14), vocab=VOCAB)
    theirs = hf_lm_logits(hf_model, batch)
    diff = hf_tests.max_diff(hf_tests.logits(model, variables, batch), theirs, batch)
    print(f"\n{kind}: max |logit diff| = {diff:.3g}")
    assert diff <= TOL

    gin_text, written = convert_there_and_back(path, tmp_path)
    from safetensors.numpy import load_file
    original = load_file(path / "model.safetensors")
    assert written.keys() == original.keys()
    for name, a in original.items():
        np.testing.assert_array_equal(written[name], a, err_msg=name)
    out = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert out["model_type"] == hf_model.config.model_type
    back = type(hf_model).from_pretrained(str(tmp_path / "hf")).eval()
    np.testing.assert_allclose(hf_lm_logits(back, batch), theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(KIN))
def test_greedy_decoding_equals_generate(kind, saved):
    """Prompts of 9 / 4 / 6 tokens and 12 new ones: Mistral's window of 6 slides, and
    LLaMA-3.1's positions pass its original context of 16. Fused q/k/v, SB layout."""
    hf_model, path = saved(kind)
    model, variables = hf.load_pretrained(path, dtype="float32", transpose_bs=True,
                                          fuse_qkv=True)
    steps, lengths = 12, [9, 4, 6]
    rng = np.random.RandomState(len(kind))
    prompts = np.zeros((3, 9), np.int32)
    for r, n in enumerate(lengths):
        prompts[r, :n] = np.concatenate([[1], rng.randint(3, VOCAB, size=n - 1)])
    tokens = np.asarray(jax.jit(functools.partial(
        model.predict_batch, max_decode_length=steps, eos_id=EOS))(
            variables, {"decoder_input_tokens": jnp.asarray(prompts)}))
    for r, n in enumerate(lengths):
        with torch.no_grad():
            ref = hf_model.generate(
                input_ids=torch.tensor(prompts[r:r + 1, :n], dtype=torch.long),
                attention_mask=torch.ones((1, n), dtype=torch.long), do_sample=False,
                num_beams=1, max_new_tokens=steps, eos_token_id=EOS,
                pad_token_id=0).numpy()[0, n:]
        np.testing.assert_array_equal(tokens[r, :len(ref)], ref)
        assert not tokens[r, len(ref):].any()


def test_window_by_lengths_and_jax_attention_equals_einsum(saved):
    """Mistral's window given to jax.nn's attention as `local_window_size` (the mask as
    lengths, ATTENTION_MASK='lengths') and as a dense mask: the einsum path's logits."""
    _, path = saved("mistral")
    batch = lm_batch(4, length=20, valid=(20, 11), vocab=VOCAB)
    ref = None
    for impl, mask in (("xla", "dense"), ("dot_product", "lengths"), ("dot_product", "dense")):
        model, variables = hf.load_pretrained(path, dtype="float32", attention_impl=impl,
                                              attention_mask=mask)
        got = hf_tests.logits(model, variables, batch)
        if ref is None:
            ref = got
        else:
            assert hf_tests.max_diff(got, ref, batch) <= 1e-5, (impl, mask)


def test_llama3_scaling_read_from_transformers_4_rope_scaling(saved, tmp_path):
    """transformers 4's config.json: `rope_scaling` (and `rope_theta` beside it); the same
    config, and the same logits."""
    hf_model, path = saved("llama3_1")
    cfg = json.loads((path / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
    v4 = hf.load_pretrained(tmp_path, dtype="float32")[0].config
    assert v4 == hf.load_pretrained(path, dtype="float32")[0].config
    assert (v4.rope_theta, v4.rope_factor, v4.rope_low_freq_factor, v4.rope_high_freq_factor,
            v4.rope_original_length) == (500.0, 4.0, 1.0, 2.0, 16)


@pytest.mark.parametrize("kind, change, fragment", [
    ("llama3_1", {"rope_parameters": {**LLAMA3, "rope_type": "yarn"}}, "rope type 'yarn'"),
    ("llama3_1", {"rope_parameters": {k: v for k, v in LLAMA3.items() if k != "factor"}},
     "needs a number 'factor'"),
    ("llama3_1", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_scaling: rope type 'dynamic'"),
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 1}, "use_sliding_window"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ("qwen3", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("qwen2", {"eos_token_id": None}, "eos_token_id"),
    ("mistral", {"sliding_window": 0}, "sliding_window"),
])
def test_what_t5lite_cannot_hold_is_one_line(saved, kind, change, fragment):
    _, path = saved(kind)
    cfg = {**json.loads((path / "config.json").read_text()), **change}
    with pytest.raises(ValueError) as e:
        hf_config.config_from_hf(cfg)
    message = str(e.value)
    assert fragment in message and "\n" not in message, message


def test_class_defaults_fill_what_config_json_leaves_out():
    """transformers 5 writes only what differs from its class's defaults: Qwen3's head_dim
    128 (not hidden / heads), Mistral's window 4096 and 8 KV heads, Qwen's vocabulary."""
    qwen3 = hf_config.config_from_hf({"model_type": "qwen3", "hidden_size": 1024,
                                      "num_attention_heads": 16, "eos_token_id": 7})
    assert (qwen3.head_dim, qwen3.vocab_size, qwen3.qk_norm, qwen3.bos_id) == (128, 151936,
                                                                                True, 7)
    mistral = hf_config.config_from_hf({"model_type": "mistral"})
    assert (mistral.sliding_window, mistral.kv_heads, mistral.mlp_dim) == (4096, 8, 14336)
    wide = hf_config.config_from_hf({"model_type": "mistral", "sliding_window": None})
    assert wide.sliding_window is None


SHIPPED_TINY = {"models/llama3/tiny.gin": ("llama", transformers.LlamaForCausalLM),
                "models/mistral/tiny.gin": ("mistral", transformers.MistralForCausalLM),
                "models/qwen2_5/tiny.gin": ("qwen2", transformers.Qwen2ForCausalLM),
                "models/qwen3/tiny.gin": ("qwen3", transformers.Qwen3ForCausalLM)}


@pytest.mark.parametrize("gin_file", sorted(SHIPPED_TINY))
def test_shipped_tiny_configs_are_their_family_in_transformers(gin_file, tmp_path):
    """Each family's shipped tiny config, random weights saved by `save_pretrained`:
    transformers reads it as that family (its model_type and class) and gives t5lite's
    logits on 80-token rows (past LLaMA-3.1 tiny's original context of 64, Mistral
    tiny's window of 16)."""
    import gin
    from t5lite.config import parsing
    try:
        parsing.parse_gin([gin_file], ["ACTIVATION_DTYPE = 'float32'"])
        model = parsing.resolve_macro("MODEL")
    finally:
        gin.clear_config()
    kind, cls = SHIPPED_TINY[gin_file]
    variables = hf_tests.random_variables(model, 5)
    hf.save_pretrained(model, variables, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == kind
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(theirs) is cls
    batch = lm_batch(6, length=80, valid=(80, 51), vocab=model.config.vocab_size)
    diff = hf_tests.max_diff(hf_tests.logits(model, variables, batch),
                             hf_lm_logits(theirs, batch), batch)
    assert diff <= TOL, diff
