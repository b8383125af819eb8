"""Shared by `t5lite.eval` and `t5lite.infer`: restore a checkpoint's parameters onto a
mesh, decode / score padded batches, and run seqio's Evaluator over a task split.

    session = load_session(model, "/runs/mnli", batch_size=32,
                           feature_lengths={"inputs": 256, "targets": 8})
    tokens = session.predict(batch_numpy)       # [rows, targets] on the host
    scores = session.score(batch_numpy)         # [rows]
    result = evaluate_task(session, "mnli", "validation_matched")

Batches given to `predict` / `score` may hold fewer than `batch_size` rows (the last
batch of a split): they are padded with zero rows, and the padding rows are dropped from
the outputs. Every process passes the whole (same) batch; each feeds its own rows to the
global array and gets the whole result back.

TensorFlow / SeqIO are imported only inside the functions that read tasks.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np

from t5lite import checkpoints, decoding, gin_utils, partitioning
from t5lite.models.configs import T5Config

log = logging.getLogger(__name__)

DECODER_NAMES = ("greedy", "beam_search", "sample")


def decoder_spec(method: str = "greedy", beam_size: int = 4, alpha: float = 0.6,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    """DECODING_METHOD / BEAM_SIZE / ALPHA / TEMPERATURE / TOP_K / TOP_P -> a
    `t5lite.decoding` config."""
    method = str(method).lower()
    if method == "greedy":
        return decoding.GreedyDecoder()
    if method in ("beam", "beam_search"):
        if not isinstance(beam_size, int) or beam_size < 1:
            raise gin_utils.ConfigError(f"BEAM_SIZE must be a positive integer, got "
                                        f"{beam_size!r}")
        return decoding.BeamSearch(num_beams=beam_size, alpha=float(alpha))
    if method in ("sample", "sampling"):
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise gin_utils.ConfigError(f"TEMPERATURE must be >= 0, got {temperature!r}")
        if not isinstance(top_k, int) or top_k < 0:
            raise gin_utils.ConfigError(f"TOP_K must be an integer >= 0 (0: off), got "
                                        f"{top_k!r}")
        if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise gin_utils.ConfigError(f"TOP_P must be in (0, 1] (1: off), got {top_p!r}")
        return decoding.Sampling(temperature=float(temperature), top_k=top_k,
                                 top_p=float(top_p))
    raise gin_utils.ConfigError(f"DECODING_METHOD {method!r} is not one of "
                                f"{', '.join(DECODER_NAMES)}")


def is_encoder_decoder(model) -> bool:
    return isinstance(getattr(model, "config", None), T5Config)


def check_encoder_decoder(model, what: str) -> None:
    if not is_encoder_decoder(model):
        raise gin_utils.ConfigError(
            f"{what} supports encoder-decoder (T5) models; MODEL is "
            f"{type(model).__name__}; for a decoder-only model use python -m t5lite.infer "
            f"with an INPUT_FILE of prompts")


def checkpoint_step(path: str) -> int:
    """The step number of the checkpoint that `path` resolves to (0 if it has none)."""
    try:
        item_dir, _ = checkpoints._resolve_item(path)  # noqa: SLF001 (same package)
    except FileNotFoundError:
        return 0
    name = item_dir.parent.name
    return int(name) if name.isdigit() else 0


# ----------------------------------------------------------------------------- session


@dataclasses.dataclass
class Session:
    """A model's restored parameters on a mesh, and jitted predict / score functions."""

    model: Any
    partitioner: partitioning.Partitioner
    params: Any
    batch_size: int
    feature_lengths: Dict[str, int]
    decoder: Any = dataclasses.field(default_factory=decoding.GreedyDecoder)
    step: int = 0
    seed: int = 0  # sampling: batch i draws with fold_in(PRNGKey(seed), i)

    def __post_init__(self):
        self._predict = decoding.make_predict_fn(
            self.model, self.partitioner, decoder=self.decoder,
            max_decode_length=self.feature_lengths["targets"])
        jitted = jax.jit(self.model.score_batch)
        part = self.partitioner

        def score(params, batch):
            import flax.linen as nn
            with part.mesh, nn.logical_axis_rules(part.rules):
                return jitted(params, batch)

        self._score = score

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
        start, stop = self.partitioner.host_rows(self.batch_size)
        local = {k: v[start:stop] for k, v in padded.items()}
        return self.partitioner.host_to_global(local, self.batch_size), rows

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


