"""Blends: several sources trained on in fixed shares of the rows, as Megatron blends its
datasets by their weights.

    TEXT_FILES = [('/data/web/*.jsonl.zst', 0.7), ('/data/code/*.parquet', 0.3)]
    TEXT_FILES = '@/data/blend.txt'    # Megatron's data weights: "0.7 /data/web/*.jsonl.zst
                                       #   0.3 /data/code/*.parquet" (whitespace, # comments)
    a SeqIO mixture (registered in Python, or MIXTURE_RATES from Gin): its tasks at its rates

Each source is read, preprocessed and converted to the model's rows on its own (packed or
not: a packed row holds one source's examples), and row k of a data shard's stream is a
row of source `Schedule.table[k % period]`: a fixed order, the same for every seed and
shard (each source's own order still follows the seed). Source i's j-th row is due at
(j + 1/2) / w_i, and rows are taken in order of due time (ties: the lower index), so in
every prefix of the stream each source's rows are within (sources + 1) / 2 rows of its
share (over 10,000 rows, shares within 0.02% of the weights, against about 0.5% for random
sampling). The order repeats every `period` rows, the weights' sum once written as whole
numbers in their simplest ratio (0.7 / 0.3: 10 rows; weights that are no fractions of
denominator <= 10,000 are rounded to 1 / 10,000 of their total first).

Shares are of rows, as Megatron's weights are shares of its samples: unpacked, a row is
one example (what T5X's mixture rates share out); packed, a row is one source's examples
packed together, so the shares are of rows (about tokens), not of examples.

Counted exactly: the rows of each source in the first n rows of a shard's stream follow
from n alone (`Schedule.counts`), so every process knows every source's rows trained on
at any step, after a resume too (TensorBoard `data/rows/<source>`). TensorFlow and SeqIO
are imported by `blended` and `sources_of` only.
"""
from __future__ import annotations

import math
import os
import re
from fractions import Fraction
from typing import List, Optional, Sequence, Tuple

import numpy as np

from t5lite.errors import ConfigError, DataError, DataNotFoundError

RESOLUTION = 10_000  # weights are rounded to 1 / RESOLUTION of their total


