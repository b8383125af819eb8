"""The join's deadline: a process that has not joined JAX's multi-process runtime within
--join_timeout_seconds ends in one line saying why (nothing answers at the coordinator's
address, or it answers but not every process came), with EXIT_NOT_JOINED; JAX's own
limit would end it later with a C++ abort. `distributed.join` runs `end_unless_joined`
in a thread beside `jax.distributed.initialize`.
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
from typing import Callable, Optional

EXIT_NOT_JOINED = 5


def end_unless_joined(timeout: int, joined: threading.Event, address: Optional[str],
                      index: Optional[int], count: Optional[int],
                      coordinator: Optional[subprocess.Popen] = None,
                      exit: Callable[[int], None] = os._exit) -> None:
    """After `timeout` s without `joined`: one line, the coordinator's process ended (its
    port free for the next try), EXIT_NOT_JOINED."""
    if joined.wait(timeout):
        return
    address = address or "the auto-detected coordinator"
    index = "?" if index is None else index
    count = "?" if count is None else count
    if _answers(address):
        why = (f"the coordinator at {address} answers, but not all {count} processes joined "
               f"it (one did not start, or was given another --coordinator_address or "
               f"--process_count)")
    else:
        why = (f"nothing answers at {address} (a wrong --coordinator_address, or process 0 "
               f"did not start)")
    os.write(2, (f"error: process {index} of {count} did not join the run within "
                 f"{timeout}s: {why}. Nothing was trained or saved; fix it and start every "
                 f"process again (--join_timeout_seconds waits longer)\n").encode())
    if coordinator is not None:
        coordinator.terminate()
    exit(EXIT_NOT_JOINED)


def _answers(address: str) -> bool:
    """Whether a TCP connection to HOST:PORT opens within 2 s."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False
