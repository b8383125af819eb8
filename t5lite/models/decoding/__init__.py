"""Autoregressive decoding over a KV cache: greedy, temperature sampling (top-k / top-p)
and beam search (T5X length penalty).

Every function here is pure and jittable (a `jax.lax.while_loop`) and knows nothing about
models; it drives one callback

    tokens_to_logits(tokens [B, 1] int32, cache, index [B] int32)
        -> (logits [B, vocab] float32, new_cache)

which feeds each row's newest token, sitting at position `index`, through the network
and returns the next-token logits and the updated cache. `EncoderDecoderModel.predict_batch`
and `DecoderOnlyModel.predict_batch` (`t5lite.models.model`) build that callback; see
docs/decoding.md. Jitting it on a mesh is the inference layer's job
(`t5lite.inference.session.make_predict_fn`).

Output convention (T5X): tokens [batch, max_steps], the EOS (id 1 by default) included,
0 after it. A sequence stops at its first EOS; the loop stops when every sequence has
(or, for beam search, when no live beam can still beat the finished ones) or after
`max_steps` tokens.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Tuple, Union

import jax
import jax.numpy as jnp

Array = jax.Array
Cache = Any
TokensToLogits = Callable[[Array, Cache, Array], Tuple[Array, Cache]]

EOS_ID = 1
NEG_INF = -1.0e9  # score of an empty beam slot (finite: no inf - inf = nan)


# ----------------------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True)
class GreedyDecoder:
    """Argmax at every step."""

    num_beams = 1


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Temperature sampling; `top_k` > 0 keeps the k most likely tokens, `top_p` < 1
    the smallest set whose probability reaches p (nucleus). Temperature 0 is greedy."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    num_beams = 1


@dataclasses.dataclass(frozen=True)
class BeamSearch:
    """Beam search ranking finished sequences by log p / ((5 + length) / 6) ** alpha."""

    num_beams: int = 4
    alpha: float = 0.6


DecoderSpec = Union[GreedyDecoder, Sampling, BeamSearch, str]

_NAMES = {"greedy": GreedyDecoder, "sample": Sampling, "sampling": Sampling,
          "temperature_sample": Sampling, "beam": BeamSearch, "beam_search": BeamSearch}


def get_decoder(spec: DecoderSpec = "greedy"):
    """A decoder config from a config object or a name ("greedy", "sample",
    "beam_search"; the named ones take their default settings)."""
    if isinstance(spec, (GreedyDecoder, Sampling, BeamSearch)):
        return spec
    if isinstance(spec, str) and spec in _NAMES:
        return _NAMES[spec]()
    raise ValueError(f"unknown decoder {spec!r}: use GreedyDecoder(), Sampling(...), "
                     f"BeamSearch(...) or one of {sorted(_NAMES)}")


# ----------------------------------------------------------------------------- helpers


def brevity_penalty(alpha: float, length) -> Array:
    """T5X / GNMT length penalty ((5 + length) / 6) ** alpha."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def filter_logits(logits: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """Set to -inf every logit outside the top-k and outside the nucleus of probability
    `top_p` (the most likely token always stays). logits [..., vocab]."""
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = (mass_before < top_p).at[..., 0].set(True)
        threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def repeat_beams(x: Array, num_beams: int, axis: int = 0) -> Array:
    """[.., batch, ..] -> [.., batch * num_beams, ..], the beams of an example adjacent
    (row i * num_beams + j is beam j of example i): how beam_search lays out its cache."""
    return jnp.repeat(x, num_beams, axis=axis)


def gather_cache_rows(cache: Cache, rows: Array, axis: int = 0) -> Cache:
    """Take `rows` (int [batch * beams]) of every cache leaf along its batch `axis`."""
    return jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=axis), cache)


def _rows(x, batch: int) -> Array:
    return jnp.broadcast_to(jnp.asarray(x, jnp.int32), (batch,))


# ----------------------------------------------------------------------------- sampling


def temperature_sample(tokens_to_logits: TokensToLogits, init_tokens: Array, init_index,
                       cache: Cache, max_steps: int, rng: Optional[Array] = None, *,
                       temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                       eos_id: Optional[int] = EOS_ID) -> Tuple[Array, Array]:
    """Sample up to `max_steps` tokens per row.

    init_tokens [batch]: the token fed first (BOS, or a prompt's last token) at position
    init_index ([batch] or scalar); the cache has `batch` rows. temperature 0 (a Python
    number) is greedy and needs no rng. eos_id None: never stop early.
    Returns (tokens [batch, max_steps], scores [batch]): scores are the model's log-prob
    of the chosen tokens (temperature 1, unfiltered), summed up to and including EOS."""
    batch = init_tokens.shape[0]
    greedy = temperature == 0
    if not greedy and rng is None:
        raise ValueError("temperature sampling needs an rng (temperature 0 is greedy)")
    eos = -1 if eos_id is None else eos_id
    state = dict(step=jnp.zeros((), jnp.int32), cur=_rows(init_tokens, batch),
                 index=_rows(init_index, batch), cache=cache,
                 out=jnp.zeros((batch, max_steps), jnp.int32),
                 done=jnp.zeros((batch,), bool), score=jnp.zeros((batch,), jnp.float32),
                 rng=rng if rng is not None else jax.random.PRNGKey(0))

    def cond(s):
        return (s["step"] < max_steps) & ~jnp.all(s["done"])

    def body(s):
        logits, cache = tokens_to_logits(s["cur"][:, None], s["cache"], s["index"])
        logits = logits.astype(jnp.float32)
        rng = s["rng"]
        if greedy:
            nxt = jnp.argmax(logits, axis=-1)
        else:
            rng, key = jax.random.split(rng)
            nxt = jax.random.categorical(key, filter_logits(logits / temperature, top_k, top_p))
        nxt = jnp.where(s["done"], 0, nxt).astype(jnp.int32)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), nxt[:, None], axis=-1)[:, 0]
        out = jax.lax.dynamic_update_slice_in_dim(s["out"], nxt[:, None], s["step"], axis=1)
        return dict(step=s["step"] + 1, cur=nxt, index=s["index"] + 1, cache=cache, out=out,
                    done=s["done"] | (nxt == eos),
                    score=s["score"] + jnp.where(s["done"], 0.0, logp), rng=rng)

    final = jax.lax.while_loop(cond, body, state)
    return final["out"], final["score"]


def greedy_decode(tokens_to_logits: TokensToLogits, init_tokens: Array, init_index,
                  cache: Cache, max_steps: int, *,
                  eos_id: Optional[int] = EOS_ID) -> Tuple[Array, Array]:
    """Argmax decoding; same contract as `temperature_sample` (temperature 0)."""
    return temperature_sample(tokens_to_logits, init_tokens, init_index, cache, max_steps,
                              temperature=0.0, eos_id=eos_id)


# ----------------------------------------------------------------------------- beam search


def beam_search(tokens_to_logits: TokensToLogits, init_tokens: Array, init_index,
                cache: Cache, max_steps: int, num_beams: int, *, alpha: float = 0.6,
                eos_id: Optional[int] = EOS_ID, cache_batch_axis: int = 0,
                gather_cache: Optional[Callable[[Cache, Array], Cache]] = None
                ) -> Tuple[Array, Array]:
    """Beam search with the T5X brevity penalty.

    init_tokens / init_index: [batch] (index may be a scalar); the cache must already
    hold batch * num_beams rows, example-major (`repeat_beams`), with its batch axis at
    `cache_batch_axis` in every leaf. `gather_cache(cache, rows)` reorders the cache
    after each step (default: `gather_cache_rows` on every leaf); a caller may skip
    leaves that are equal across the beams of an example.

    Each step expands every live beam by every token and keeps the 2k best by log-prob;
    those ending in EOS and ranked in the top k (all top-k at the last step) join the
    finished pool, scored log p / ((5 + length) / 6) ** alpha with length counting the
    EOS; the k best others stay live. The loop stops once no live beam can beat the
    worst finished one. Returns (tokens [batch, num_beams, max_steps],
    scores [batch, num_beams]), best first. With num_beams=1 and alpha=0 this is greedy;
    with alpha > 0 a single beam may also continue past greedy's EOS and return a longer
    sequence that shares greedy's prefix and has a better penalized score."""
    batch, k, steps = init_tokens.shape[0], num_beams, max_steps
    eos = -1 if eos_id is None else eos_id
    if gather_cache is None:
        gather_cache = functools.partial(gather_cache_rows, axis=cache_batch_axis)
    first = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF).astype(jnp.float32)
    state = dict(
        step=jnp.zeros((), jnp.int32),
        cur=jnp.repeat(_rows(init_tokens, batch)[:, None], k, axis=1),
        index=jnp.repeat(_rows(init_index, batch)[:, None], k, axis=1),
        cache=cache,
        alive_seqs=jnp.zeros((batch, k, steps), jnp.int32),
        alive_logp=jnp.broadcast_to(first, (batch, k)),
        fin_seqs=jnp.zeros((batch, k, steps), jnp.int32),
        fin_scores=jnp.full((batch, k), NEG_INF, jnp.float32))

    def cond(s):
        # Log-probs only fall, so a live beam's best reachable score is its log-prob over
        # the largest penalty it can still get (length steps+1 .. max_steps).
        best_penalty = jnp.maximum(brevity_penalty(alpha, s["step"] + 1),
                                   brevity_penalty(alpha, steps))
        best_alive = s["alive_logp"][:, 0] / best_penalty
        can_improve = jnp.any(best_alive > s["fin_scores"][:, -1])
        return (s["step"] < steps) & can_improve

    def body(s):
        step = s["step"]
        logits, cache = tokens_to_logits(s["cur"].reshape(batch * k, 1), s["cache"],
                                         s["index"].reshape(batch * k))
        logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, k, -1)
        vocab = logp.shape[-1]
        cand = (s["alive_logp"][:, :, None] + logp).reshape(batch, k * vocab)
        top_logp, top_idx = jax.lax.top_k(cand, 2 * k)  # [batch, 2k], best first
        parent, tok = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        seqs = jnp.take_along_axis(s["alive_seqs"], parent[:, :, None], axis=1)
        seqs = jax.lax.dynamic_update_slice_in_dim(seqs, tok[:, :, None], step, axis=2)
        is_eos = tok == eos
        length = step + 1
        finishing = (is_eos | (length == steps)) & (jnp.arange(2 * k) < k)
        new_fin = jnp.where(finishing, top_logp / brevity_penalty(alpha, length), NEG_INF)
        fin_scores, fin_sel = jax.lax.top_k(
            jnp.concatenate([s["fin_scores"], new_fin], axis=1), k)
        fin_seqs = jnp.take_along_axis(
            jnp.concatenate([s["fin_seqs"], seqs], axis=1), fin_sel[:, :, None], axis=1)
        alive_logp, alive_sel = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logp), k)
        alive_seqs = jnp.take_along_axis(seqs, alive_sel[:, :, None], axis=1)
        new_parent = jnp.take_along_axis(parent, alive_sel, axis=1)
        rows = (jnp.arange(batch)[:, None] * k + new_parent).reshape(batch * k)
        return dict(step=step + 1, cur=jnp.take_along_axis(tok, alive_sel, axis=1),
                    index=s["index"] + 1, cache=gather_cache(cache, rows),
                    alive_seqs=alive_seqs, alive_logp=alive_logp,
                    fin_seqs=fin_seqs, fin_scores=fin_scores)

    final = jax.lax.while_loop(cond, body, state)
    return final["fin_seqs"], final["fin_scores"]


