"""Stop signals turned into a save and a clean exit, agreed on by every process of a run.

    preempt = Preemption()          # from the start of a run (several processes) or its loop
    stopping = preempt.after_step() # once after every step: the signal's name, or None
    preempt.restore()               # the earlier handlers back
"""
from __future__ import annotations

import logging
import os
import signal
from typing import Optional

import jax

log = logging.getLogger(__name__)


class Preemption:
    """Turns SIGTERM, SIGHUP (the terminal or ssh session closed) and the first Ctrl-C
    (SIGINT) into a stop the loop checks after each step: it saves the step and exits
    cleanly. A second Ctrl-C stops the process at once, without saving (a save in flight
    is never counted as a checkpoint: Orbax commits a step by renaming it into place).
    None prints a traceback. A signal the process was started ignoring (`nohup` ignores
    SIGHUP) stays ignored.

    With several processes a signal may reach only some of them (one node's preemption
    notice, Ctrl-C in one terminal), and a process that stopped alone would leave the
    others waiting in its collectives forever. So there the stop goes through JAX's
    preemption service: its notifier catches SIGTERM (this class leaves SIGTERM to it),
    SIGHUP and Ctrl-C are passed on to it as a SIGTERM to this process, and every
    process learns of the notice and agrees on one step to stop after (the fastest
    process's next). That agreement runs on JAX's background thread: a step asks only
    whether it is the agreed one, and waits just while the agreement is being made."""

    NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C", signal.SIGHUP: "SIGHUP"}
    ANOTHER = "a stop signal (SIGTERM, SIGHUP or Ctrl-C) to one of the processes"

    def __init__(self):
        self.requested: Optional[str] = None  # the signal's name, once one arrived here
        self.coordinated = jax.process_count() > 1 and self._preemption_service()
        # JAX's step counter: steps since this loop started, the same on every process (a
        # notice that came before the first step stops them all after it)
        self._steps = 0
        self._previous = {}
        for sig in self.NAMES:
            if sig == signal.SIGTERM and self.coordinated:
                continue  # JAX's notifier holds SIGTERM
            if signal.getsignal(sig) is not signal.SIG_IGN:
                self._previous[sig] = signal.signal(sig, self._handle)

    @staticmethod
    def _preemption_service() -> bool:
        from jax.experimental import multihost_utils
        try:
            multihost_utils.reached_preemption_sync_point(0)
            return True
        except RuntimeError:  # jax_enable_preemption_service=False
            log.warning("JAX's preemption service is off (jax_enable_preemption_service): "
                        "a stop signal must reach every process of this run at once")
            return False

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.requested == "Ctrl-C":
            _say("error: Ctrl-C again: stopped at once, without saving this step; the "
                 "checkpoints saved before it are kept")
            os._exit(130)
        if self.requested is None:
            self.requested = self.NAMES[signum]
            if signum == signal.SIGINT:
                _say("Ctrl-C: saving this step, then exiting (Ctrl-C again stops at once, "
                     "without saving)")
            if self.coordinated:
                os.kill(os.getpid(), signal.SIGTERM)  # to JAX's notifier: every process stops

    def after_step(self) -> Optional[str]:
        """Called once after every step: what asks to stop after this one, else None."""
        if not self.coordinated:
            return self.requested
        from jax.experimental import multihost_utils
        self._steps += 1
        if multihost_utils.reached_preemption_sync_point(self._steps):
            return self.requested or self.ANOTHER
        return None

    def restore(self):
        """Give the handled signals back to their earlier handlers (once)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}


def _say(line: str) -> None:
    """One line on stderr from a signal handler (no logging lock, no buffering)."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass
