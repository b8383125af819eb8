"""t5lite's SeqIO tasks, registered when this module is imported.

    task                  data                                    splits
    pile_span_corruption  the Pile: PILE_DIR (jsonl / jsonl.zst)   train, validation, test
                          or TFDS the_pile
    pile_lm               the same, decoder-only language modeling
    c4_span_corruption    C4: C4_DIR (allenai/c4's json.gz)         train, validation
                          or TFDS c4/en (local)
    c4_lm                 the same, decoder-only language modeling
    text_span_corruption  TEXT_FILES (globs of .jsonl, .jsonl.gz,   train, validation
                          .json.gz, .jsonl.zst, .parquet; their   (TEXT_VALIDATION_FILES)
                          TEXT_FIELD); FineWeb, DCLM, your own
    text_lm               the same, decoder-only language modeling
    mnli                  MNLI_DIR (MultiNLI jsonl or GLUE TSVs)   train, validation_matched,
                          or TFDS glue/mnli                        validation_mismatched
    squad_v1_1            SQUAD_DIR (train-v1.1.json,              train, validation
                          dev-v1.1.json) or TFDS squad/v1.1

Preprocessing is the t5 package's: span corruption with noise density 0.15 and mean span
length 3 (sentinels counted down from the top of the vocabulary: its extra ids, refused
when EXTRA_IDS=0), `full_lm` for the
language-modeling tasks (EOS only at document ends, documents concatenated and split to
the targets length), T5's GLUE text format and label words for MNLI ("mnli hypothesis:
... premise: ..." -> "entailment" / "neutral" / "contradiction"; accuracy) and its SQuAD
format ("question: ... context: ..." -> the first answer; exact match and F1 against
all answers).

Data locations and the vocabulary are read when a dataset is built, from the
`DataSettings` (t5lite/data/settings.py) the tasks were registered with: those of
`configure(DataSettings(...))`, which the commands call with the gin macros, and for what
they leave None the environment variables, read at build time. Each task's source and
vocabulary hold that value; no module-level setting is read. Nothing is downloaded.

Where the settings are global: SeqIO's TaskRegistry is process-wide and seqio finds a
task by its name, so the registered tasks are the one place a run's settings are kept
for the whole process. `configure(data)` replaces every t5lite task there with one built
on `data` (a task object fetched before keeps its own settings); `configured()` reads
back the settings of the registered tasks.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from typing import Dict, List, Optional, Tuple

from t5lite.data import settings, source_resolvers, sources, vocabularies
from t5lite.data.files.readers import MNLI_LABELS
from t5lite.data.tf_env import as_written, import_tensorflow
from t5lite.errors import DataError, UnknownTaskError

tf = import_tensorflow()
import seqio  # noqa: E402
from t5.data import glue_utils  # noqa: E402
from t5.data import postprocessors as t5_postprocessors  # noqa: E402
from t5.data import preprocessors as t5_preprocessors  # noqa: E402
from t5.evaluation import metrics as t5_metrics  # noqa: E402

NOISE_DENSITY = 0.15
MEAN_NOISE_SPAN_LENGTH = 3.0
PILE_SPLITS = ("train", "validation", "test")
C4_SPLITS = ("train", "validation")
TEXT_SPLITS = ("train", "validation")
MNLI_SPLITS = ("train", "validation_matched", "validation_mismatched")
SQUAD_SPLITS = ("train", "validation")
# The GLUE builder config fields T5's glue_utils reads (name, label_classes), without
# importing TFDS's GLUE module.
_MNLI_GLUE_CONFIG = types.SimpleNamespace(name="mnli", label_classes=list(MNLI_LABELS))

TASK_NAMES: Tuple[str, ...] = ("pile_span_corruption", "pile_lm", "c4_span_corruption",
                               "c4_lm", "text_span_corruption", "text_lm", "mnli",
                               "squad_v1_1")


def _features(vocabulary, inputs: bool) -> Dict[str, seqio.Feature]:
    out = {"targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)}
    if inputs:
        out = {"inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
               **out}
    return out


def _needs_sentinels(dataset, output_features):
    """Span corruption's sentinels are the vocabulary's extra ids: refuse a vocabulary
    without them (its top pieces would silently stand in)."""
    if output_features["targets"].vocabulary.extra_ids == 0:
        raise DataError("span corruption needs sentinel ids, but the vocabulary has no extra "
                        "ids (EXTRA_IDS=0); set EXTRA_IDS to 100 (T5's), or train a "
                        "decoder-only model on the *_lm task instead")
    return dataset


def _span_corruption_steps() -> List:
    return [_needs_sentinels,
            functools.partial(t5_preprocessors.rekey,
                              key_map={"inputs": None, "targets": "text"}),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            functools.partial(t5_preprocessors.span_corruption, noise_density=NOISE_DENSITY,
                              mean_noise_span_length=MEAN_NOISE_SPAN_LENGTH),
            seqio.preprocessors.append_eos_after_trim]


def _lm_steps() -> List:
    return [functools.partial(t5_preprocessors.rekey, key_map={"targets": "text"}),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            t5_preprocessors.full_lm]


class Task(seqio.Task):
    """A t5lite task: its source, preprocessors and SeqIO's trimming are traced
    `as_written` (AutoGraph off: the same dataset, built faster)."""

    def get_dataset(self, *args, **kwargs):
        return as_written(super().get_dataset)(*args, **kwargs)


def _add(name: str, **kwargs) -> None:
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, task_cls=Task, **kwargs)


def _source(data: settings.DataSettings, splits: Tuple[str, ...], resolver,
            description: str) -> sources.DeferredSource:
    """A source that asks `resolver(splits, settings)` for its data at build time, with
    `data` resolved then."""
    return sources.DeferredSource(splits, functools.partial(resolver, splits), description,
                                  data)


def register_tasks(data: Optional[settings.DataSettings] = None) -> None:
    """(Re-)register every t5lite task with `data` (None: DataSettings(), every setting
    from its environment variable), which its source and vocabulary hold and resolve
    when a dataset is built."""
    data = data if data is not None else settings.DataSettings()
    vocab = vocabularies.DeferredVocabulary(data=data)
    pile = _source(data, PILE_SPLITS, source_resolvers.resolve_pile,
                   "the Pile (PILE_DIR or TFDS the_pile)")
    c4 = _source(data, C4_SPLITS, source_resolvers.resolve_c4, "C4 (C4_DIR or TFDS c4/en)")
    text = _source(data, TEXT_SPLITS, source_resolvers.resolve_text_files,
                   "text files (TEXT_FILES)")
    for prefix, source in (("pile", pile), ("c4", c4), ("text", text)):
        _add(f"{prefix}_span_corruption", source=source,
             preprocessors=_span_corruption_steps(),
             output_features=_features(vocab, inputs=True), metric_fns=[])
        _add(f"{prefix}_lm", source=source, preprocessors=_lm_steps(),
             output_features=_features(vocab, inputs=False), metric_fns=[])

    _add("mnli",
         source=_source(data, MNLI_SPLITS, source_resolvers.resolve_mnli,
                        "MNLI (MNLI_DIR or TFDS glue/mnli)"),
         preprocessors=[glue_utils.get_glue_text_preprocessor(_MNLI_GLUE_CONFIG),
                        seqio.preprocessors.tokenize,
                        seqio.CacheDatasetPlaceholder(),
                        seqio.preprocessors.append_eos_after_trim],
         output_features=_features(vocab, inputs=True),
         postprocess_fn=glue_utils.get_glue_postprocess_fn(_MNLI_GLUE_CONFIG),
         metric_fns=glue_utils.get_glue_metric("mnli"))

    _add("squad_v1_1",
         source=_source(data, SQUAD_SPLITS, source_resolvers.resolve_squad,
                        "SQuAD v1.1 (SQUAD_DIR or TFDS squad/v1.1)"),
         preprocessors=[t5_preprocessors.squad,
                        seqio.preprocessors.tokenize,
                        seqio.CacheDatasetPlaceholder(),
                        seqio.preprocessors.append_eos_after_trim],
         output_features=_features(vocab, inputs=True),
         postprocess_fn=t5_postprocessors.qa,
         metric_fns=[t5_metrics.squad])
    _add_mixtures(data.mixtures or ())


def _add_mixtures(mixtures) -> None:
    """The MIXTURES of the settings, registered as SeqIO mixtures (replacing any of the
    same name); a name of a task, or a task that is not registered, in one line."""
    for name, pairs in mixtures:
        if name in seqio.TaskRegistry.names():
            raise DataError(f"MIXTURES: {name!r} is a task's name; give the mixture "
                            f"another")
        unknown = [t for t, _ in pairs if t not in seqio.TaskRegistry.names()
                   and t not in seqio.MixtureRegistry.names()]
        if unknown:
            get_provider(unknown[0])  # the error listing t5lite's tasks
        if name in seqio.MixtureRegistry.names():
            seqio.MixtureRegistry.remove(name)
        seqio.MixtureRegistry.add(name, list(pairs))


def configure(data: Optional[settings.DataSettings] = None) -> None:
    """Register the tasks again with `data`: where they find their vocabulary and data (a
    None field: the environment variable, read when a dataset is built; see
    t5lite/data/settings.py). None: DataSettings(), the environment alone.

    data.demo_dir (the DEMO_DATA_DIR macro of configs/demo_*.gin): the generated demo
    corpus (t5lite.data.files.demo_corpus), written there on first use; it supplies every path
    not given."""
    data = data if data is not None else settings.DataSettings()
    if data.demo_dir:
        from t5lite.data.files import demo_corpus
        demo = demo_corpus.ensure(data.demo_dir)
        data = dataclasses.replace(data, **{
            name: path for name, path in demo.items()
            if name in settings.SETTINGS and getattr(data, name) in (None, "")})
    register_tasks(data)


def configured() -> settings.DataSettings:
    """The settings the registered t5lite tasks hold: those of the last `configure` (or
    `register_tasks`), kept in SeqIO's TaskRegistry; DataSettings() when none is
    registered."""
    return vocabularies.settings_in_force()


def get_provider(name: str):
    """The registered task or mixture `name`; UnknownTaskError listing t5lite's tasks."""
    if name in seqio.MixtureRegistry.names():
        return seqio.MixtureRegistry.get(name)
    if name in seqio.TaskRegistry.names():
        return seqio.TaskRegistry.get(name)
    import difflib
    close = difflib.get_close_matches(name, list(TASK_NAMES) + list(
        seqio.TaskRegistry.names()) + list(seqio.MixtureRegistry.names()), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownTaskError(
        f"unknown task or mixture {name!r}{hint}: t5lite registers {', '.join(TASK_NAMES)} "
        f"(and the random-batch task 'synthetic'): set MIXTURE_OR_TASK_NAME to one of "
        f"them, or register others with seqio before training")


register_tasks()