class Schedule:
    """Which source each row of a stream comes from (module docstring).

    `names` [sources], `weights` [sources] (>= 0, finite, not all 0; a source of weight 0 is
    never read and is left out: `names` / `units` hold the others)."""

    def __init__(self, names: Sequence[str], weights: Sequence[float], what: str = "weights"):
        if len(names) != len(weights) or not names:
            raise ConfigError(f"{what}: a blend needs one weight a source, got {list(weights)}")
        bad = [w for w in weights if isinstance(w, bool) or not isinstance(w, (int, float))
               or not math.isfinite(w) or w < 0]
        if bad:
            raise ConfigError(f"{what}: a weight must be a finite number >= 0, got {bad[0]!r}")
        total = float(sum(weights))
        if total <= 0:
            raise ConfigError(f"{what}: every weight is 0; give at least one source a "
                              f"positive weight")
        kept = [(n, w) for n, w in zip(names, weights) if w > 0]
        units = _whole_numbers([w for _, w in kept], total)
        small = [n for (n, _), u in zip(kept, units) if u == 0]
        if small:
            raise ConfigError(f"{what}: the weight of {small[0]} is under 1/{2 * RESOLUTION} "
                              f"of the total; raise it or set it to 0")
        divisor = math.gcd(*units)
        self.names: Tuple[str, ...] = tuple(n for n, _ in kept)
        self.units = np.array([u // divisor for u in units], np.int64)  # [sources]
        self.period = int(self.units.sum())
        due = np.concatenate([(2 * np.arange(u) + 1) / u for u in self.units])
        source = np.concatenate([np.full(u, i) for i, u in enumerate(self.units)])
        self.table = source[np.lexsort((source, due))].astype(np.int64)  # [period]

    @property
    def shares(self) -> np.ndarray:
        """[sources] the share of the rows each source gets."""
        return self.units / self.period

    def counts(self, rows: int) -> np.ndarray:
        """[sources] int64: each source's rows among the first `rows` of a stream."""
        whole, part = divmod(int(rows), self.period)
        return whole * self.units + np.bincount(self.table[:part], minlength=len(self.units))


def _whole_numbers(weights: Sequence[float], total: float) -> List[int]:
    """The weights as whole numbers in the same ratio: exactly where each is a fraction
    of denominator <= RESOLUTION (0.7 / 0.3 -> 7, 3; 2, 1 -> 2, 1) and the period stays
    short, else rounded to 1 / RESOLUTION of the total."""
    exact = [Fraction(w).limit_denominator(RESOLUTION) for w in weights]
    if all(float(f) == float(w) for f, w in zip(exact, weights)):
        scale = math.lcm(*(f.denominator for f in exact))
        units = [int(f * scale) for f in exact]
        if sum(units) <= RESOLUTION:
            return units
    return [int(round(w / total * RESOLUTION)) for w in weights]


def blended(datasets: Sequence, schedule: Schedule):
    """One tf.data stream of `datasets` (one a source of `schedule`, rows of the same
    features), row k from `datasets[schedule.table[k % period]]`; it ends when the source
    due next ends. Its state (the position in the schedule, each source's) is saved with
    the iterator."""
    import tensorflow as tf
    choices = tf.data.Dataset.from_tensor_slices(schedule.table).repeat()
    return tf.data.Dataset.choose_from_datasets(list(datasets), choices,
                                                stop_on_empty_dataset=True)


def sources_of(provider, split: str) -> tuple:
    """(Schedule, [a seqio task a source]) when `provider` blends sources on `split`: a
    SeqIO mixture (its tasks at its rates), or a text task whose TEXT_FILES weighs its
    globs (a task a glob, with the text task's preprocessing); else (None, None)."""
    import seqio
    if isinstance(provider, seqio.Mixture):
        tasks_ = list(provider.tasks)
        try:
            rates = [provider.get_rate(t) for t in tasks_]
        except Exception as e:  # a rate computed from statistics seqio cannot read here
            raise DataError(f"mixture {provider.name!r}: its rates cannot be read ({e}); "
                            f"give it numbers") from None
        schedule = Schedule([t.name for t in tasks_], rates,
                          f"the rates of mixture {provider.name!r}")
        by_name = {t.name: t for t in tasks_}
        return schedule, [by_name[n] for n in schedule.names]
    groups = getattr(getattr(provider, "source", None), "blend", lambda _: None)(split)
    if not groups:
        return None, None
    schedule = Schedule([g[0] for g in groups], [g[1] for g in groups], "TEXT_FILES")
    parts = {name: source for name, _, source in groups}
    return schedule, [type(provider)(f"{provider.name}.{name}", source=parts[name],
                                 preprocessors=provider.preprocessors,
                                 output_features=provider.output_features)
                      for name in schedule.names]


# -- weighted globs (TEXT_FILES) -----------------------------------------------------------

def read_weights_file(path: str, what: str) -> List[Tuple[str, float]]:
    """[(glob, weight)] of a Megatron data weights file: weight and path pairs separated by
    whitespace (lines or not), `#` to the end of a line a comment."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise DataNotFoundError(f"{path}: cannot read the weights file ({what}): "
                                f"{e.strerror or e}") from None
    words = re.sub(r"#[^\n]*", " ", text).split()
    if not words or len(words) % 2:
        raise ConfigError(f"{path}: a weights file holds weight and path pairs "
                          f"(\"0.7 /data/web/*.jsonl.zst 0.3 /data/code/*.parquet\"), got "
                          f"{len(words)} word(s) ({what})")
    pairs = []
    for weight, glob_ in zip(words[::2], words[1::2]):
        try:
            pairs.append((glob_, float(weight)))
        except ValueError:
            raise ConfigError(f"{path}: {weight!r} is not a weight (a weights file holds "
                              f"weight and path pairs, the weight first; {what})") from None
    base = os.path.dirname(os.path.abspath(path))
    return [(os.path.join(base, os.path.expanduser(g)), w) for g, w in pairs]


def source_names(globs: Sequence[str]) -> List[str]:
    """A short name for each glob (TensorBoard's data/rows/<name>): the directory its
    wildcards start under ('/data/web/*.jsonl.zst' -> 'web'), or a single file's name
    without its suffixes ('/data/wiki.parquet' -> 'wiki'); a name taken twice gets _2, _3."""
    names: List[str] = []
    for pattern in globs:
        parts = [p for p in pattern.replace("\\", "/").split("/") if p]
        wild = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), None)
        if wild is None:  # one file: its name
            stem = parts[-1].split(".")[0] if parts else "text"
        else:  # the directory the wildcards start under
            stem = parts[wild - 1] if wild > 0 else "text"
        stem = re.sub(r"\W", "_", stem) or "text"
        name, n = stem, 1
        while name in names:
            n += 1
            name = f"{stem}_{n}"
        names.append(name)
    return names


def weighted_globs(value, what: str) -> Optional[List[Tuple[str, float]]]:
    """[(glob, weight)] of a TEXT_FILES value that weighs its globs: a list of (glob,
    weight) pairs, or '@<weights file>'; None for plain globs."""
    if isinstance(value, str) and value.startswith("@"):
        path = os.path.expanduser(value[1:])
        pairs = read_weights_file(path, what)
        Schedule([g for g, _ in pairs], [w for _, w in pairs], f"{path} ({what})")
        return pairs
    if not isinstance(value, (list, tuple)) or not any(
            isinstance(v, (list, tuple)) for v in value):
        return None
    pairs = []
    for v in value:
        if not (isinstance(v, (list, tuple)) and len(v) == 2 and isinstance(v[0], str)):
            raise ConfigError(f"{what}: a weighted list holds (glob, weight) pairs, "
                              f"e.g. [('/data/web/*.jsonl', 0.7), ('/data/code/*.parquet', "
                              f"0.3)], got {v!r}")
        pairs.append((os.path.expanduser(v[0]), v[1]))
    Schedule([g for g, _ in pairs], [w for _, w in pairs], what)  # the weights checked
    return pairs
