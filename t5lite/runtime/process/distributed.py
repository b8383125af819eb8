"""JAX's multi-process runtime for one command: join it, watch the other processes, leave.

    distributed.join(settings)       # before anything starts JAX's backends
    ... the command runs ...
    distributed.leave(status)        # on every way out, error or not (command.run_main)

**Watching.** `jax.distributed`'s coordination service takes a heartbeat from every
process; one that sends none for `peer_timeout` seconds (killed, stopped, its host gone)
is no longer live. JAX's own answer to that is to abort every process (SIGABRT and a C++
stack, a minute or more later, nothing saying which process). Here the service is
recoverable (`jax_enable_recoverability`), so the others live on to say what happened:
a thread in each process meets the others once a second in the service's liveness
barrier (`get_live_nodes`) and reads the exit statuses that leaving processes record in
the service's key-value store. When a process is missing, or left with a non-zero
status, the thread writes one `error:` line naming it (index and host), the last
committed checkpoint and that rerunning the command resumes from it, and exits with
EXIT_PEER_LOST (4) at once: within about peer_timeout + 2 s of the loss, whatever the
main thread is blocked in (a collective, a save's barrier, an NCCL kernel).

**The service's own process.** JAX runs the service inside process 0, where its loss
would end every other process with JAX's abort before any Python runs. Process 0 starts
it instead as a process of its own (`runtime/process/coordinator.py`, the same service, where
JAX would bind it), so that process 0 is lost like any other.

**Leaving.** A process records its exit status, then shuts its JAX client down, once
(`_shutdown_within`: the main thread and the watcher may both leave; JAX aborts a second
disconnect). Process 0 leaves last (waiting at most peer_timeout + 60 s for the others),
then ends the service; after reporting a loss it does the same once the others have gone.
Not covered: the loss of process 0's whole host, which takes the service with it (the
others then abort with JAX's message, status 134); a scheduler restarts the job all the
same.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Optional, Set

import jax

from t5lite.errors import ConfigError
from t5lite.errors import background_reports
from t5lite.runtime.process import join_deadline

log = logging.getLogger(__name__)

EXIT_PEER_LOST = 4
_KEY = "t5lite"


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """The multi-process flags of train / eval / infer: --multiprocess,
    --coordinator_address, --process_count, --process_index, --peer_timeout_seconds,
    --join_timeout_seconds."""

    coordinator_address: Optional[str] = None
    process_count: Optional[int] = None
    process_index: Optional[int] = None
    multiprocess: bool = False
    peer_timeout_seconds: int = 30
    join_timeout_seconds: int = 300

    def wanted(self) -> bool:
        """An explicit coordinator, --multiprocess, or SLURM with more than one task."""
        return (self.coordinator_address is not None or self.multiprocess
                or int(os.environ.get("SLURM_NTASKS", "1")) > 1)


_monitor: Optional["PeerMonitor"] = None


def join(settings: DistributedSettings) -> None:
    """Start JAX's multi-process runtime when `settings.wanted()`, and watch the others;
    a no-op for a single process."""
    global _monitor
    if not settings.wanted():
        return
    # The CPU backend's cross-process collectives need gloo (harmless on GPU hosts). Do not
    # ask jax.default_backend() here: that starts the backends, and
    # jax.distributed.initialize() must run before they start.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_recoverability", True)  # a lost process: say so, see above
    address, count, index, local_devices = _resolve(settings)
    coordinator = None
    own_service = {}
    if index == 0 and count is not None and count > 1 and address is not None:
        coordinator = _start_coordinator(address, count, settings.peer_timeout_seconds)
        own_service = dict(coordinator_bind_address=f"127.0.0.1:{_spare_port()}")  # unused
    # JAX's own limit is a C++ abort: this process's ends it first, in one line
    joined = threading.Event()
    threading.Thread(target=join_deadline.end_unless_joined, daemon=True, name="t5lite-join",
                     args=(settings.join_timeout_seconds, joined, address, index, count,
                           coordinator)).start()
    jax.distributed.initialize(coordinator_address=address, num_processes=count,
                               process_id=index, local_device_ids=local_devices,
                               heartbeat_timeout_seconds=settings.peer_timeout_seconds,
                               initialization_timeout=settings.join_timeout_seconds + 60,
                               **own_service)
    joined.set()
    log.info("jax.distributed: process %d of %d, %d local / %d global devices",
             jax.process_index(), jax.process_count(), jax.local_device_count(),
             jax.device_count())
    if jax.process_count() > 1:
        from jax._src.distributed import global_state
        _monitor = PeerMonitor(global_state.client, jax.process_index(), jax.process_count(),
                               settings.peer_timeout_seconds, coordinator=coordinator)
        background_reports.drop(_waits_on_a_peer)


def _resolve(settings: DistributedSettings):
    """(coordinator address, process count, process index, local device ids) as
    jax.distributed.initialize() would find them (flags, JAX_COORDINATOR_ADDRESS, then
    the cluster: SLURM, ...), before it starts."""
    from jax._src import clusters
    address = settings.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    count, index, local_devices = settings.process_count, settings.process_index, None
    if os.environ.get("JAX_LOCAL_DEVICE_IDS"):
        local_devices = [int(i) for i in os.environ["JAX_LOCAL_DEVICE_IDS"].split(",")]
    if None in (address, count, index, local_devices):
        address, count, index, local_devices = \
            clusters.ClusterEnv.auto_detect_unset_distributed_params(
                address, count, index, local_devices, None, settings.join_timeout_seconds)
    return address, count, index, local_devices


def _start_coordinator(address: str, count: int, timeout: int) -> subprocess.Popen:
    """The coordination service in a process of its own (runtime/process/coordinator.py), bound
    where JAX would bind it; ConfigError (one line) when it cannot listen there."""
    bind = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS",
                          "[::]:" + address.rsplit(":", 1)[-1])
    proc = subprocess.Popen([sys.executable, "-m", "t5lite.runtime.process.coordinator", bind,
                             str(count), str(timeout)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    said = proc.stdout.readline().strip()
    if said != "ready":
        proc.kill()
        raise ConfigError(f"the coordinator could not listen on {bind} (from "
                          f"--coordinator_address={address}): "
                          f"{said.removeprefix('error: ') or 'it ended at start'}; pick a "
                          f"free port (the coordinator of a run whose process 0 crashed "
                          f"holds its port for --peer_timeout_seconds + 10 s)")
    return proc


def _spare_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watching() -> bool:
    """Whether other processes are being watched (a multi-process run)."""
    return _monitor is not None


def on_loss_say(kept: Callable[[], str]) -> None:
    """What the loss line says was kept and how to go on (the training loop names its
    last committed checkpoint)."""
    if _monitor is not None:
        _monitor.kept = kept


def await_verdict() -> None:
    """After this process's main thread failed in a multi-process run: give the watcher
    the time to find a lost process (it then ends this process itself). A collective
    fails at once when its peer dies, the heartbeats tell only later."""
    if _monitor is not None:
        _monitor.wait_for_round_after(time.monotonic(), _monitor.timeout + 5)


def leave(status: int) -> None:
    """Record this process's exit status for the others, then leave JAX's runtime
    (process 0 last). A no-op for a single process; never raises."""
    global _monitor
    monitor, _monitor = _monitor, None
    if monitor is None:
        return
    monitor.leave(status)
    _shutdown_within(10.0)
    # the watching thread ends with the client (its call into JAX fails): it must not be
    # inside JAX when the interpreter exits, which aborts a thread that comes back then
    monitor.join(5.0)
    if monitor.coordinator is not None:  # everyone has left (or is lost): the service goes
        monitor.coordinator.terminate()


def _say_nothing_more() -> None:
    """stderr to /dev/null once the loss line is out: what the other threads meet in the
    seconds left (a save's barrier cancelled, a collective failed) is that same loss."""
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        pass


def _waits_on_a_peer(exc: Optional[BaseException], text: str) -> bool:
    """A background report of a barrier or collective that failed (Orbax's async save):
    the watcher names its cause, another process; the main thread meets it too."""
    if _monitor is None:
        return False
    return (isinstance(exc, TimeoutError) or "barrier" in text.lower()
            or "task disconnected" in text)


_shutdown_lock = threading.Lock()
_shutdown_thread: Optional[threading.Thread] = None


def _shutdown_within(seconds: float) -> None:
    """jax.distributed.shutdown() once a process (a second call: SIGABRT), given up after
    `seconds` (it talks to the service)."""
    global _shutdown_thread
    with _shutdown_lock:
        if _shutdown_thread is None:
            _shutdown_thread = threading.Thread(target=_quiet_shutdown, daemon=True)
            _shutdown_thread.start()
        done = _shutdown_thread
    done.join(timeout=seconds)


def _quiet_shutdown() -> None:
    try:
        jax.distributed.shutdown()
    except Exception as e:  # noqa: BLE001 - leaving anyway
        log.debug("jax.distributed.shutdown: %s", e)


class PeerMonitor:
    """The watching thread (see the module docstring). `client` is JAX's
    DistributedRuntimeClient; a round every `period` seconds; `coordinator` (process 0)
    the service's own process, ended when everyone has left. `exit` is for tests."""

    def __init__(self, client, process_index: int, process_count: int, timeout: float,
                 exit: Callable[[int], None] = os._exit, period: float = 1.0,
                 coordinator: Optional[subprocess.Popen] = None):
        self.client = client
        self.index = process_index
        self.count = process_count
        self.timeout = timeout
        self.kept: Callable[[], str] = lambda: "run the same command to start again"
        self._exit = exit
        self.period = period
        self.coordinator = coordinator
        self._present: Set[int] = set(range(process_count))  # not known to have left
        self._leaving = False
        self._rounds = threading.Condition()
        self._last_round = time.monotonic()
        try:
            client.key_value_set(f"{_KEY}/host/{process_index}", socket.gethostname())
        except Exception as e:  # noqa: BLE001 - only the loss line's host name is at stake
            log.debug("could not record this host's name: %s", e)
        self._thread = threading.Thread(target=self._watch, name="t5lite-peers", daemon=True)
        self._thread.start()

    # -- the watching thread ---------------------------------------------------------
    def _watch(self) -> None:
        everyone = list(range(self.count))
        while True:
            try:
                live = set(self.client.get_live_nodes(everyone))
                left = self._left_statuses()
            except Exception as e:  # noqa: BLE001 - the service itself is gone
                if self._leaving:
                    return
                self._lost(f"lost contact with the coordination service in process 0 "
                           f"({self._host(0)}): {str(e).splitlines()[0]}")
                return
            with self._rounds:
                self._last_round = time.monotonic()
                self._rounds.notify_all()
            if self._leaving:  # process 0, waiting for the others to leave
                if not live - {self.index}:
                    return
                time.sleep(min(0.2, self.period))
                continue
            self._present -= {p for p, status in left.items() if status == 0}
            gone = [p for p in sorted(self._present - {self.index})
                    if p in left or p not in live]
            if gone:
                p = gone[0]
                why = (f"ended with status {left[p]} (its log says why)" if p in left else
                       f"stopped responding (no heartbeat for {self.timeout:g}s: killed, "
                       f"stopped, or its host lost)")
                self._lost(f"process {p} ({self._host(p)}) {why}")
                return
            time.sleep(self.period)

    def _left_statuses(self) -> Dict[int, int]:
        statuses = {}
        for key, value in self.client.key_value_dir_get(f"{_KEY}/left/"):
            statuses[int(key.rstrip("/").rsplit("/", 1)[-1])] = int(value)
        return statuses

    def _host(self, process: int) -> str:
        try:
            return "host " + self.client.key_value_try_get(f"{_KEY}/host/{process}")
        except Exception:  # noqa: BLE001
            return "host unknown"

    def _lost(self, what: str) -> None:
        """One line, then this process leaves with EXIT_PEER_LOST."""
        try:
            kept = self.kept()
        except Exception as e:  # noqa: BLE001 - the line goes out regardless
            kept = f"what was saved could not be read ({e})"
        line = (f"error: this process ({self.index} of {self.count}, "
                f"{socket.gethostname()}) stops because {what}. {kept}\n")
        try:
            os.write(2, line.encode())
        except OSError:
            pass
        _say_nothing_more()  # the other threads' failures are this loss's echoes
        self._record(EXIT_PEER_LOST)
        if self.coordinator is not None:  # the service goes once the others have seen it
            self._wait_until_alone(self.timeout + 5)
        _shutdown_within(5.0)
        if self.coordinator is not None:
            self.coordinator.terminate()  # its port is free for the rerun at once
        self._exit(EXIT_PEER_LOST)

    def _wait_until_alone(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if not set(self.client.get_live_nodes(list(range(self.count)))) - {self.index}:
                    return
            except Exception:  # noqa: BLE001
                return
            time.sleep(min(0.2, self.period))

    def _record(self, status: int) -> None:
        try:
            self.client.key_value_set(f"{_KEY}/left/{self.index}", str(status),
                                      allow_overwrite=True)
        except Exception as e:  # noqa: BLE001 - the others then see a lost heartbeat
            log.debug("could not record this process's exit status: %s", e)

    # -- the main thread's side -------------------------------------------------------
    def wait_for_round_after(self, since: float, seconds: float) -> None:
        """Wait (at most `seconds`) for the first watching round that ends after `since`
        and after every process had the time to be declared lost."""
        deadline = time.monotonic() + seconds
        with self._rounds:
            while time.monotonic() < deadline and \
                    self._last_round < since + self.timeout + 1:
                self._rounds.wait(timeout=max(0.0, deadline - time.monotonic()))

    def join(self, seconds: float) -> None:
        """Wait (at most `seconds`) for the watching thread to end."""
        self._thread.join(timeout=seconds)

    def leave(self, status: int, grace: float = 60.0) -> None:
        """Record `status`; process 0 then waits (at most timeout + `grace` s) until every
        other process has left or is lost (a lost one is no longer live after timeout)."""
        self._leaving = True
        self._record(status)
        if self.index != 0:
            return
        deadline = time.monotonic() + self.timeout + grace
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
