"""t5lite/runtime/process/gc_settings.py: a command's process keeps its imports out of the
cycle collector's walks and collects every 50,000 allocations; a command's main(argv) run
in a process that lives on (this one) leaves the collector as it was."""
import gc
import subprocess
import sys

import pytest

import train_helpers as th
from t5lite.runtime.process import gc_settings

PROBE = ("import gc, sys\n"
         "from t5lite.config import command\n"
         "before = (gc.get_threshold()[0], gc.get_freeze_count())\n"
         "command.run_main(lambda: print(before[0], before[1],"
         " gc.get_threshold()[0], gc.get_freeze_count(), flush=True))\n")


def test_a_command_process_freezes_its_imports_and_collects_less_often():
    proc = subprocess.run([sys.executable, "-c", PROBE], env=th.env(1), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, th.describe(proc)
    threshold_before, frozen_before, threshold, frozen = map(int, proc.stdout.split())
    assert threshold_before == 700 and frozen_before < 1_000  # a fresh interpreter's
    assert threshold == gc_settings.FIRST_THRESHOLD == 50_000
    assert frozen > 100_000  # jax, flax, optax, Orbax and t5lite's modules, imported


def test_main_in_a_process_that_lives_on_leaves_the_collector_alone(tmp_path):
    from t5lite import train
    from t5lite.errors import ConfigError
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(ConfigError):
        train.main([f"--gin_file={tmp_path / 'missing.gin'}"])
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() <= frozen  # nothing newly frozen (frozen objects may die)
