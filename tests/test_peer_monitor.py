"""runtime/process/distributed.py's watcher against a stand-in for JAX's coordination client: who
is reported lost and when, what a leaving process records, how long process 0 waits,
and the line a process that cannot join writes. The real thing (two processes, a
killed, a stopped and a hung one) is tests/test_multiprocess_faults.py."""
import socket
import threading
import time

import pytest

from t5lite.runtime.process import distributed, join_deadline
from t5lite.runtime.process.distributed import EXIT_PEER_LOST, PeerMonitor
from t5lite.runtime.process.join_deadline import EXIT_NOT_JOINED


class FakeClient:
    """The calls PeerMonitor makes on JAX's DistributedRuntimeClient."""

    def __init__(self, live, hosts=None):
        self.live = set(live)
        self.kv = {f"t5lite/host/{p}": h for p, h in (hosts or {}).items()}
        self.error = None
        self.rounds = 0

    def key_value_set(self, key, value, allow_overwrite=False):
        self.kv[key] = value

    def key_value_try_get(self, key):
        if key not in self.kv:
            raise RuntimeError(f"NOT_FOUND: {key}")
        return self.kv[key]

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]

    def get_live_nodes(self, processes):
        self.rounds += 1
        if self.error is not None:
            raise self.error
        return {p: 7 for p in processes if p in self.live}


class Exits:
    def __init__(self):
        self.statuses = []
        self.done = threading.Event()

    def __call__(self, status):
        self.statuses.append(status)
        self.done.set()


def _monitor(client, index=0, count=2, timeout=5, period=0.02):
    exits = Exits()
    monitor = PeerMonitor(client, index, count, timeout, exit=exits, period=period)
    monitor.kept = lambda: "The last committed checkpoint is step 40"
    return monitor, exits


def _stderr_line(capfd):
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_everyone_live_is_no_loss():
    client = FakeClient({0, 1, 2}, {0: "a", 1: "b", 2: "c"})
    monitor, exits = _monitor(client, count=3)
    time.sleep(0.3)
    assert exits.statuses == [] and client.rounds >= 5
    client.live = {0}
    monitor.leave(0)


def test_a_process_that_stops_answering_is_named_with_its_host(capfd):
    client = FakeClient({0, 1, 2}, {0: "node-a", 1: "node-b", 2: "node-c"})
    monitor, exits = _monitor(client, count=3)
    time.sleep(0.1)
    client.live.discard(2)
    assert exits.done.wait(5)
    assert exits.statuses == [EXIT_PEER_LOST]
    line = _stderr_line(capfd)
    assert "this process (0 of 3" in line
    assert "process 2 (host node-c) stopped responding (no heartbeat for 5s" in line
    assert line.endswith("The last committed checkpoint is step 40")
    assert client.kv["t5lite/left/0"] == str(EXIT_PEER_LOST)  # the others learn it


def test_a_process_that_left_with_an_error_is_named_with_its_status(capfd):
    client = FakeClient({0, 1}, {1: "node-b"})
    monitor, exits = _monitor(client)
    client.kv["t5lite/left/1"] = "3"  # hung: it still answers while it leaves
    assert exits.done.wait(5)
    assert "process 1 (host node-b) ended with status 3 (its log says why)" in _stderr_line(capfd)


def test_a_process_that_finished_may_leave_first():
    client = FakeClient({0, 1})
    monitor, exits = _monitor(client)
    client.kv["t5lite/left/1"] = "0"
    client.live.discard(1)
    time.sleep(0.3)
    assert exits.statuses == []
    monitor.leave(0)


def test_losing_the_coordination_service_is_one_line(capfd):
    client = FakeClient({0, 1})
    monitor, exits = _monitor(client, index=1)
    client.error = RuntimeError("UNAVAILABLE: Socket closed\nmore detail")
    assert exits.done.wait(5)
    line = _stderr_line(capfd)
    assert "lost contact with the coordination service in process 0" in line
    assert "UNAVAILABLE: Socket closed" in line and "more detail" not in line


