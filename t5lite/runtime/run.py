"""Everything a training (or benchmark) loop needs, built from a run's settings: the
partitioner, the sharded train step and this process's data iterator.

    run = build_run(model=model, batch_size=256, task_feature_lengths={...},
                    mixture_or_task_name="synthetic", optimizer=adafactor(1e-3))
    state = run.fns.init(jax.random.PRNGKey(0))
    state, metrics = run.fns.train_step(state, run.next_batch())

The task `synthetic` gives deterministic random batches with no TensorFlow; any other name
is a SeqIO task or mixture read through the data edge (TensorFlow loads then).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from t5lite.data.settings import DataSettings
from t5lite.runtime import periods, train_step
from t5lite.runtime.partitioning import MeshSettings, Partitioner

SYNTHETIC_TASK = "synthetic"


def make_iterator(task_name: str, model, feature_lengths: Mapping[str, int], batch_size: int,
                  seed: int, partitioner: Partitioner, pack: bool = False,
                  data_settings: Optional[DataSettings] = None):
    """This process's batch iterator for the named task, in the batches the model's
    family reads (`model.FEATURE_CONVERTER_KIND`): the random-batch task `synthetic` (no
    TensorFlow), else a SeqIO task or mixture (t5lite.data.pipeline; a decoder-only model
    reads an inputs -> targets task as prompt + answer). Its `sequence_lengths` are the
    widths of its batches."""
    kind = model.FEATURE_CONVERTER_KIND
    layout = partitioner.data_layout(batch_size)
    if task_name == SYNTHETIC_TASK:
        from t5lite.data import synthetic
        task = synthetic.SyntheticTask(model.feature_lengths(feature_lengths),
                                       model.config.vocab_size, kind, seed)
        return synthetic.SyntheticIterator(task, layout)
    from t5lite.data import edge
    edge.import_tasks(data_settings or DataSettings())  # the data edge: TensorFlow, SeqIO
    from t5lite.data import pipeline
    it = pipeline.make_iterator(task_name, split="train", feature_lengths=feature_lengths,
                                layout=layout, model_kind=kind, pack=pack, shuffle=True,
                                seed=seed, bos_id=model.bos_id)
    model.check_vocabulary(it.vocabulary)
    return it


@dataclasses.dataclass
class Run:
    """The pieces of one training run (see the module docstring)."""

    model: Any
    partitioner: Partitioner
    fns: train_step.StepFunctions
    iterator: Any
    batch_size: int
    target_tokens: int
    flops_per_example: float

    def next_batch(self):
        """The next global batch, sharded on the batch axes."""
        return self.partitioner.host_to_global(next(self.iterator), self.batch_size)


def build_run(*, model, batch_size: int, task_feature_lengths: Mapping[str, int],
              mixture_or_task_name: str, optimizer, num_microbatches: int = 1,
              random_seed: int = 0, mesh: Optional[MeshSettings] = None, pack: bool = False,
              data_settings: Optional[DataSettings] = None,
              devices: Optional[Sequence[Any]] = None) -> Run:
    """Mesh (over `devices`, default all), sharded train step and this process's data
    iterator."""
    periods.check_positive("BATCH_SIZE", batch_size)
    periods.check_positive("NUM_MICROBATCHES", num_microbatches)
    if pack:  # fail before any compile when the network cannot read packed batches
        model.check_features(("decoder_segment_ids",))
    part = (mesh or MeshSettings()).partitioner(devices, model=model)
    part.check_batch_size(batch_size, num_microbatches)
    fns = train_step.make_train_step(model, optimizer.tx, part,
                                     learning_rate_fn=optimizer.learning_rate_fn,
                                     num_microbatches=num_microbatches,
                                     lengths=model.feature_lengths(task_feature_lengths))
    it = make_iterator(mixture_or_task_name, model, task_feature_lengths, batch_size,
                       random_seed, part, pack, data_settings)
    lengths = it.sequence_lengths  # a decoder-only model on a prefix-LM task: inputs + targets
    model.check_train_lengths(lengths, task_feature_lengths)
    return Run(model, part, fns, it, batch_size, lengths["targets"],
               model.train_flops_per_example(lengths))
