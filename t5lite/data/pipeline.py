"""SeqIO task or mixture -> this process's batches of numpy arrays, with a resumable
position.

    iterator = make_iterator("pile_span_corruption", split="train",
                       feature_lengths={"inputs": 512, "targets": 128},
                       layout=partitioner.data_layout(2048), model_kind="encoder_decoder",
                       pack=False, shuffle=True, seed=0)
    batch = next(iterator)          # this process's rows: layout.rows of the 2048
    iterator.get_state()            # {"position": 1, ...}: batches consumed so far
    iterator.set_state(state)       # the next batch is batch number state["position"]

Batches carry the T5X feature-converter names (seqio.EncDecFeatureConverter,
seqio.LMFeatureConverter, or for a decoder-only model on an inputs -> targets task
seqio.PrefixLMFeatureConverter: prompt then answer in one sequence of inputs + targets
tokens, loss weights on the answer only, decoder_causal_attention 1 on the prompt;
packed or not): encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
decoder_loss_weights (float32), and when packed {encoder,decoder}_segment_ids and
{encoder,decoder}_positions. Tokens are int32.

Blends (a SeqIO mixture, TEXT_FILES with weights): each source converted on its own, its
rows taken in a fixed order by weight and counted from the position (t5lite/data/blend.py).

Sharding: the global stream is cut into S data shards (DATA_SHARDS; by default the number
of data feeds of the run that began it), shard s reading shard s of S of the task
(seqio.ShardInfo: its own files when the source has at least S of them, else every S-th
record), B / S rows a batch; a global batch is the shards' batches in shard order. The
process that feeds rows [start, stop) of each batch (`DataLayout`,
t5lite/data/sharding/layout.py) reads the shards those rows fall in (`ShardPlan`,
t5lite/data/sharding/shards.py): with S = P, shard i of P, as before DATA_SHARDS existed.

Order: for a given (task, split, feature lengths, batch size, data shards, seed, pack)
the stream of batches is fixed, whatever the process count: file order, shuffle buffer
and the random choices of span corruption all derive from the seed.

Resume without replay: `get_state()` also holds the tf.data iterator state of each shard
this process saves (bytes under "iterator": the read position of every open file, the shuffle buffer, the
random generators, the partial packs and the prefetched batches), and `set_state()` of a
new iterator over the same stream restores it, so it continues with the next unseen
batch after reading only what the saved state did not already hold: no repeats, no
skips, and a cost that does not grow with the position. The Pile reader keeps each
file's position and identity as six integers in that state (t5lite/data/files/jsonl_cursor.py;
a changed file is refused in one line), the in-memory sources (MNLI, SQuAD) an index,
TFDS its own readers' offsets; `iterator_format` names that layout, and a state of
another format is replayed instead. The state's
size is set mostly by the shuffle buffer (seqio's default: 1,000 tokenized documents)
and the prefetched batches: a few MB a process (docs/data.md has measured sizes and
restore times). A stream that tf.data cannot save (a task whose source is a Python
generator) falls back to replay: the iterator is rebuilt and the `position` batches
already consumed are skipped (`tf.data.Dataset.skip`), exact but at the pipeline's own
speed, and a warning says so. The settings above are saved with the state; resuming
under changed ones raises DataError naming them, since the position would point into
another stream. The process count is not one of them: a resume on another number of
processes reads the saved data shards (unless DATA_SHARDS names others: refused), each
from the state its saving process wrote, and trains on the batches the first run would
have read next. So are the stream's inputs (t5lite/data/input_identity.py: the
vocabulary's hash and each data file's size and fingerprint): a resume that reads
another vocabulary or other files raises DataError naming both, unless
`allow_changed_inputs` (ALLOW_CHANGED_INPUTS=True): then the stream is read afresh under
the new inputs, skipping the `position` batches consumed (replay), and a warning says so.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from t5lite.data.sharding.layout import DataLayout
from t5lite.data.sharding.shards import ShardPlan
from t5lite.data.tf_env import import_tensorflow
from t5lite.errors import DataError
from t5lite.models.common.model_kinds import ENCODER_DECODER, MODEL_KINDS

tf = import_tensorflow()
import seqio  # noqa: E402

from t5lite.data import (blend, input_identity, iterator_bytes,  # noqa: E402
                         stream_errors, tasks)  # (importing tasks registers them)
from t5lite.data.iterator_bytes import (restore_iterator, save_iterator,  # noqa: E402,F401
                                        shard_states)
from t5lite.data.features import (check_lengths, feature_converter, has_inputs,  # noqa: E402,F401
                                  sequence_lengths)

log = logging.getLogger(__name__)



class SeqioIterator:
    """This process's batches of a SeqIO task; `get_state()` / `set_state()` resume it."""

    def __init__(self, name: str, *, split: str, feature_lengths: Mapping[str, int],
                 layout: DataLayout, model_kind: str = ENCODER_DECODER, pack: bool = False,
                 shuffle: bool = True, seed: int = 0, bos_id: int = 0,
                 start_position: int = 0, repeat: bool = True, drop_remainder: bool = True,
                 shuffle_buffer_size: Optional[int] = None, use_cached: bool = False,
                 data_shards: Optional[int] = None):
        """`layout`: the rows of each global batch this process reads. `repeat=False` ends
        after one epoch; `drop_remainder=False` then also yields the last, shorter batch.
        `data_shards`: the shards the global stream is cut into (DATA_SHARDS,
        t5lite/data/sharding/shards.py); None: `layout`'s shard count, or on `set_state` the
        saved stream's."""
        if model_kind not in MODEL_KINDS:
            raise ValueError(f"model_kind must be one of {MODEL_KINDS}, got {model_kind!r}")
        if not isinstance(layout, DataLayout):
            raise TypeError(f"layout must be a DataLayout, got {layout!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer (the order depends on it), got {seed!r}")
        self.provider = tasks.get_provider(name)
        if split not in self.provider.splits:
            raise DataError(f"task {name!r} has no split {split!r}; its splits are "
                            f"{', '.join(self.provider.splits)}")
        self.name, self.split = name, split
        self.feature_lengths = check_lengths(name, self.provider, model_kind, feature_lengths)
        self.layout = layout
        self.batch_size, self.rows = layout.batch_size, layout.rows
        self.model_kind, self.pack, self.bos_id = model_kind, bool(pack), int(bos_id)
        self.sequence_lengths = sequence_lengths(model_kind, self.feature_lengths)
        self.shuffle, self.seed = bool(shuffle), int(seed)
        self.repeat, self.drop_remainder = repeat, drop_remainder
        self.shuffle_buffer_size, self.use_cached = shuffle_buffer_size, use_cached
        self._shards_setting = data_shards
        self.plan = self._plan(data_shards or layout.shard_count)
        self.position = self._check_position(start_position)
        self._iterator = None  # built on the first __next__, after any set_state
        self._tf_iterators: Optional[List[Any]] = None  # one a shard of `plan.shards`
        self._saved: Optional[Dict[int, bytes]] = None  # shard -> state to restore on start
        self._unsaveable = False
        self._inputs: Optional[Dict[str, Any]] = None  # input_identity.stream_inputs, once
        self._blend: Optional[tuple] = None  # (Schedule, [a provider a source]), once

    @property
    def vocabulary(self):
        """The output vocabulary of the task's targets (`.vocab_size` counts the extra
        ids); a model's vocabulary must be at least that large."""
        return self.provider.output_features["targets"].vocabulary

    def length_cuts(self):
        """What TASK_FEATURE_LENGTHS cut in the first examples of this stream's split,
        logged (t5lite.data.length_check; None where the task's preprocessing makes its
        examples to fit)."""
        from t5lite.data import length_check
        cuts = length_check.sample_cuts(self.provider, self.split, self.feature_lengths)
        if cuts is not None:
            length_check.log_cuts(cuts, self.name, self.split)
        return cuts

    def _plan(self, count: int) -> ShardPlan:
        try:
            plan = ShardPlan(self.batch_size, count, self.layout.start, self.layout.stop)
        except ValueError as e:
            raise DataError(str(e)) from None
        if not self.drop_remainder and plan.count != self.layout.shard_count:
            raise ValueError("a stream that yields its last, shorter batch reads one data "
                             "shard a process: data_shards must be the layout's shard count")
        return plan

    # -- the stream ---------------------------------------------------------------------
    def dataset(self, skip: int = 0, shard: Optional[int] = None) -> tf.data.Dataset:
        """The batched dataset of data shard `shard` (None: this process's first), from
        batch `skip` on: `plan.rows_per_shard` rows a batch."""
        shard = self.plan.shards.start if shard is None else shard
        kwargs: Dict[str, Any] = dict(
            sequence_length=self.feature_lengths, split=self.split, shuffle=self.shuffle,
            seed=self.seed, num_epochs=None if self.repeat else 1, use_cached=self.use_cached,
            shard_info=seqio.ShardInfo(index=shard, num_shards=self.plan.count))
        if self.shuffle_buffer_size:
            kwargs["shuffle_buffer_size"] = self.shuffle_buffer_size
        convert = feature_converter(self.model_kind, self.pack, has_inputs(self.provider),
                                    self.bos_id,
                                    getattr(self.vocabulary, "zero_stand_in", None))
        schedule, parts = self.blend()
        if schedule is None:
            ds = convert(self.provider.get_dataset(**kwargs), self.feature_lengths)
        else:  # each source converted to rows on its own, then blended row by row
            ds = blend.blended([convert(p.get_dataset(**kwargs), self.feature_lengths)
                                for p in parts], schedule)
        ds = ds.batch(self.plan.rows_per_shard, drop_remainder=self.drop_remainder)
        if skip:
            ds = ds.skip(skip)
        options = tf.data.Options()
        options.deterministic = True
        # No autotuning: its model thread took a core's share from training on small hosts
        # (demo: 0.087 -> 0.076 s/step) and the iterator's destructor waits for that
        # thread's current round, up to 9 s at the end of every run. Untuned, the pipeline
        # measured as fast as tuned on 2 cores (docs/data.md); check a many-core host with
        # python -m t5lite.data_bench
        options.autotune.enabled = False
        # a stage whose state lives outside tf.data (a Python generator) makes saving fail,
        # never save a state that would not restore the same stream
        options.experimental_external_state_policy = iterator_bytes.FAIL
        return ds.with_options(options).prefetch(2)

    def blend(self) -> tuple:
        """(Schedule, [a seqio task a source]) when the stream blends sources
        (t5lite/data/blend.py): a SeqIO mixture (its tasks at its rates), or a text task
        whose TEXT_FILES weighs its globs; (None, None) otherwise."""
        if self._blend is None:
            self._blend = blend.sources_of(self.provider, self.split)
        return self._blend

    def source_rows(self, position: Optional[int] = None) -> Dict[str, int]:
        """{source: rows of the global stream it supplied} in the first `position` batches
        (None: those consumed so far); {} for a stream of one source."""
        schedule, _ = self.blend()
        if schedule is None:
            return {}
        position = self.position if position is None else int(position)
        rows = schedule.counts(position * self.plan.rows_per_shard) * self.plan.count
        return dict(zip(schedule.names, (int(r) for r in rows)))

    def __iter__(self) -> "SeqioIterator":
        return self

    def _start(self) -> None:
        saved, self._saved = self._saved or {}, None
        plan = self.plan
        if plan.read_factor > 1:
            log.warning("data: DATA_SHARDS=%d for %d data feeds: this process reads %d "
                        "shard(s) of %d rows for its %d rows (%.1fx the reading); a new run "
                        "can set DATA_SHARDS to a multiple of every process count it will "
                        "use", plan.count, self.layout.shard_count, len(plan.shards),
                        plan.rows_per_shard, self.rows, plan.read_factor)
        restored, replayed = [], []
        self._tf_iterators = []
        with stream_errors.stream_scope() as stream:
            for shard in plan.shards:
                state = saved.get(shard)
                iterator = None
                if state is not None:
                    iterator = iter(self.dataset(shard=shard))
                    try:
                        restore_iterator(iterator, state)
                        restored.append(len(state))
                    except (tf.errors.OpError, ValueError) as e:
                        log.warning("the saved data iterator state of shard %d does not fit "
                                    "this pipeline (%s); replaying %d batches instead", shard,
                                    _first_line(e), self.position)
                        iterator = None
                if iterator is None:
                    iterator = iter(self.dataset(skip=self.position, shard=shard))
                    replayed.append(shard)
                self._tf_iterators.append(iterator)
        if restored:
            log.info("data: continuing at batch %d from the saved iterator state of %d "
                     "shard(s) (%.1f MB)", self.position, len(restored), sum(restored) / 1e6)
        if replayed and self.position:
            log.info("data: rebuilding the stream and skipping the %d batches already "
                     "consumed (%d shard(s))", self.position, len(replayed))
        self._iterator = plan.rows_of(
            [stream_errors.numpy_iterator(it, stream) for it in self._tf_iterators])

    def __next__(self) -> Dict[str, np.ndarray]:
        if self._iterator is None:
            self._start()
        batch = next(self._iterator)
        self.position += 1
        out = {}
        for k, v in batch.items():
            out[k] = v.astype(np.float32) if k == "decoder_loss_weights" else \
                v.astype(np.int32, copy=False)
        return out

    def close(self) -> None:
        """Stop reading: the tf.data iterators (and the prefetch threads reading ahead for
        them) are released now, not whenever a garbage collection finds them. The
        position is kept: a later `__next__` rebuilds the stream and skips the batches
        already consumed (replay), so it continues where it stopped."""
        self._iterator = self._tf_iterators = None

    # -- state --------------------------------------------------------------------------
    def _stream(self) -> Dict[str, Any]:
        return {"task": self.name, "split": self.split, "seed": self.seed,
                "batch_size": self.batch_size, "data_shards": self.plan.count,
                "pack": self.pack, "feature_lengths": dict(self.feature_lengths),
                "bos_id": self.bos_id}

    def inputs(self) -> Dict[str, Any]:
        """The vocabulary and data files this stream reads (fingerprinted once)."""
        if self._inputs is None:
            self._inputs = input_identity.stream_inputs(self.provider, self.split)
        return self._inputs

    def get_state(self) -> Dict[str, Any]:
        """{"position": batches consumed, "iterator": {"count": the data shards, "states":
        {shard: tf.data iterator state (bytes)} of the shards this process saves
        (`ShardPlan.owns`)} (absent when the stream cannot be saved), "inputs": the
        vocabulary and files it reads, + the settings that define the stream (JSON-able
        but for the bytes)}."""
        state: Dict[str, Any] = {"position": self.position, **self._stream(),
                                 INPUTS_KEY: self.inputs()}
        states = self._iterator_states()
        if states is not None:
            state[ITERATOR_KEY] = {"count": self.plan.count, "states": states}
            state[FORMAT_KEY] = ITERATOR_FORMAT
        return state

    def _iterator_states(self) -> Optional[Dict[int, bytes]]:
        owned = [s for s in self.plan.shards if self.plan.owns(s)]
        if self._tf_iterators is None:  # restored and not yet read (or new: None)
            if self._saved is None or any(s not in self._saved for s in owned):
                return None
            return {s: self._saved[s] for s in owned}
        if self._unsaveable:
            return None
        try:
            return {s: save_iterator(self._tf_iterators[i])
                    for i, s in enumerate(self.plan.shards) if s in owned}
        except tf.errors.OpError as e:
            self._unsaveable = True
            log.warning("the data stream of %r cannot be saved (%s): a resume will replay "
                        "the batches consumed, exact but slower as training goes on",
                        self.name, _first_line(e))
            return None

    def set_state(self, state: Mapping[str, Any], allow_changed_inputs: bool = False) -> None:
        """Continue at batch `state["position"]` (the next batch is that one), from the
        saved iterator states of this process's shards when `state` has them (a shard
        without one is replayed). The stream's data shards are the saved ones unless
        `data_shards` was given. DataError when the stream's settings or (unless
        `allow_changed_inputs`) its inputs differ from the saved ones."""
        if "position" not in state:
            raise DataError(f"data iterator state needs a 'position' entry (batches "
                            f"consumed), got {dict(state)}; was the checkpoint written by "
                            f"another data pipeline?")
        saved = {**state}
        if "process_count" in saved:  # (before DATA_SHARDS: a shard a data feed)
            saved.setdefault("data_shards", saved.pop("process_count"))
        plan = self.plan
        if self._shards_setting is None and "data_shards" in saved and \
                saved["data_shards"] != plan.count and _json(saved.get("batch_size")) == \
                self.batch_size:
            plan = self._plan(int(saved["data_shards"]))  # the stream goes on as it began
        mine = {**self._stream(), "data_shards": plan.count}
        changed = {k: (saved[k], v) for k, v in mine.items()
                   if k in saved and _json(saved[k]) != _json(v)}
        if changed:
            what = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise DataError(
                f"the checkpoint's data position (batch {state['position']}) belongs to "
                f"another data stream: {what}; resuming would repeat or skip data. Set "
                f"them back to the saved values (the run's config.gin records them), or "
                f"train the changed setup from this checkpoint in a new MODEL_DIR with "
                f"INITIAL_CHECKPOINT_PATH")
        self.position = self._check_position(state["position"])
        if plan.count != self.plan.count:
            log.info("data: the checkpoint's stream has %d data shards (DATA_SHARDS); "
                     "this process reads shard(s) %d-%d of them", plan.count,
                     plan.shards.start, plan.shards.stop - 1)
            self.plan = plan
        states = shard_states(state.get(ITERATOR_KEY), plan.count)
        if states and state.get(FORMAT_KEY) != ITERATOR_FORMAT:
            log.warning("the checkpoint's data iterator state was written by an earlier "
                        "t5lite (its readers' positions are not this one's): replaying "
                        "the %d batches consumed instead", self.position)
            states = None
        changed = input_identity.difference(state[INPUTS_KEY], self.inputs()) \
            if INPUTS_KEY in state else None
        if changed and not allow_changed_inputs:
            raise DataError(
                f"{changed}; resuming would train on another token stream. Point the run "
                f"back at the inputs it trained on (its config.gin records the settings), "
                f"or set ALLOW_CHANGED_INPUTS=True to resume with these on purpose (the "
                f"stream is then read afresh, skipping the {self.position} batches consumed)")
        if changed:
            log.warning("%s; ALLOW_CHANGED_INPUTS: resuming with them, reading the stream "
                        "afresh and skipping the %d batches consumed", changed, self.position)
            states = None
        self._saved = states if states and self.position else None
        self.close()  # the next batch starts from the state set

    @staticmethod
    def _check_position(position) -> int:
        position = int(np.asarray(position))
        if position < 0:
            raise ValueError(f"data position must be >= 0, got {position}")
        return position


ITERATOR_KEY = "iterator"  # a checkpoint stores it per shard (runtime/checkpointing/data_iterator_item.py)
# The layout of the readers' state inside it: 2 = the Pile reader's six-integer positions
# (t5lite/data/files/jsonl_cursor.py). A state without it (or another) is replayed, not restored.
FORMAT_KEY, ITERATOR_FORMAT = "iterator_format", 2
INPUTS_KEY = "inputs"  # input_identity.stream_inputs of the stream


def _json(value):
    """`value` as it reads back from a JSON checkpoint (tuples as lists)."""
    return json.loads(json.dumps(value))


def _first_line(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


# The name callers use (T5X's get_dataset / MaxText's create_data_iterator role).
make_iterator = SeqioIterator
