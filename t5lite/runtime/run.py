"""Everything a training (or benchmark) loop needs, built from a run's settings: the
partitioner, the sharded train step and this process's data iterator.

    data = TrainData("synthetic", task_feature_lengths={...}, batch_size=256, seed=0,
                     pack=False)
    run = build_run(model=model, data=data, optimizer=adafactor(1e-3))
    state = run.step_fns.init(jax.random.PRNGKey(0))
    state, metrics = run.step_fns.train_step(state, run.next_batch())

The task `synthetic` gives deterministic random batches with no TensorFlow; any other name
is a SeqIO task or mixture read through the data edge (TensorFlow loads then).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, Optional, Sequence

import jax

from t5lite.data import edge
from t5lite.data.edge import DataLayout, DataSettings
from t5lite.errors import check_positive_int
from t5lite.optim import skipping
from t5lite.runtime import train_step
from t5lite.runtime.model_on_mesh import check_batches_on_mesh, check_lengths_on_mesh
from t5lite.runtime.skipped_steps import SkipSettings
from t5lite.runtime.partitioning import MeshSettings, Partitioner

log = logging.getLogger(__name__)
SYNTHETIC_TASK = "synthetic"


@dataclasses.dataclass(frozen=True)
class TrainData:
    """What a training run reads, in T5X's macro names: the 'train' split of
    MIXTURE_OR_TASK_NAME, shuffled with RANDOM_SEED, cut to TASK_FEATURE_LENGTHS, BATCH_SIZE
    examples a step (global), packed with PACK, its files found as `data_settings` say
    (None: the settings in force). The run's data travel as this one object from `train`
    to the reader. BATCH_SIZE is checked here, once (a positive integer); from
    `build_run` on, the `DataLayout` carries it."""

    mixture_or_task_name: str
    task_feature_lengths: Mapping[str, int]
    batch_size: int
    seed: int
    pack: bool
    data_settings: Optional[DataSettings] = None
    data_shards: Optional[int] = None  # DATA_SHARDS (t5lite/data/sharding/shards.py)

    def __post_init__(self):
        check_positive_int("BATCH_SIZE", self.batch_size)


def make_iterator(model, data: TrainData, layout: DataLayout):
    """This process's batch iterator for `data`, `layout`'s rows of each batch, in the
    batches the model's family reads (`model.FEATURE_CONVERTER_KIND`): the random-batch
    task `synthetic` (no TensorFlow), else a SeqIO task or mixture (t5lite.data.pipeline;
    a decoder-only model reads an inputs -> targets task as prompt + answer). Its
    `sequence_lengths` are the widths of its batches."""
    kind = model.FEATURE_CONVERTER_KIND
    if data.mixture_or_task_name == SYNTHETIC_TASK:
        task = edge.SyntheticTask(model.feature_lengths(data.task_feature_lengths),
                                       model.config.vocab_size, kind, data.seed)
        return edge.SyntheticIterator(task, layout)
    edge.import_tasks(data.data_settings)  # the data edge: TensorFlow, SeqIO
    iterator = edge.make_iterator(
        data.mixture_or_task_name, split="train", feature_lengths=data.task_feature_lengths,
        layout=layout, model_kind=kind, pack=data.pack, shuffle=True, seed=data.seed,
        bos_id=model.bos_id, data_shards=data.data_shards)
    model.check_vocabulary(iterator.vocabulary)
    return iterator


@dataclasses.dataclass
class TrainingRun:
    """The pieces of one training run (see the module docstring)."""

    model: Any
    partitioner: Partitioner
    step_fns: train_step.StepFunctions
    iterator: Any
    data: TrainData
    layout: DataLayout  # this process's rows of each batch: the batch size from here on
    target_tokens: int
    flops_per_example: float

    @property
    def batch_size(self) -> int:
        return self.layout.batch_size

    def next_batch(self):
        """The next global batch, sharded on the batch axes."""
        return self.partitioner.host_to_global(next(self.iterator), self.layout)


def _log_trainable(model, params) -> None:
    """One line when only part of the parameters train (LoRA: the adapters)."""
    def count(tree):
        return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(tree))

    total, trainable = count(params), count(model.split_trainable(params)[0])
    if trainable != total:
        log.info("training %s of %s parameters (%.2f%%); the other %s are frozen",
                 f"{trainable:,}", f"{total:,}", 100 * trainable / total,
                 f"{total - trainable:,}")


def build_run(*, model, data: TrainData, optimizer, num_microbatches: int = 1,
              mesh: Optional[MeshSettings] = None,
              devices: Optional[Sequence[Any]] = None,
              skip: Optional[SkipSettings] = None,
              platform: Optional[str] = None) -> TrainingRun:
    """Mesh (over `devices`, default all; `mesh` None: every device on the data axis),
    sharded train step and this process's data iterator. `skip` (SKIP_BAD_STEPS...): the
    optimizer wrapped to skip bad steps (`optim/skipping.py`). `platform`: what its
    programs are lowered for when not the devices' own (they are then never run)."""
    check_positive_int("NUM_MICROBATCHES", num_microbatches)
    if data.pack:  # fail before any compile when the network cannot read packed batches
        model.check_features(("decoder_segment_ids",))
    partitioner = (mesh or MeshSettings.data_parallel()).partitioner(devices, model=model,
                                                                    platform=platform)
    layout = partitioner.data_layout(data.batch_size, num_microbatches)
    check_batches_on_mesh(model, partitioner.mesh, data.batch_size // num_microbatches,
                          data.pack)
    # the optimizer sees the trainable parameters only (with LoRA: the adapters);
    # Adafactor factors by their axis names
    tx = optimizer.transformation(model.split_trainable(model.logical_axes()["params"])[0])
    skip = skip or SkipSettings()
    if skip.enabled:
        tx = skipping.skip_bad_steps(tx, skip.max_grad_norm)
    step_fns = train_step.make_train_step(
        model, tx, partitioner, learning_rate_fn=optimizer.learning_rate_fn,
        num_microbatches=num_microbatches,
        lengths=model.feature_lengths(data.task_feature_lengths),
        bad_gradient_steps=skip.inject or ())
    _log_trainable(model, step_fns.abstract_state.params["params"])
    iterator = make_iterator(model, data, layout)
    lengths = iterator.sequence_lengths  # decoder-only on a prefix-LM task: inputs + targets
    model.check_train_lengths(lengths, data.task_feature_lengths)
    check_lengths_on_mesh(model, partitioner.mesh, lengths)
    change = model.microbatch_routing_change(data.batch_size, lengths, num_microbatches)
    if change:  # the one case where gradient accumulation changes the step
        log.warning("%s", change)
    return TrainingRun(model, partitioner, step_fns, iterator, data, layout, lengths["targets"],
                       model.train_flops_per_example(lengths))