def _to_host(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.array(jax.device_get(x))  # a writable host copy


def restore_params(model, checkpoint_path: str, partitioner: partitioning.Partitioner,
                   lengths: Optional[Mapping[str, int]] = None):
    """The model's variables from CHECKPOINT_PATH (a MODEL_DIR, a step directory or a
    `t5lite.convert` output), sharded by `partitioner`; collections other than `params`
    (FP8 statistics) start fresh."""
    if not checkpoint_path:
        raise gin_utils.ConfigError("CHECKPOINT_PATH is not set: point it at a MODEL_DIR, "
                                    "a checkpoint step directory or a t5lite.convert output")
    if not Path(checkpoint_path).exists() and "://" not in str(checkpoint_path):
        raise FileNotFoundError(f"CHECKPOINT_PATH {checkpoint_path} does not exist")
    abstract = model.abstract_variables()
    shardings = partitioner.tree_shardings(abstract, model.logical_axes())
    target = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    try:
        params = checkpoints.restore_params_for_finetuning(
            checkpoint_path, model, {"params": target["params"]})
    except FileNotFoundError as e:
        raise FileNotFoundError(str(e).replace("INITIAL_CHECKPOINT_PATH", "CHECKPOINT_PATH")
                                ) from None
    except checkpoints.CheckpointMismatchError as e:
        raise checkpoints.CheckpointMismatchError(
            str(e).replace("INITIAL_CHECKPOINT_PATH", "CHECKPOINT_PATH")) from None
    variables = dict(params)
    others = [k for k in abstract if k != "params"]
    if others:  # e.g. FP8 scales: fresh values, as a finetuning restore gives them
        fresh = jax.jit(lambda: model.init(jax.random.PRNGKey(0)),
                        out_shardings=shardings)()
        variables.update({k: fresh[k] for k in others})
    return variables


def load_session(model, checkpoint_path: str, *, batch_size: int,
                 feature_lengths: Mapping[str, int], decoder=None, seed: int = 0,
                 ici_mesh_shape: Sequence[int] = (-1, 1, 1),
                 dcn_mesh_shape: Sequence[int] = (1, 1, 1),
                 partition_rules: Sequence = ()) -> Session:
    """Mesh from the ICI/DCN shapes, parameters restored onto it, jitted functions.
    For a decoder-only model, `inputs` is the prompt length and `targets` the number of
    new tokens (their sum must fit a model with learned positions)."""
    for key in ("inputs", "targets"):
        if not feature_lengths or not feature_lengths.get(key):
            raise gin_utils.ConfigError(f"TASK_FEATURE_LENGTHS needs a positive {key!r} "
                                        f"length, got {feature_lengths!r}")
    if not is_encoder_decoder(model):
        cfg = model.config
        total = int(feature_lengths["inputs"]) + int(feature_lengths["targets"])
        if cfg.position_embedding == "learned" and total > cfg.max_length:
            raise gin_utils.ConfigError(
                f"TASK_FEATURE_LENGTHS: prompt {feature_lengths['inputs']} + new tokens "
                f"{feature_lengths['targets']} = {total} positions, more than the model's "
                f"max_length {cfg.max_length}; shorten them")
    part = partitioning.Partitioner(partitioning.make_mesh(ici_mesh_shape, dcn_mesh_shape),
                                    partition_rules)
    part.check_batch_size(batch_size)
    params = restore_params(model, checkpoint_path, part)
    lengths = {"inputs": int(feature_lengths["inputs"]),
               "targets": int(feature_lengths["targets"])}
    return Session(model, part, params, int(batch_size), lengths,
                   decoder or decoding.GreedyDecoder(), checkpoint_step(checkpoint_path),
                   int(seed))


# ----------------------------------------------------------------------------- features


def _pad(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
    out = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        r = list(r)[:length]
        out[i, :len(r)] = r
    return out


def encdec_features(inputs: Sequence[Sequence[int]], lengths: Mapping[str, int],
                    targets: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, np.ndarray]:
    """seqio.EncDecFeatureConverter(pack=False)'s output for token lists (already with
    EOS and trimmed): encoder_input_tokens, and with targets decoder_target_tokens,
    decoder_input_tokens (targets shifted right, BOS 0) and decoder_loss_weights."""
    batch = {"encoder_input_tokens": _pad(inputs, lengths["inputs"])}
    if targets is not None:
        tgt = _pad(targets, lengths["targets"])
        dec_in = np.zeros_like(tgt)
        dec_in[:, 1:] = tgt[:, :-1]
        batch.update(decoder_target_tokens=tgt, decoder_input_tokens=dec_in,
                     decoder_loss_weights=(tgt > 0).astype(np.float32))
    return batch


def decoder_only_features(prompts: Sequence[Sequence[int]], lengths: Mapping[str, int],
                          targets: Optional[Sequence[Sequence[int]]] = None
                          ) -> Dict[str, np.ndarray]:
    """A decoder-only model's batch for token lists (no EOS). Every sequence starts with
    BOS 0, as seqio.LMFeatureConverter's decoder_input_tokens do in training; a prompt
    longer than `lengths["inputs"] - 1` keeps its last tokens.

    Without targets (predict): decoder_input_tokens [rows, inputs] = BOS + prompt and
    decoder_prompt_lengths [rows]. With targets (score): decoder_target_tokens
    [rows, inputs + targets] = prompt + target, decoder_input_tokens (shifted right, BOS
    0) and decoder_loss_weights 1 on the target tokens only."""
    keep = lengths["inputs"] - 1
    prompts = [list(p)[-keep:] if keep > 0 else [] for p in prompts]
    if targets is None:
        rows = [[0] + p for p in prompts]
        return {"decoder_input_tokens": _pad(rows, lengths["inputs"]),
                "decoder_prompt_lengths": np.array([len(r) for r in rows], np.int32)}
    width = lengths["inputs"] + lengths["targets"]
    tgt, weights = np.zeros((len(prompts), width), np.int32), np.zeros((len(prompts), width),
                                                                      np.float32)
    for i, (p, t) in enumerate(zip(prompts, targets)):
        t = list(t)[: lengths["targets"]]
        tgt[i, :len(p) + len(t)] = p + t
        weights[i, len(p):len(p) + len(t)] = 1.0
    dec_in = np.zeros_like(tgt)
    dec_in[:, 1:] = tgt[:, :-1]
    return {"decoder_target_tokens": tgt, "decoder_input_tokens": dec_in,
            "decoder_loss_weights": weights}


def tokenize(vocabulary, text: str, length: int) -> List[int]:
    """`text` encoded, trimmed to `length - 1` and EOS appended (seqio's
    append_eos_after_trim)."""
    ids = list(vocabulary.encode(text))[: length - 1]
    return ids + [decoding.EOS_ID]


def decode_tokens(vocabulary, tokens: Iterable[int]) -> str:
    """Token ids -> text, stopping at the first EOS (seqio's Vocabulary.decode)."""
    return vocabulary.decode([int(t) for t in tokens])


# ----------------------------------------------------------------------------- tasks


def import_data(data_settings: Optional[Mapping[str, Any]] = None, configure: bool = True):
    """(pipeline, tasks) modules, with the data settings applied unless `configure` is
    False (keep what is set). TensorFlow loads here."""
    import gin
    with gin.unlock_config():  # the t5 package registers gin configurables on import
        from t5lite.data import pipeline, tasks
    if configure:
        tasks.configure(**dict(data_settings or {}))
    return pipeline, tasks


def check_split(tasks_module, name: str, split: str, macro: str = "SPLIT"):
    provider = tasks_module.get_provider(name)
    if split not in provider.splits:
        from t5lite.data.errors import DataError
        raise DataError(f"task {name!r} has no split {split!r}; its splits are "
                        f"{', '.join(provider.splits)} (set {macro})")
    return provider


def _jsonable(x):
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, np.ndarray):
        return [_jsonable(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return x


@dataclasses.dataclass
class TaskResult:
    """Metrics of one task, and what they were computed from (in example order)."""

    metrics: Dict[str, float]
    inputs: List[str]
    predictions: List[Any]  # postprocessed
    prediction_texts: List[str]
    targets: List[Any]  # postprocessed (for SQuAD: all answers)


class TaskEvaluator:
    """seqio.Evaluator over `split` of the task or mixture `name`, built once (the split
    is read, tokenized and cached here) and run as often as needed: each `evaluate(session)`
    decodes every example with `session.predict`, detokenizes with each task's output
    vocabulary and applies its postprocess_fn and metric_fns.

    feature_lengths: {"inputs": ..., "targets": ...}; num_examples: None for the whole
    split. Raises ConfigError when the tasks have no metrics (span corruption)."""

    def __init__(self, name: str, split: str, feature_lengths: Mapping[str, int],
                 num_examples: Optional[int] = None):
        from t5lite.data.tf_env import import_tensorflow
        import_tensorflow()  # TensorFlow set up for the data edge before seqio loads it
        import seqio
        self.name, self.split = name, split
        self._evaluator = seqio.Evaluator(
            mixture_or_task_name=name,
            feature_converter=seqio.EncDecFeatureConverter(pack=False), eval_split=split,
            sequence_length=dict(feature_lengths), num_examples=num_examples,
            use_memory_cache=True, async_compute_metrics=False)
        if not self._evaluator.eval_tasks:
            raise gin_utils.ConfigError(f"task {name!r} has no metric_fns (or no split "
                                        f"{split!r}): nothing to evaluate")
        # The Evaluator calls predict_fn once per task with that task's cached dataset.
        self._task_of = {id(ds): task_name
                         for task_name, ds in self._evaluator.cached_model_datasets.items()}
        self._examples = {t.name: list(tfds_numpy(self._evaluator.cached_task_datasets[t.name]))
                          for t in self._evaluator.eval_tasks}

    @property
    def num_examples(self) -> Dict[str, int]:
        return {name: len(ex) for name, ex in self._examples.items()}

    def evaluate(self, session: Session) -> Dict[str, TaskResult]:
        """{task name: TaskResult} for the session's current parameters."""
        tokens_by_task: Dict[str, Dict[int, List[int]]] = {}

        def predict_fn(ds, model_feature_shapes=None):
            out = []
            for indices, features in ds.batch(session.batch_size).as_numpy_iterator():
                tokens = session.predict(
                    {"encoder_input_tokens": features["encoder_input_tokens"]},
                    index=int(indices[0]))
                out.extend((int(i), [int(t) for t in row]) for i, row in zip(indices, tokens))
            tokens_by_task[self._task_of.get(id(ds), self.name)] = dict(out)
            return out

        metrics_future, _ = self._evaluator.evaluate(compute_metrics=True, step=session.step,
                                                     predict_fn=predict_fn)
        all_metrics = metrics_future.result()
        return {task.name: self._result(task, tokens_by_task[task.name],
                                        all_metrics.get(task.name, {}))
                for task in self._evaluator.eval_tasks}

    def _result(self, task, tokens: Mapping[int, List[int]], task_metrics) -> TaskResult:
        vocab = task.output_features["targets"].vocabulary
        inputs_vocab = task.output_features.get("inputs", task.output_features["targets"]
                                                ).vocabulary
        inputs, preds, texts, targets = [], [], [], []
        for i, ex in enumerate(self._examples[task.name]):
            text = decode_tokens(vocab, tokens[i])
            texts.append(text)
            preds.append(_jsonable(task.postprocess_fn(text, example=ex, is_target=False)))
            target_text = ex["targets_pretokenized"] if "targets_pretokenized" in ex else \
                vocab.decode([int(t) for t in ex["targets"]])
            if isinstance(target_text, bytes):
                target_text = target_text.decode("utf-8")
            targets.append(_jsonable(task.postprocess_fn(target_text, example=ex,
                                                         is_target=True)))
            if "inputs_pretokenized" in ex:
                inputs.append(_jsonable(ex["inputs_pretokenized"]))
            else:
                inputs.append(inputs_vocab.decode([int(t) for t in ex["inputs"]]))
        metrics = {k: float(v.value if hasattr(v, "value") else v)
                   for k, v in task_metrics.items()}
        return TaskResult(metrics, inputs, preds, texts, targets)


def evaluate_task(session: Session, name: str, split: str,
                  num_examples: Optional[int] = None) -> Dict[str, TaskResult]:
    """One evaluation of `split` of the task or mixture `name` (see TaskEvaluator)."""
    return TaskEvaluator(name, split, session.feature_lengths, num_examples).evaluate(session)


def write_predictions(path: Path, result: TaskResult) -> None:
    """One JSON line per example: inputs, prediction text, postprocessed, target."""
    with open(path, "w") as f:
        for inp, pred, text, tgt in zip(result.inputs, result.predictions,
                                        result.prediction_texts, result.targets):
            f.write(json.dumps({"inputs": inp, "prediction": text, "postprocessed": pred,
                                "target": tgt}) + "\n")


def tfds_numpy(ds):
    import tensorflow_datasets as tfds
    return tfds.as_numpy(ds)
