"""The door into the TensorFlow / SeqIO side of the data layer, for code that must not
import it at module load (the training loop, eval, infer).

    tasks = import_tasks(DataSettings(pile_dir="/data/pile", vocabulary_path="..."))
    provider = tasks.get_provider("pile_span_corruption")

TensorFlow, seqio and t5 load here (TensorFlow with its GPUs hidden). The t5 package
registers gin configurables when it is imported; after a command has finalized its gin
config that needs the config unlocked, which this function does.
"""
from __future__ import annotations

import logging
import sys
from typing import Optional

from t5lite.data.settings import DataSettings
from t5lite.errors import DataError


def import_tasks(data: Optional[DataSettings] = None):
    """The `t5lite.data.tasks` module (every task registered), with `data` applied through
    `tasks.configure` unless it is None (then the settings in force stay)."""
    import gin
    if "t5lite.data.tasks" not in sys.modules:  # the first time: seconds of silence else
        logging.getLogger(__name__).info(
            "loading TensorFlow, SeqIO and the registered tasks (once per process, a few "
            "seconds)")
    with gin.unlock_config():
        from t5lite.data import tasks
    if data is not None:
        tasks.configure(data)
    return tasks


def check_split(tasks_module, name: str, split: str, macro: str = "SPLIT"):
    """The task or mixture `name`; DataError naming `macro` when it has no `split`."""
    provider = tasks_module.get_provider(name)
    if split not in provider.splits:
        raise DataError(f"task {name!r} has no split {split!r}; its splits are "
                        f"{', '.join(provider.splits)} (set {macro})")
    return provider
