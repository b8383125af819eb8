"""Two real processes (jax.distributed on 127.0.0.1, gloo) where one goes wrong: killed
(process 1, or process 0, whose host runs the coordination service), stopped, or hung
in its step; and a process that cannot join. Each survivor ends within
its bound with one `error:` line and its own status (no traceback, no C++ abort), the
checkpoint before the fault is kept, and the same command then resumes and finishes with
the parameters of an uninterrupted run (bit-equal: the same two processes)."""
import re
import signal
import socket
import time

import pytest

import train_helpers as th
from t5lite.runtime.process.distributed import EXIT_PEER_LOST
from t5lite.runtime.process.join_deadline import EXIT_NOT_JOINED
from t5lite.runtime.process.watchdog import EXIT_HUNG

STEPS = 8
PEER_TIMEOUT = 5
# Every run in this file trains one program (one model, batch, feature lengths and mesh),
# so that the uninterrupted run's compilations serve the others' process 0 from the
# compilation cache (process 1 compiles its own: on the CPU its cache keys differ from
# process 0's, and only process 0 writes). The model is the tiny T5 cut to one layer each
# side and a 512-entry vocabulary, not 32128 (the evaluation test's MNLI vocabulary needs
# no more): what goes wrong here is a process's, not the model's, and every compilation,
# step and checkpoint is then a fraction of the cost.
RUN = ("--gin.CHECKPOINT_PERIOD=4", "--gin.LOG_PERIOD=1", "--gin.ICI_MESH_SHAPE=[1,1,1]",
       "--gin.DCN_MESH_SHAPE=[2,1,1]", "--gin.T5Config.vocab_size=512",
       "--gin.T5Config.num_encoder_layers=1", "--gin.T5Config.num_decoder_layers=1",
       f"--peer_timeout_seconds={PEER_TIMEOUT}")
# the victim sleeps after dispatching step 6 (checkpoint 4 is committed by then)
HUNG = ("--gin.INJECT_STALL='1:6:600'", "--gin.WATCHDOG_FLOOR_SECONDS=3",
        "--gin.WATCHDOG_WARMUP_STEPS=1")


def _held(victim):
    """The victim held still at step 6 for a signal from outside."""
    return (f"--gin.INJECT_STALL='{victim}:6:600'", "--gin.STEP_WATCHDOG=False")
NOISE = ("Traceback", "Check failure", "F1", "Gloo all-reduce failed", "SIGABRT")


def _start_pair(model_dir, logs, *extra):
    port = th.free_port()
    return [th.start(th.train_command(model_dir, *RUN, *extra,
                                       f"--coordinator_address=127.0.0.1:{port}",
                                       "--process_count=2", f"--process_index={i}",
                                       steps=STEPS), logs / f"p{i}.log")
            for i in range(2)]


def _run_pair(model_dir, logs, *extra):
    logs.mkdir(parents=True, exist_ok=True)
    procs = _start_pair(model_dir, logs, *extra)
    try:
        rcs = [th.finish(p) for p in procs]
    finally:
        for p in procs:
            th.kill(p)
    assert rcs == [0, 0], "\n".join(th.tail(th.read_log(logs / f"p{i}.log")) for i in range(2))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    _run_pair(root / "run", root / "logs")
    return th.load_state(root / "run", STEPS)["params"]


def _the_line(log):
    lines = th.error_lines(log)
    assert len(lines) == 1, log
    assert not any(noise in log for noise in NOISE), log
    return lines[0]


# Each case a different way to go: a killed process's connections close at once (its
# peer's Gloo collective fails, and no Gloo error may reach the line), a stopped one's
# stay open (its peer waits in the collective until the heartbeats tell), a hung one is
# its own watchdog's to end; and process 0 (the coordination service's starter, the run
# lock's holder, the last to leave) is lost differently from any other process.
@pytest.mark.parametrize("fault,victim", [("SIGKILL", 1), ("SIGSTOP", 1), ("hung", 1),
                                          ("SIGKILL", 0), ("SIGSTOP", 0)])  # 0: the coordinator's host