# ----------------------------------------------------------------------------- dispatch


def decode(spec: DecoderSpec, tokens_to_logits: TokensToLogits, init_tokens: Array,
           init_index, cache: Cache, max_steps: int, *, rng: Optional[Array] = None,
           eos_id: Optional[int] = EOS_ID, cache_batch_axis: int = 0,
           gather_cache: Optional[Callable[[Cache, Array], Cache]] = None
           ) -> Tuple[Array, Array]:
    """Run the decoder `spec` (config or name); returns (tokens [batch, max_steps],
    scores [batch]); for beam search the best beam and its penalized score. The cache
    must have batch * spec.num_beams rows."""
    spec = get_decoder(spec)
    if isinstance(spec, BeamSearch):
        tokens, scores = beam_search(tokens_to_logits, init_tokens, init_index, cache,
                                     max_steps, spec.num_beams, alpha=spec.alpha,
                                     eos_id=eos_id, cache_batch_axis=cache_batch_axis,
                                     gather_cache=gather_cache)
        return tokens[:, 0], scores[:, 0]
    if isinstance(spec, Sampling) and spec.temperature != 0:
        return temperature_sample(tokens_to_logits, init_tokens, init_index, cache, max_steps,
                                  rng, temperature=spec.temperature, top_k=spec.top_k,
                                  top_p=spec.top_p, eos_id=eos_id)
    return greedy_decode(tokens_to_logits, init_tokens, init_index, cache, max_steps,
                         eos_id=eos_id)
