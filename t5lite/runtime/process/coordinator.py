"""JAX's coordination service in a process of its own, beside training process 0.

    python -m t5lite.runtime.process.coordinator BIND_ADDRESS PROCESS_COUNT PEER_TIMEOUT

`jax.distributed.initialize()` runs the service inside process 0, so the loss of process
0 would end every other process with JAX's C++ abort before any of them could say
what happened. Started here instead (by `distributed.join` in process 0, in a session of
its own, so that a signal to process 0 does not reach it), the service outlives process 0:
the other processes then see process 0 stop responding, like any other, and end with
the one line of `distributed.py`. It is the same service JAX starts (recoverable, the
same heartbeat timeout); process 0's own copy listens on a spare port, unused.

It prints `ready` once it listens (or one `error:` line and exits 1). It ends when
process 0 ends it (after the others left), or `PEER_TIMEOUT + 10` s after process 0
is gone, once the others have had the time to notice (a round after the heartbeats
lapse).
"""
from __future__ import annotations

import os
import signal
import sys
import time


def main(argv) -> int:
    bind, count, timeout = argv[0], int(argv[1]), int(argv[2])
    parent = os.getppid()
    try:
        from jax._src.lib import _jax
        service = _jax.get_distributed_runtime_service(
            bind, count, heartbeat_timeout=timeout, shutdown_timeout=300, recoverable=True)
    except Exception as e:  # noqa: BLE001 - one line to process 0, which reports it
        print(f"error: {str(e).splitlines()[0]}", flush=True)
        return 1
    ended = []
    signal.signal(signal.SIGTERM, lambda *_: ended.append(True))
    print("ready", flush=True)
    while not ended and os.getppid() == parent:
        time.sleep(0.5)
    if not ended:  # process 0 is gone: give the others the time to see it
        deadline = time.monotonic() + timeout + 10
        while not ended and time.monotonic() < deadline:
            time.sleep(0.5)
    service.shutdown()
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