def test_a_lost_process_ends_the_other_in_one_line_and_the_run_resumes(fault, victim, tmp_path,
                                                                       uninterrupted):
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    survivor = 1 - victim
    procs = _start_pair(model_dir, logs, *(HUNG if fault == "hung" else _held(victim)))
    try:
        th.wait_for(lambda: "INJECT_STALL" in th.read_log(logs / f"p{victim}.log"),
                    "the stall", proc=procs[victim], log_path=logs / f"p{victim}.log")
        t = time.monotonic()
        if fault != "hung":
            procs[victim].send_signal(getattr(signal, fault))
        rc0 = th.finish(procs[survivor], timeout=120)
        took = time.monotonic() - t
        rc1 = th.finish(procs[victim], timeout=30) if fault == "hung" else None
    finally:
        for p in procs:
            th.kill(p)
    p0, p1 = (th.read_log(logs / f"p{i}.log") for i in (survivor, victim))
    line = _the_line(p0)
    if fault == "hung":
        # no step completes on either process: whichever watchdog fires first ends its
        # process (status 3, its stacks on disk); the other learns it from the status
        # left behind (status 4), unless its own watchdog fires as well
        assert EXIT_HUNG in (rc0, rc1) and {rc0, rc1} <= {EXIT_HUNG, EXIT_PEER_LOST}, (p0, p1)
        for i, (rc, log) in enumerate(((rc0, p0), (rc1, p1))):
            mine = _the_line(log)
            if rc == EXIT_HUNG:
                assert f"error: process {i} on " in mine and "is hung" in mine, mine
                assert list(model_dir.glob(f"hang-*-{i}.txt"))
            else:
                assert f"because process {1 - i} (host " in mine, mine
                assert "ended with status 3" in mine, mine
        bound = 3 + 20  # the floor, then a round, a leave, and the startups' skew
    else:
        assert rc0 == EXIT_PEER_LOST, p0
        assert re.search(rf"because process {victim} \(host .+\) stopped responding \(no "
                         r"heartbeat for 5s", line), line
        bound = PEER_TIMEOUT + 10
    assert took < bound, (took, line)
    if rc0 == EXIT_PEER_LOST:
        assert line.startswith(f"error: this process ({survivor} of 2, "), line
        assert line.endswith(f"The last committed checkpoint is step 4 in {model_dir}: run the "
                             f"same command (every process) to resume from it"), line
    assert th.complete_steps(model_dir) == [4]
    if (fault, victim) != ("SIGKILL", 0):
        return
    # The resume, once, where it has the most to mend: a fault leaves committed step 4 and,
    # unless process 0 ended through its main thread's own error path, the run lock of a
    # process that is gone (a watcher that sees a peer lost ends its process at once),
    # which the resume takes over. Killed process 0 always leaves it (a kill of process 1
    # may not: process 0's failed collective can release it first); a resume that finds
    # no lock is any other multi-process run's resume.
    _run_pair(model_dir, tmp_path / "resumed")
    resumed = th.read_log(tmp_path / "resumed" / "p0.log")
    assert "taking over the lock of a run that is no longer running" in resumed, resumed
    assert "start: resume:4 at step 4" in resumed, resumed
    assert th.complete_steps(model_dir) == [4, 8]
    th.assert_trees_equal(th.load_state(model_dir, STEPS)["params"], uninterrupted, "params")


def test_a_peer_stopped_during_an_async_save_ends_the_other_in_one_line(tmp_path):
    """Process 1 stopped while the save of step 4 is in flight (async saves): process 0's
    Orbax save then waits in a barrier for it, which its shutdown cancels; that thread's
    traceback used to follow the one line. Now the line is the last thing said."""
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    procs = _start_pair(model_dir, logs, "--gin.CheckpointSettings.async_save=True",
                        "--gin.STEP_WATCHDOG=False")
    try:
        th.wait_for(lambda: "step 4/" in th.read_log(logs / "p0.log"), "step 4",
                    proc=procs[0], log_path=logs / "p0.log", poll=0.005)
        time.sleep(0.1)  # into the save: its barrier waits for process 1
        procs[1].send_signal(signal.SIGSTOP)
        rc0 = th.finish(procs[0], timeout=120)
    finally:
        for p in procs:
            th.kill(p)
    log = th.read_log(logs / "p0.log")
    line = _the_line(log)
    assert rc0 == EXIT_PEER_LOST, log
    assert log.rstrip().endswith(line), log
    assert re.search(r"because process 1 \(host .+\) stopped responding", line), line
    committed = th.complete_steps(model_dir)
    assert committed in ([], [4]), committed
    assert line.endswith(f"The last committed checkpoint is step 4 in {model_dir}: run the same "
                         f"command (every process) to resume from it" if committed else
                         f"No checkpoint was committed in {model_dir}: running the same "
                         f"command (every process) starts the run again"), line


