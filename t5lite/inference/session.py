"""A checkpoint's parameters on a mesh, with jitted predict / score functions: what
`t5lite.eval`, `t5lite.infer` and the evaluation during training decode with.

    session = load_session(model, "/runs/mnli", batch_size=32,
                           feature_lengths={"inputs": 256, "targets": 8},
                           mesh=MeshSettings.data_parallel())
    tokens = session.predict(batch_numpy)       # [rows, targets] on the host
    scores = session.score(batch_numpy)         # [rows]
    sums = session.teacher_forced(batch_numpy)  # {log_likelihood, correct, tokens}: [rows]

Batches given to `predict` / `score` may hold fewer than `batch_size` rows (the last
batch of a split): they are padded with zero rows, and the padding rows are dropped from
the outputs. Every process passes the whole (same) batch; each feeds its own rows to the
global array and gets the whole result back. `DecodingSettings` carries the decoding
macros (DECODING_METHOD, BEAM_SIZE, ALPHA, TEMPERATURE, TOP_K, TOP_P, SEED). A LoRA
checkpoint loads merged (`merged_lora`): the base network runs, with no adapter matmul.

Nothing here imports TensorFlow or SeqIO.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import jax
import numpy as np

from t5lite.errors import ConfigError, check_number, check_positive_int
from t5lite.models import decoding, lora
from t5lite.formats import checkpoint_kinds
from t5lite.runtime.checkpointing import finetune_restore, lora_restore
from t5lite.runtime.partitioning import MeshSettings, Partitioner

log = logging.getLogger(__name__)

DECODER_NAMES = ("greedy", "beam_search", "sample")


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How to decode: DECODING_METHOD ('greedy', 'beam_search' with BEAM_SIZE and ALPHA,
    or 'sample' with TEMPERATURE, TOP_K, TOP_P) and SEED (sampling: batch i draws with
    fold_in(PRNGKey(SEED), index of its first example)). Checked when built."""

    method: str
    beam_size: int
    alpha: float
    temperature: float
    top_k: int
    top_p: float
    seed: int

    def __post_init__(self):
        # every setting is checked, whichever the method reads: a wrong one is a mistake
        check_positive_int("BEAM_SIZE", self.beam_size)
        check_number("ALPHA", self.alpha)
        check_number("TEMPERATURE", self.temperature, low=0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"TOP_K must be an integer >= 0 (0: off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or \
                not 0 < self.top_p <= 1:
            raise ConfigError(f"TOP_P must be in (0, 1] (1: off), got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"SEED must be an integer >= 0, got {self.seed!r}")
        self.decoder()

    def decoder(self):
        """The `t5lite.models.decoding` config these settings name."""
        method = str(self.method).lower()
        if method == "greedy":
            return decoding.GreedyDecoder()
        if method in ("beam", "beam_search"):
            return decoding.BeamSearch(num_beams=self.beam_size, alpha=float(self.alpha))
        if method in ("sample", "sampling"):
            return decoding.Sampling(temperature=float(self.temperature), top_k=self.top_k,
                                     top_p=float(self.top_p))
        raise ConfigError(f"DECODING_METHOD {method!r} is not one of "
                          f"{', '.join(DECODER_NAMES)}")


def make_predict_fn(model, partitioner: Optional[Partitioner] = None,
                    **predict_kwargs) -> Callable:
    """`model.predict_batch` with fixed keyword settings (decoder, max_decode_length,
    return_scores, eos_id), jitted; with a partitioner it runs under the partitioner's
    mesh and logical-axis rules, with the shardings of the arguments (put params on
    `partitioner.tree_shardings(...)`, batches on `partitioner.batch_sharding()`).
    Call it as fn(params, batch, rng=None)."""
    fn = functools.partial(model.predict_batch, **predict_kwargs)
    jitted = jax.jit(fn) if partitioner is None else partitioner.partition(fn)
    return lambda params, batch, rng=None: jitted(params, batch, rng=rng)


# ----------------------------------------------------------------------------- session


@dataclasses.dataclass
class Session:
    """A model's restored parameters on a mesh, and jitted predict / score functions."""

    model: Any
    partitioner: Partitioner
    params: Any
    batch_size: int
    feature_lengths: Dict[str, int]
    decoder: Any = dataclasses.field(default_factory=decoding.GreedyDecoder)
    step: int = 0
    seed: int = 0  # sampling: batch i draws with fold_in(PRNGKey(seed), i)

    def __post_init__(self):
        self._predict = make_predict_fn(self.model, self.partitioner, decoder=self.decoder,
                                        max_decode_length=self.feature_lengths["targets"])
        self._score = self.partitioner.partition(self.model.score_batch)
        self._teacher_forced = self.partitioner.partition(self.model.teacher_forced)
        self._layout = self.partitioner.data_layout(self.batch_size)  # this process's rows

    # -- batches ----------------------------------------------------------------------
    def _global(self, batch: Mapping[str, np.ndarray]) -> Tuple[Dict[str, jax.Array], int]:
        rows = len(next(iter(batch.values())))
        if rows > self.batch_size:
            raise ValueError(f"batch of {rows} rows exceeds BATCH_SIZE={self.batch_size}")
        padded = {}
        for k, v in batch.items():
            v = np.asarray(v)
            pad = np.zeros((self.batch_size - rows,) + v.shape[1:], v.dtype)
            padded[k] = np.concatenate([v, pad], axis=0)
        local = {k: v[self._layout.start:self._layout.stop] for k, v in padded.items()}
        return self.partitioner.host_to_global(local, self._layout), rows

    def predict(self, batch: Mapping[str, np.ndarray], index: int = 0) -> np.ndarray:
        """Decoded token ids [rows, targets length] (EOS included, 0 after). `index`
        (e.g. the position of the batch's first example) keys the sampling rng."""
        arrays, rows = self._global(batch)
        rng = None
        if isinstance(self.decoder, decoding.Sampling):
            rng = jax.random.fold_in(jax.random.PRNGKey(self.seed), int(index))
        return _to_host(self._predict(self.params, arrays, rng))[:rows]

    def score(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Summed log-likelihood of the targets [rows] (`model.score_batch`)."""
        arrays, rows = self._global(batch)
        return _to_host(self._score(self.params, arrays))[:rows]

    def teacher_forced(self, batch: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Per example [rows]: log_likelihood, correct and tokens (`model.teacher_forced`)."""
        arrays, rows = self._global(batch)
        out = self._teacher_forced(self.params, arrays)
        return {k: _to_host(v)[:rows] for k, v in out.items()}


def _to_host(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.array(jax.device_get(x))  # a writable host copy


def open_checkpoint_path(checkpoint_path: str):
    """CHECKPOINT_PATH's reader (`checkpoint_kinds.open_checkpoint`), one line when unset."""
    if not checkpoint_path:
        raise ConfigError("CHECKPOINT_PATH is not set: point it at a MODEL_DIR, "
                          "a checkpoint step directory or a t5lite.convert output")
    return checkpoint_kinds.open_checkpoint(checkpoint_path, "CHECKPOINT_PATH")


def restore_params(model, ckpt, partitioner: Partitioner):
    """The model's variables from CHECKPOINT_PATH's reader (`open_checkpoint_path`: a
    MODEL_DIR, a step directory or a `t5lite.convert` output), sharded by `partitioner`;
    collections other than `params` (FP8 statistics) start fresh."""
    abstract = model.abstract_variables()
    shardings = partitioner.tree_shardings(abstract, model.logical_axes())
    target = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    params = finetune_restore.restore_params_for_finetuning(
        ckpt, model, {"params": target["params"]}, what="CHECKPOINT_PATH")
    variables = dict(params)
    others = [k for k in abstract if k != "params"]
    if others:  # e.g. FP8 scales: fresh values, as a finetuning restore gives them
        fresh = jax.jit(lambda: model.init(jax.random.PRNGKey(0)),
                        out_shardings=shardings)()
        variables.update({k: fresh[k] for k in others})
    return variables


def load_session(model, checkpoint_path: str, *, batch_size: int,
                 feature_lengths: Mapping[str, int],
                 mesh: MeshSettings, decoding_settings: Optional[DecodingSettings] = None,
                 decodes: bool = True) -> Session:
    """Mesh, parameters restored onto it, jitted functions (decoding as
    `decoding_settings` say; None, as a scoring session takes: greedy). For a decoder-only model,
    `inputs` is the prompt length and `targets` the number of new tokens (the model says
    whether they fit: `model.check_decode_lengths`). A session that only scores
    (`decodes=False`) takes the lengths as they are."""
    keys = ("inputs", "targets") if decodes else ("targets",)
    for key in keys:
        if not feature_lengths or not feature_lengths.get(key):
            raise ConfigError(f"TASK_FEATURE_LENGTHS needs a positive {key!r} length, got "
                              f"{feature_lengths!r}")
    lengths = {k: int(v) for k, v in feature_lengths.items() if v}
    if decodes:
        lengths = {k: lengths[k] for k in keys}
        model.check_decode_lengths(lengths)
    decoder, seed = ((decoding_settings.decoder(), int(decoding_settings.seed))
                     if decoding_settings else (decoding.GreedyDecoder(), 0))
    ckpt = open_checkpoint_path(checkpoint_path)
    model = lora_restore.adopt_adapters(model, ckpt)  # a LoRA run's, without its flags
    partitioner = mesh.partitioner(model=model)
    partitioner.data_layout(batch_size)  # it divides over the data shards: before loading
    params = restore_params(model, ckpt, partitioner)
    model, params = merged_lora(model, params, partitioner)
    return Session(model, partitioner, params, int(batch_size), lengths, decoder, ckpt.step,
                   seed)


def merged_lora(model, variables, partitioner: Partitioner):
    """(model, variables) for inference: a LoRA model's adapters folded into its kernels
    (W + (alpha / r) B A, `lora.merge_lora`, on the devices, sharded as the base is) and
    the base model that runs them, so decoding does the base network's work and no
    adapter matmul; any other model as it is."""
    cfg = getattr(model, "config", None)
    if cfg is None or not lora.enabled(cfg):
        return model, variables
    base = lora_restore.base_model(model)
    shardings = partitioner.tree_shardings(base.abstract_variables(), base.logical_axes())
    merged = jax.jit(lambda v: lora.merge_lora(v, cfg)[0], out_shardings=shardings)(variables)
    log.info("LoRA: rank %d adapters on %s merged into the base for inference",
             cfg.lora_rank, ", ".join(cfg.lora_targets))
    return base, merged
