"""Python's cycle collector set for a command process: what is imported stays out of its
way, and it runs every 50,000 allocations instead of every 700.

A command imports jax, flax, optax, Orbax (and for a SeqIO task TensorFlow, SeqIO and T5):
about a million objects that live as long as the process. Tracing a model then allocates
millions of short-lived containers, so the collector's default thresholds (700, 10, 10)
start a collection every few hundred of them, and every few hundred collections a full
one that walks the whole heap, imports included. `for_command()` moves what is alive
now into the permanent generation (`gc.freeze`; reference counting still frees it, only
the cycle collector no longer walks it) and raises the first threshold, as long-running
Python services do after their start-up.

Called once, by `command.run_main` (a process's `python -m t5lite.X`), never by a
command's `main(argv)` run in a process that lives on (a test, a notebook): a frozen
object in a cycle is never collected, which a one-shot process does not mind. (The test
processes call it once too, after collecting the tests: tests/conftest.py.)

Measured (docs/performance.md, "Python's cycle collector"): 9% of a test run's CPU was in
the collector; a tiny T5's 2-step command 2% less CPU, a test file tracing many models in
one process 7% less.
"""
from __future__ import annotations

import gc

FIRST_THRESHOLD = 50_000


def for_command() -> None:
    """Freeze what is alive now and raise the first generation's threshold."""
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(FIRST_THRESHOLD, second, third)