def _stop_1_once(procs, logs, watched: int, needle: str):
    """SIGSTOP process 1 as soon as process `watched`'s log shows `needle`; then (process
    0's status, the seconds it took to end, its log)."""
    try:
        log_path = logs / f"p{watched}.log"
        th.wait_for(lambda: needle in th.read_log(log_path), needle, proc=procs[watched],
                    log_path=log_path, poll=0.005)
        procs[1].send_signal(signal.SIGSTOP)
        t = time.monotonic()
        rc0 = th.finish(procs[0], timeout=120)
        took = time.monotonic() - t
    finally:
        for p in procs:
            th.kill(p)
    return rc0, took, th.read_log(logs / "p0.log")


def test_a_peer_stopped_before_the_first_step_ends_the_other_in_one_line(tmp_path):
    """Process 1 stopped as soon as both have joined, while they compile: process 0 waits
    for it in the first computation they share, and its watcher ends it in one line that
    says nothing was committed yet."""
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    procs = _start_pair(model_dir, logs, "--gin.STEP_WATCHDOG=False")
    rc0, took, log = _stop_1_once(procs, logs, 1, "jax.distributed: process 1 of 2")
    line = _the_line(log)
    assert rc0 == EXIT_PEER_LOST and log.rstrip().endswith(line), log
    assert re.search(r"because process 1 \(host .+\) stopped responding", line), line
    assert line.endswith(f"No checkpoint was committed in {model_dir}: running the same "
                         f"command (every process) starts the run again"), line
    assert not th.logged_steps(log) and not th.complete_steps(model_dir)
    assert took < PEER_TIMEOUT + 20, took


def test_a_peer_stopped_during_an_evaluation_ends_the_other_in_one_line(tmp_path,
                                                                       tmp_path_factory):
    """Training on MNLI with EVAL_PERIOD=6: process 1 stopped as soon as process 0 has logged
    step 6, as their inference evaluation starts (it compiles the decoding first); process
    0's evaluation (decoding shares the mesh of both) then waits for it, and its watcher
    ends it in one line naming checkpoint 4."""
    from t5lite.data.files import demo_corpus
    from data_helpers import vocabulary
    mnli = tmp_path / "multinli"
    demo_corpus.write_multinli(str(mnli), train=16, dev=11)
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    procs = _start_pair(model_dir, logs, "--gin.STEP_WATCHDOG=False",
                        "--gin.MIXTURE_OR_TASK_NAME='mnli'", "--gin.EVAL_PERIOD=6",
                        "--gin.EVAL_SPLIT='validation_matched'",
                        f'--gin.VOCABULARY_PATH="{vocabulary(tmp_path_factory)}"',
                        f'--gin.MNLI_DIR="{mnli}"')
    rc0, took, log = _stop_1_once(procs, logs, 0, "step 6/")
    line = _the_line(log)
    assert rc0 == EXIT_PEER_LOST and log.rstrip().endswith(line), log
    assert re.search(r"because process 1 \(host .+\) stopped responding \(no "
                     r"heartbeat for 5s", line), line
    assert line.startswith("error: this process (0 of 2, "), line
    assert line.endswith(f"The last committed checkpoint is step 4 in {model_dir}: run the same "
                         f"command (every process) to resume from it"), line
    assert max(th.logged_steps(log)) == 6 and th.complete_steps(model_dir) == [4], log
    assert "mnli validation_matched: accuracy" not in log, log  # ended inside the evaluation
    assert took < PEER_TIMEOUT + 20, took


@pytest.mark.parametrize("index,needle", [
    (1, "nothing answers at 127.0.0.1:"),  # a wrong address: no coordinator there
    (0, "answers, but not all 2 processes joined"),  # the peer never starts
])
def test_a_process_that_cannot_join_ends_in_one_line(index, needle, tmp_path):
    port = th.free_port()
    t = time.monotonic()
    proc = th.run_train(tmp_path / "run", f"--coordinator_address=127.0.0.1:{port}",
                        "--process_count=2", f"--process_index={index}",
                        "--join_timeout_seconds=3", steps=2)
    took = time.monotonic() - t
    line = th.assert_one_error(proc, f"process {index} of 2 did not join the run within 3s",
                               needle)
    assert proc.returncode == EXIT_NOT_JOINED, th.describe(proc)
    assert not any(noise in proc.stderr for noise in NOISE), proc.stderr
    assert took < 60, took
    assert "Nothing was trained or saved" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_coordinator_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = th.run_train(tmp_path / "run", f"--coordinator_address=127.0.0.1:{port}",
                            "--process_count=2", "--process_index=0", steps=2)
    th.assert_one_error(proc, f"the coordinator could not listen on [::]:{port}",
                        "pick a free port")
    assert proc.returncode == 2, th.describe(proc)
