"""RANDOM_SEED of a training run: an integer as given, or None, T5X's "a seed drawn at
random" (its GPU recipes set it), made resumable: the seed is drawn once, at the run's
start, logged, and kept in MODEL_DIR/random_seed.json, so that every restart of the run
continues with it exactly as a run given that integer does. One seed sets the
initialization, dropout and the data order.

    check(random_seed)                        # before anything loads: ConfigError if bad
    seed = resolve(random_seed, model_dir)    # every process, holding the run lock

Process 0 reads the kept seed or draws and keeps one; every process gets its value in
one broadcast. A seed file that cannot be read is a ConfigError naming it.
"""
from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path
from typing import Optional, Tuple

import jax
import numpy as np

from t5lite.errors import ConfigError
from t5lite.runtime.process import disk_space

log = logging.getLogger(__name__)
SEED_FILE = "random_seed.json"
SEED_LIMIT = 2 ** 31  # drawn seeds are below it (any int >= 0 is taken when given)


def check(random_seed: Optional[int]) -> None:
    """ConfigError unless RANDOM_SEED is None or an integer >= 0."""
    if random_seed is None:
        return
    if isinstance(random_seed, bool) or not isinstance(random_seed, int) or random_seed < 0:
        raise ConfigError(f"RANDOM_SEED must be an integer >= 0, or None for a seed drawn at "
                          f"the run's start (kept in MODEL_DIR/{SEED_FILE}), got "
                          f"{random_seed!r}")


def resolve(random_seed: Optional[int], model_dir: Path) -> int:
    """The run's seed: `random_seed` when given; for None the seed kept in MODEL_DIR, or a
    new one drawn and kept there. Call on every process (they meet in a broadcast)."""
    check(random_seed)
    path = Path(model_dir) / SEED_FILE
    if random_seed is not None:
        if jax.process_index() == 0:
            _warn_if_kept_differs(path, random_seed)
        return random_seed
    seed, error = -1, None
    if jax.process_index() == 0:
        try:
            seed, drawn = _kept_or_drawn(path)
            if drawn:
                log.info("RANDOM_SEED=None: drew seed %d for this run, kept in %s (a restart "
                         "continues with it; RANDOM_SEED=%d repeats the run)", seed, path, seed)
            else:
                log.info("RANDOM_SEED=None: this run's seed is %d, drawn at its start (%s)",
                         seed, path)
        except Exception as e:  # noqa: BLE001 - shared with the other processes, then raised
            error = e
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        seed = int(multihost_utils.broadcast_one_to_all(np.int64(seed)))
    if error is not None:
        raise error
    if seed < 0:
        raise ConfigError(f"RANDOM_SEED=None: process 0 could not read or keep this run's seed "
                          f"in {path} (its log says why)")
    return seed


def _kept_or_drawn(path: Path) -> Tuple[int, bool]:
    """(seed, drawn now): the seed in `path`, else a new one written there whole."""
    if path.exists():
        return _read(path), False
    seed = secrets.randbelow(SEED_LIMIT)
    path.parent.mkdir(parents=True, exist_ok=True)
    disk_space.replace_file(path, json.dumps({"random_seed": seed}) + "\n",
                            what="the run's drawn RANDOM_SEED")
    return seed, True


def _read(path: Path) -> int:
    try:
        seed = json.loads(path.read_text())["random_seed"]
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(seed)
        return seed
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} does not hold this run's seed ({{\"random_seed\": N}}): "
                          f"restore it, or set RANDOM_SEED to the run's seed (its first log "
                          f"lines name it), or delete it to draw a new one (the run then "
                          f"no longer resumes exactly)") from None


def _warn_if_kept_differs(path: Path, random_seed: int) -> None:
    if not path.exists():
        return
    try:
        kept = _read(path)
    except ConfigError:
        return
    if kept != random_seed:
        log.warning("RANDOM_SEED=%d, but this run's seed, drawn at its start, is %d (%s): "
                    "the run goes on with %d (RANDOM_SEED=None continues with %d)",
                    random_seed, kept, path, random_seed, kept)
