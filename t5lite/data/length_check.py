"""What TASK_FEATURE_LENGTHS cut, said instead of done silently. SeqIO trims every inputs
and targets sequence to its feature length (its EOS kept) and says only that the lengths
"may be insufficient"; a label cut that way can never be predicted whole, and a model
trained on cut targets never sees their ends.

    cuts = sample_cuts(provider, "train", {"inputs": 512, "targets": 4})  # a sample
    log_cuts(cuts, "mnli", "train")        # one line: how many were cut, the lengths needed
    cut = cut_labels(examples, vocabulary, 4)   # eval: the labels that cannot fit

Training counts the cuts in the first `SAMPLE` examples of the split (read once, in file
order, before the run starts: about a second for MNLI); evaluation checks every label of
the split it compares against (`TaskEvaluator` refuses a cut label, in one line).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, Iterable, List, Mapping, Optional

log = logging.getLogger(__name__)
SAMPLE = 1000  # examples a training run's check reads


@dataclasses.dataclass(frozen=True)
class Cuts:
    """Of `examples` examples, how many each feature length cut ({feature: count}), and
    the longest sequence met ({feature: tokens, EOS included})."""

    examples: int
    lengths: Mapping[str, int]
    cut: Mapping[str, int]
    longest: Mapping[str, int]

    def fractions(self) -> Dict[str, float]:
        """{feature: fraction of the examples whose feature was cut}."""
        return {k: (self.cut[k] / self.examples if self.examples else 0.0) for k in self.cut}

    def metrics(self) -> Dict[str, float]:
        """TensorBoard scalars: data/<feature>_cut_fraction and the sample size."""
        out = {f"data/{k}_cut_fraction": v for k, v in self.fractions().items()}
        out["data/length_check_examples"] = float(self.examples)
        return out


def sample_cuts(provider, split: str, feature_lengths: Mapping[str, int],
                examples: int = SAMPLE) -> Optional[Cuts]:
    """The cuts `feature_lengths` make in the first `examples` examples of `split` of a
    seqio task or mixture: its preprocessing run without a sequence length (so that
    `append_eos_after_trim` appends its EOS and trims nothing), each sequence's length
    against its feature length. None for a task whose preprocessing needs the lengths to
    make its examples (span corruption, language-model chunks): it makes them to fit,
    and cuts nothing."""
    import tensorflow as tf
    from t5lite.data import stream_errors
    from t5lite.data.tf_env import as_written
    lengths = {k: int(v) for k, v in feature_lengths.items() if k in ("inputs", "targets")}
    with stream_errors.stream_scope() as stream:
        try:
            ds = provider.get_dataset(sequence_length=None, split=split, shuffle=False,
                                      num_epochs=1, trim_output_features=False)
        except (TypeError, KeyError, ValueError, tf.errors.OpError) as e:
            log.debug("data: no length check for %s: %s", getattr(provider, "name", "?"), e)
            return None
        ds = as_written(ds.map)(lambda ex: {k: tf.size(ex[k]) for k in lengths if k in ex})
        ds = ds.take(examples)
        sizes = list(stream_errors.numpy_iterator(ds, stream))
    stream_errors.raise_deferred_error(stream)
    return _count(sizes, {k: n for k, n in lengths.items() if all(k in s for s in sizes)})


def _count(sizes: List[Mapping[str, Any]], lengths: Mapping[str, int]) -> Cuts:
    cut = {k: sum(int(s[k]) > n for s in sizes) for k, n in lengths.items()}
    longest = {k: max((int(s[k]) for s in sizes), default=0) for k in lengths}
    return Cuts(len(sizes), dict(lengths), cut, longest)


def describe(cuts: Cuts, name: str, split: str) -> Optional[str]:
    """One sentence on what the lengths cut, None when they cut nothing."""
    parts = [f"the {k} of {cuts.cut[k]} of {cuts.examples} examples (the longest: "
             f"{cuts.longest[k]} tokens with EOS; cut to {cuts.lengths[k]})"
             for k in cuts.lengths if cuts.cut[k]]
    if not parts:
        return None
    needed = ", ".join(f"'{k}': {cuts.longest[k]}" for k in cuts.lengths if cuts.cut[k])
    return (f"TASK_FEATURE_LENGTHS cut {' and '.join(parts)} of {name} {split}: the model "
            f"never sees their ends; TASK_FEATURE_LENGTHS with {{{needed}}} keeps them whole")


def log_cuts(cuts: Cuts, name: str, split: str) -> None:
    """A warning naming what was cut, or one info line saying nothing was."""
    line = describe(cuts, name, split)
    if line:
        log.warning("data: %s", line)
    else:
        log.info("data: TASK_FEATURE_LENGTHS %s keep the first %d examples of %s %s whole "
                 "(longest: %s tokens with EOS)", dict(cuts.lengths), cuts.examples, name,
                 split, dict(cuts.longest))


def cut_labels(examples: Iterable[Mapping[str, Any]], vocabulary, targets_length: int,
               key: str = "targets_pretokenized") -> Cuts:
    """Of an evaluation's examples, those whose label (`key`, the text its metrics compare
    predictions with) takes more than `targets_length` tokens with its EOS: a prediction
    can never equal it."""
    sizes = []
    for ex in examples:
        label = ex.get(key)
        if label is None:
            continue
        text = label.decode("utf-8") if isinstance(label, bytes) else str(label)
        sizes.append({"targets": len(vocabulary.encode(text)) + 1})
    return _count(sizes, {"targets": int(targets_length)})