def test_a_host_that_was_never_recorded_still_gives_the_line(capfd):
    client = FakeClient({0})
    monitor, exits = _monitor(client)
    assert exits.done.wait(5)
    assert "process 1 (host unknown) stopped responding" in _stderr_line(capfd)


def test_leaving_records_the_status_and_reports_nothing_more():
    client = FakeClient({0, 1})
    monitor, exits = _monitor(client, index=1)
    monitor.leave(2)
    assert client.kv["t5lite/left/1"] == "2"
    client.live.discard(0)
    time.sleep(0.2)
    assert exits.statuses == []


def test_process_0_leaves_once_the_others_are_gone():
    client = FakeClient({0, 1, 2})
    monitor, _ = _monitor(client, count=3)
    threading.Timer(0.3, lambda: client.live.difference_update({1, 2})).start()
    t = time.monotonic()
    monitor.leave(0)
    assert 0.25 < time.monotonic() - t < 3


def test_process_0_leaves_after_its_bound_when_another_stays():
    client = FakeClient({0, 1})
    monitor, _ = _monitor(client, timeout=1)
    t = time.monotonic()
    monitor.leave(0, grace=2)
    assert 2.5 < time.monotonic() - t < 6  # timeout + grace


def test_await_verdict_waits_for_a_round_after_the_heartbeats_tell(monkeypatch):
    client = FakeClient({0, 1})
    monitor, _ = _monitor(client, timeout=1)
    monkeypatch.setattr(distributed, "_monitor", monitor)
    t = time.monotonic()
    distributed.await_verdict()
    assert 1.0 < time.monotonic() - t < 4
    client.live = {0}
    monitor.leave(0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_process_that_cannot_join_ends_in_one_line(capfd):
    exits, coordinator = Exits(), FakeCoordinator()
    join_deadline.end_unless_joined(1, threading.Event(), "127.0.0.1:%d" % _free_port(), 2, 4,
                                   coordinator, exit=exits)
    assert exits.statuses == [EXIT_NOT_JOINED] and coordinator.terminated
    line = _stderr_line(capfd)
    assert line.startswith("error: process 2 of 4 did not join the run within 1s: nothing "
                           "answers at 127.0.0.1:")
    assert "--join_timeout_seconds" in line


def test_a_coordinator_that_answers_is_told_apart(capfd):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = "127.0.0.1:%d" % server.getsockname()[1]
        exits = Exits()
        join_deadline.end_unless_joined(1, threading.Event(), address, 0, 2, exit=exits)
    assert exits.statuses == [EXIT_NOT_JOINED]
    assert f"the coordinator at {address} answers, but not all 2 processes joined" in \
        _stderr_line(capfd)


def test_joining_in_time_ends_nothing():
    joined, exits = threading.Event(), Exits()
    joined.set()
    join_deadline.end_unless_joined(30, joined, "127.0.0.1:1", 1, 2, exit=exits)
    assert exits.statuses == []


@pytest.mark.parametrize("flag", ["--peer_timeout_seconds=0", "--join_timeout_seconds=-1"])
def test_timeouts_below_one_second_are_one_line(flag):
    import train_helpers as th
    proc = th.run_train(None, flag, steps=1)
    assert proc.returncode == 2
    th.assert_one_error(proc, flag.split("=")[0], "at least 1")


class FakeCoordinator:
    def __init__(self):
        self.terminated = False

    def terminate(self):
        self.terminated = True


def test_process_0_ends_the_coordinator_once_the_others_have_gone(capfd):
    """After a loss, process 0 ends the service's process (its port free for the rerun),
    but only once no other process is live: the other survivors still read from it."""
    client = FakeClient({0, 1, 2})
    coordinator = FakeCoordinator()
    exits = Exits()
    PeerMonitor(client, 0, 3, 5, exit=exits, period=0.02, coordinator=coordinator)
    client.live.discard(2)  # lost; process 1 still reading, then leaving
    time.sleep(0.3)
    assert not coordinator.terminated and exits.statuses == []
    client.live.discard(1)
    assert exits.done.wait(5)
    assert coordinator.terminated and exits.statuses == [EXIT_PEER_LOST]
    assert "process 2 (host unknown) stopped responding" in _stderr_line(capfd)
