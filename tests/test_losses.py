"""Loss values against hand-computed references, and score_batch against log-softmax."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.models.common import losses
from t5lite.models.configs import T5Config
from t5lite.models.model import EncoderDecoderModel

# One token, vocab 3, logits (1, 2, 3), target 2:
#   logsumexp = ln(e + e^2 + e^3) = 3.40760596444438
#   nll = lse - 3 = 0.40760596444438; z-loss(1e-4) = 1e-4 * lse^2 = 0.00116117784089
LOGITS = jnp.array([[[1.0, 2.0, 3.0]]])
TARGET = jnp.array([[2]])


def test_cross_entropy_and_z_loss_by_hand():
    loss, z = losses.cross_entropy_with_logits(LOGITS, TARGET, z_loss=1e-4)
    np.testing.assert_allclose(z[0, 0], 0.00116117784089, rtol=1e-5)
    np.testing.assert_allclose(loss[0, 0], 0.40760596444438 + 0.00116117784089, rtol=1e-5)


def test_label_smoothing_by_hand():
    # smoothing 0.1: target 0.9, others 0.05 each. log p = (-2.4076, -1.4076, -0.4076)
    # -(0.9 * -0.40761 + 0.05 * -2.40761 + 0.05 * -1.40761) = 0.55760597
    # minus the smoothed target's entropy -(0.9 ln 0.9 + 2 * 0.05 ln 0.05) = 0.39439769
    loss, _ = losses.cross_entropy_with_logits(LOGITS, TARGET, label_smoothing=0.1)
    np.testing.assert_allclose(loss[0, 0], 0.16320827, rtol=1e-5)


def _loss_as_written(logits, targets, weights, z_loss, label_smoothing):
    """The weighted loss and z-loss differentiated by autodiff: log-softmax and a one-hot
    smoothed target, the formula of `cross_entropy_with_logits`' docstring."""
    vocab = logits.shape[-1]
    low = label_smoothing / (vocab - 1)
    soft = jax.nn.one_hot(targets, vocab) * (1.0 - label_smoothing - low) + low
    lse = jax.nn.logsumexp(logits, axis=-1)
    entropy = -jnp.sum(jnp.where(soft > 0, soft * jnp.log(soft), 0.0), axis=-1)
    z = z_loss * lse ** 2
    tok = -jnp.sum(soft * jax.nn.log_softmax(logits), axis=-1) + z - entropy
    return jnp.sum(tok * weights) + 0.5 * jnp.sum(z * weights)


@pytest.mark.parametrize("z_loss,label_smoothing", [(0.0, 0.0), (1e-4, 0.0), (0.0, 0.1),
                                                    (1e-2, 0.2)])
def test_the_written_out_gradient_is_autodiffs(z_loss, label_smoothing):
    """`cross_entropy_with_logits`' gradient (written out; both outputs, weighted, the
    z-loss part given its own weight) equals autodiff's of the formula as written."""
    rng = np.random.RandomState(0)
    logits = jnp.asarray(rng.normal(size=(2, 5, 11)) * 3, jnp.float32)
    targets = jnp.asarray(rng.randint(0, 11, size=(2, 5)), jnp.int32)
    weights = jnp.asarray(rng.uniform(size=(2, 5)), jnp.float32)

    def ours(logits):
        tok, z = losses.cross_entropy_with_logits(logits, targets, z_loss, label_smoothing)
        return jnp.sum(tok * weights) + 0.5 * jnp.sum(z * weights)

    value, grad = jax.value_and_grad(ours)(logits)
    ref_value, ref_grad = jax.value_and_grad(_loss_as_written)(logits, targets, weights, z_loss,
                                                               label_smoothing)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-6, rtol=1e-5)
    # bfloat16 logits get a bfloat16 gradient, the same to its rounding
    grad16 = jax.grad(ours)(logits.astype(jnp.bfloat16))
    assert grad16.dtype == jnp.bfloat16
    np.testing.assert_allclose(grad16.astype(jnp.float32), ref_grad, atol=2e-2)


@pytest.mark.parametrize("factor,expected", [
    (None, 0.40760596 * 3),  # token sum over the three weighted tokens
    (6.0, 0.40760596 * 3 / 6.0),
    (losses.NUM_REAL_TARGET_TOKENS, 0.40760596),
])
def test_normalizing_factor(factor, expected):
    logits = jnp.tile(LOGITS, (1, 4, 1))  # four identical tokens, the last one weighted 0
    targets = jnp.array([[2, 2, 2, 0]])
    weights = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    loss, _ = losses.weighted_loss(logits, targets, weights, loss_normalizing_factor=factor)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_unknown_normalizing_factor_is_rejected():
    with pytest.raises(ValueError, match="NUM_REAL_TARGET_TOKENS"):
        losses.normalizer(jnp.ones((1, 2)), "NUM_TOKENS")


def test_score_batch_and_loss_fn_match_log_softmax():
    cfg = T5Config(vocab_size=50, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
                   num_decoder_layers=1, mlp_dim=32, dtype="float32")
    model = EncoderDecoderModel(cfg, z_loss=0.0,
                                loss_normalizing_factor=losses.NUM_REAL_TARGET_TOKENS)
    # jitted (init, logits, scores, loss): op by op, each primitive compiled a program
    params = jax.jit(model.init)(jax.random.PRNGKey(0))
    targets = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)
    batch = {"encoder_input_tokens": jnp.array([[3, 4, 1, 0], [5, 1, 0, 0]]),
             "decoder_input_tokens": jnp.asarray(np.pad(targets[:, :-1], ((0, 0), (1, 0)))),
             "decoder_target_tokens": jnp.asarray(targets),
             "decoder_loss_weights": jnp.asarray((targets > 0).astype(np.float32))}
    logits = np.asarray(jax.jit(model.logits)(params, batch), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    tok = np.take_along_axis(logp, targets[..., None], -1)[..., 0] * (targets > 0)
    np.testing.assert_allclose(jax.jit(model.score_batch)(params, batch), tok.sum(-1),
                               rtol=1e-5)
    loss, metrics = jax.jit(model.loss_fn)(params, batch)
    np.testing.assert_allclose(loss, -tok.sum() / 7, rtol=1e-5)
    assert float(metrics["weight_sum"]) == 7
