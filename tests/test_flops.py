"""Model-FLOP formulas (REFERENCE.md, "Model FLOPs")."""
import pytest

from t5lite.models import flops
from t5lite.models.configs import DecoderConfig, T5Config

T5_SIZES = {  # name: (d_model, heads, layers per stack, d_ff, GFLOP per example at 512/128)
    "small": (512, 6, 8, 1024, 110),
    "base": (768, 12, 12, 2048, 437),
    "large": (1024, 16, 24, 2816, 1501),
    "xl": (2048, 32, 24, 5120, 5467),
    "xxl": (4096, 64, 24, 10240, 21371),
}


@pytest.mark.parametrize("size", list(T5_SIZES))
def test_t5_v1_1_reference_gflops(size):
    d, h, layers, ff, gflop = T5_SIZES[size]
    cfg = T5Config(emb_dim=d, num_heads=h, head_dim=64, num_encoder_layers=layers,
                   num_decoder_layers=layers, mlp_dim=ff)
    got = flops.encoder_decoder_train_flops_per_example(cfg, 512, 128)
    assert round(got / 1e9) == gflop
    assert flops.train_flops_per_example(cfg, inputs_length=512, targets_length=128) == got


def _toy_decoder(**kw):
    base = dict(vocab_size=10, emb_dim=8, num_heads=2, num_kv_heads=1, head_dim=4,
                num_layers=2, mlp_dim=16)
    return DecoderConfig(**{**base, **kw})


def test_decoder_only_by_hand_gated_gqa():
    cfg = _toy_decoder(mlp_activations=("silu", "linear"))
    # d=8, H=2, Hkv=1, hd=4, ff=16, n_in=2, V=10, L=2, S=6
    qkv = 2 * 8 * (2 + 2 * 1) * 4          # 256
    out = 2 * 8 * 2 * 4                    # 128
    mlp = 2 * 8 * 16 * (2 + 1)             # 768
    attn = 4 * 6 * 2 * 4 // 2              # 96 (causal: halved)
    assert qkv + out + mlp + attn == 1248
    forward = 2 * 1248 + 2 * 8 * 10        # 2656
    assert flops.decoder_only_train_flops_per_token(cfg, 6) == 3 * forward == 7968
    assert flops.decoder_only_train_flops_per_example(cfg, 6) == 6 * 7968 == 47808
    assert flops.train_flops_per_example(cfg, seq_length=6) == 47808


def test_a_sliding_window_counts_the_keys_a_query_sees():
    """Mistral's window W < S: W - W^2 / (2 S) keys a query on average (S / 2 at W = S,
    the causal convention); a window as long as the sequence counts as none."""
    plain = _toy_decoder(mlp_activations=("silu", "linear"))
    windowed = _toy_decoder(mlp_activations=("silu", "linear"), sliding_window=2)
    attn = 4 * 2 * 4 * (2 * 6 * 2 - 2 * 2) // (2 * 6)   # 53 (96 without the window)
    per_token = 3 * (2 * (256 + 128 + 768 + attn) + 2 * 8 * 10)
    assert flops.decoder_only_train_flops_per_token(windowed, 6) == per_token == 7710
    for wide in (6, 7):
        cfg = _toy_decoder(mlp_activations=("silu", "linear"), sliding_window=wide)
        assert (flops.decoder_only_train_flops_per_token(cfg, 6)
                == flops.decoder_only_train_flops_per_token(plain, 6) == 7968)


def test_decoder_only_by_hand_plain_gelu():
    cfg = _toy_decoder(mlp_activations=("gelu",), num_kv_heads=None)
    # MHA: Hkv = H = 2; one MLP input projection (n_in = 1)
    per_layer = 2 * 8 * (2 + 4) * 4 + 2 * 8 * 2 * 4 + 2 * 8 * 16 * 2 + 4 * 6 * 2 * 4 // 2
    assert per_layer == 384 + 128 + 512 + 96 == 1120
    assert flops.decoder_only_train_flops_per_token(cfg, 6) == 3 * (2 * 1120 + 160) == 7200


def test_rejects_other_configs():
    with pytest.raises(TypeError):
        flops.train_flops_per_example(object())


def test_decoder_only_lora_by_hand():
    """LoRA: frozen weight matmuls 2 x forward, attention 3 x, each adapter 3 x."""
    cfg = _toy_decoder(mlp_activations=("silu", "linear"), lora_rank=2,
                       lora_targets=("query", "value", "wi_0", "wo"))
    weights = 2 * (256 + 128 + 768) + 2 * 8 * 10   # 2464 (as above, with the logits)
    attention = 2 * 96                              # 192
    adapters = 2 * (2 * 2 * (8 + 8)                 # query [8, 2x4]
                    + 2 * 2 * (8 + 4)               # value [8, 1x4] (GQA)
                    + 2 * 2 * (8 + 16)              # wi_0 [8, 16]
                    + 2 * 2 * (16 + 8))             # wo [16, 8]
    assert (weights, attention, adapters) == (2464, 192, 608)
    assert flops.decoder_only_train_flops_per_token(cfg, 6) == 2 * 2464 + 3 * 192 + 3 * 608
    full = _toy_decoder(mlp_activations=("silu", "linear"))
    assert flops.decoder_only_train_flops_per_token(full, 6) == 3 * (2464 + 192) == 7968
    assert flops.train_flops_per_example(cfg, seq_length=6) == 6 * 7328


def test_encoder_decoder_lora_by_hand():
    """A T5 with adapters on query, key, out (every attention, cross-attention too) and wo;
    d=8, 2 heads of 4, one layer a stack, ff=16 (one MLP input), V=10, 4 inputs, 3 targets."""
    kw = dict(vocab_size=10, emb_dim=8, num_heads=2, head_dim=4, num_encoder_layers=1,
              num_decoder_layers=1, mlp_dim=16, mlp_activations=("relu",))
    cfg = T5Config(**kw, lora_rank=2, lora_targets=("query", "key", "out", "wo"))
    weights = 4 * (8 * 8 * 8 + 2 * 8 * 16 * 2 + 4 * 8 * 8) + 3 * (12 * 8 * 8 + 512 + 160)
    attention = 4 * 4 * 4 * 8 + 3 * (2 * 3 * 8 + 4 * 4 * 8)
    proj, wo = 2 * 2 * (8 + 8), 2 * 2 * (16 + 8)    # an adapter on [8, 8]; on wo [16, 8]
    adapters = (4 * (3 * proj + wo)                 # encoder: q, k, o, wo
                + 3 * (2 * 2 * proj + proj + wo)    # decoder: self q, o, k; cross q, o; wo
                + 4 * proj)                         # cross-attention k of each input token
    assert (weights, attention, adapters) == (9440, 1040, 2656)
    assert flops.encoder_decoder_train_flops_per_example(cfg, 4, 3) == \
        2 * 9440 + 3 * 1040 + 3 * 2656 == 29968
    assert flops.encoder_decoder_train_flops_per_example(T5Config(**kw), 4, 3) == \
        3 * (9440 + 1040)
