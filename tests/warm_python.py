"""A Python that has imported t5lite's dependencies once and forks a child per command.

The tests start about 240 Python processes (`python -m t5lite.train ...`, `python -c
...`), each paying for the same imports before it does anything: jax, flax, optax and
orbax for every command (about 2.3 CPU s), TensorFlow, SeqIO and T5 for one on a SeqIO
task (about 5 s more). On the 2-core machines the suite runs on, that start-up was a
sixth of its CPU. A warm interpreter (one per environment, started by the second command
run in it) does those imports once and answers each later command with a fork:

    proc = warm_python.run(cmd, env=..., cwd=..., timeout=60)     # or None: run it yourself
    proc = warm_python.popen(cmd, env=..., cwd=..., stdout=log)   # a Popen-like handle

The child is the command as `python -m` / `python -c` runs it: its own process id (signals
reach it), its argv, working directory and environment as asked, stdin from /dev/null,
stdout and stderr where asked, `__main__` a fresh module, Ctrl-C / SIGHUP / SIGTERM at a
new interpreter's dispositions, numpy's global generator reseeded, and the interpreter's
own exit (atexit handlers, non-daemon threads joined, the exit status, a traceback for an
uncaught exception). What differs from a fresh process: the modules imported in advance
are already in `sys.modules` (a test of what a command imports runs a real process:
train_helpers.imports_after), and the environment variables that a module reads as it
is imported are the warm interpreter's, which is why the environment is its key: one warm
interpreter per environment, apart from the variables named in RUN_TIME_ONLY, which
nothing reads before a command runs.

Forking after these imports is safe: they leave three threads besides the main one
(OpenBLAS's for numpy and for scipy, Arrow's jemalloc background thread), and each
re-creates itself or stops across a fork (pthread_atfork). No jax backend exists in the
warm interpreter (checked before it serves), so each child builds its own, with its
XLA_FLAGS. `T5LITE_TESTS_COLD=1` turns the whole mechanism off (every command a fresh
process), for comparing the two.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Mapping, Optional, Sequence

# Imported in the warm interpreter before it forks (a command's own module never is: it
# runs as __main__). t5lite.config.registry brings the model library, the runtime and
# inference; t5lite.data.tasks TensorFlow, SeqIO and T5's preprocessors.
PRELOAD = ("numpy", "jax", "jax.numpy", "flax.linen", "optax", "orbax.checkpoint",
           "t5lite.config.command", "t5lite.config.registry", "t5lite.data.tasks")

# Read by t5lite when a command runs, never at import: commands differing only in them
# share a warm interpreter (the tests point each run at its own data this way; pytest
# names the running test in PYTEST_CURRENT_TEST).
RUN_TIME_ONLY = ("T5LITE_", "TFDS_DATA_DIR", "PYTEST_")

MAX_WARM = 3            # warm interpreters kept per test process: 1, 2 and 8 devices
POLL_S = 0.02           # how often the warm interpreter looks for children that ended
START_TIMEOUT_S = 300

# CPU seconds of the children that ended, as their warm interpreter reported them, less
# those already counted by getrusage(RUSAGE_CHILDREN) once that interpreter was reaped:
# tests/cpu_profile.py adds it to a test's subprocess CPU. `started`: children forked.
STATS = {"cpu": 0.0, "started": 0}


def cold() -> bool:
    return os.environ.get("T5LITE_TESTS_COLD", "") not in ("", "0")


def _command(cmd: Sequence[str]):
    """(mode, target, args) for `python -m t5lite.X ...` / `python -c CODE ...`, else None."""
    cmd = [str(c) for c in cmd]
    if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] not in ("-m", "-c"):
        return None
    if cmd[1] == "-m" and not cmd[2].startswith("t5lite."):
        return None
    return cmd[1], cmd[2], cmd[3:]


def _key(env: Mapping[str, str], run_time_only: Sequence[str] = ()):
    """What separates warm interpreters: `env` less RUN_TIME_ONLY and the caller's own
    `run_time_only` names (`NAME*`: a prefix)."""
    names = {n for n in run_time_only if not n.endswith("*")}
    prefixes = RUN_TIME_ONLY + tuple(n[:-1] for n in run_time_only if n.endswith("*"))
    return tuple(sorted((k, v) for k, v in env.items()
                        if not k.startswith(prefixes) and k not in names))



# ----------------------------------------------------------------------------- client


class WarmProcess:
    """The parts of subprocess.Popen the tests use, for a child of a warm interpreter."""

    def __init__(self, args: List[str], pid: int, status: socket.socket, warm: "_Warm"):
        self.args, self.pid, self.returncode = args, pid, None
        self._status, self._warm = status, warm

    def _take(self, timeout: Optional[float]) -> bool:
        if self.returncode is not None:
            return True
        if not select.select([self._status], [], [], timeout)[0]:
            return False
        data = b""
        while chunk := self._status.recv(4096):  # the report, then the end of the stream
            data += chunk
        self._status.close()
        if not data:  # the warm interpreter died before reporting: nothing to wait for
            self.returncode = -9
            return True
        report = json.loads(data)
        self.returncode = report["returncode"]
        STATS["cpu"] += report["cpu"]
        self._warm.children_cpu += report["cpu"]
        return True

    def poll(self) -> Optional[int]:
        self._take(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._take(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


class _Warm:
    """One warm interpreter: its process and the socket that asks it for children."""

    def __init__(self, env: Mapping[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1], "
             "run_name='__warm__')", os.path.abspath(__file__), str(theirs.fileno())],
            env=dict(env), cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=self.log, pass_fds=[theirs.fileno()])
        theirs.close()
        self.sock, self.lock, self.children_cpu = ours, threading.Lock(), 0.0
        if not select.select([ours], [], [], START_TIMEOUT_S)[0] or ours.recv(64) != b"ready":
            self.close()
            self.log.seek(0)
            raise RuntimeError("the warm interpreter did not start:\n"
                               + self.log.read().decode(errors="replace")[-3000:])

    def fork(self, mode: str, target: str, args: List[str], env: Mapping[str, str],
             cwd: str, stdout: int, stderr: int) -> WarmProcess:
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request = json.dumps({"mode": mode, "target": target, "args": args,
                              "env": dict(env), "cwd": cwd}).encode()
        with open(os.devnull, "rb") as stdin, self.lock:
            socket.send_fds(self.sock, [request], [stdin.fileno(), stdout, stderr,
                                                   its.fileno()])
            its.close()
            pid = int(self.sock.recv(64))
        STATS["started"] += 1
        return WarmProcess([sys.executable, mode, target, *args], pid, mine, self)

    def close(self) -> None:
        """Ask it to end once its children have; wait for that (its CPU then counts in
        RUSAGE_CHILDREN, its children's included: taken back out of STATS)."""
        self.sock.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        STATS["cpu"] -= self.children_cpu
        self.children_cpu = 0.0


_WARM: "collections.OrderedDict[tuple, _Warm]" = collections.OrderedDict()
_WARM_LOCK = threading.Lock()


_USES: "collections.Counter[tuple]" = collections.Counter()


def _warm(env: Mapping[str, str], run_time_only: Sequence[str] = ()) -> Optional[_Warm]:
    """The warm interpreter for `env`, started at the second command that asks for it (a
    test's own environment, used once, costs no start-up of one)."""
    key = _key(env, run_time_only)
    with _WARM_LOCK:
        if key in _WARM:
            _WARM.move_to_end(key)
            return _WARM[key]
        _USES[key] += 1
        if _USES[key] < 2:
            return None
        while len(_WARM) >= MAX_WARM:
            _WARM.popitem(last=False)[1].close()
        _WARM[key] = warm = _Warm(env)
        return warm


@atexit.register
def _close_all() -> None:
    while _WARM:
        _WARM.popitem()[1].close()


def popen(cmd: Sequence[str], env: Mapping[str, str], cwd: str, stdout: int,
          stderr: int, run_time_only: Sequence[str] = ()) -> Optional[WarmProcess]:
    """`cmd` started as a child of the warm interpreter for `env` (stdout / stderr: file
    descriptors), or None: not a Python command this can run, the first command in its
    environment, or T5LITE_TESTS_COLD. `run_time_only`: more names as RUN_TIME_ONLY's
    for this command (`NAME*`: a prefix)."""
    parsed = None if cold() else _command(cmd)
    warm = None if parsed is None else _warm(env, run_time_only)
    if warm is None:
        return None
    return warm.fork(*parsed, env=env, cwd=str(cwd), stdout=stdout, stderr=stderr)


def run(cmd: Sequence[str], env: Mapping[str, str], cwd: str, timeout: float
        ) -> Optional[subprocess.CompletedProcess]:
    """subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
    timeout=timeout) through a warm interpreter, or None as `popen`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen(cmd, env, cwd, out.fileno(), err.fileno())
        if proc is None:
            return None
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise subprocess.TimeoutExpired(list(cmd), timeout, _text(out), _text(err))
        return subprocess.CompletedProcess(list(cmd), proc.returncode, _text(out), _text(err))


def _text(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace").replace("\r\n", "\n")


# ----------------------------------------------------------------------------- server


def _serve(fd: int) -> None:
    """The warm interpreter: import PRELOAD, then fork a child per request until the
    socket closes and every child has ended, reporting each child's status and CPU."""
    import importlib
    import warnings
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    control = socket.socket(fileno=fd)
    for name in PRELOAD:
        importlib.import_module(name)
    from jax._src import xla_bridge
    assert not xla_bridge._backends, "a jax backend exists before forking"
    import gc
    from t5lite.runtime.process import gc_settings
    gc.collect()
    gc_settings.for_command()  # the children's collections leave the preloaded objects alone
    control.sendall(b"ready")
    children: Dict[int, socket.socket] = {}
    open_ = True
    while open_ or children:
        readable = select.select([control] if open_ else [], [], [], POLL_S)[0]
        if readable:
            try:
                data, fds, _, _ = socket.recv_fds(control, 1 << 22, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                open_ = False
                control.close()
            else:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for status in children.values():
                        status.close()
                    control.close()
                    _child(json.loads(data), fds)  # never returns
                for f in fds[:3]:
                    os.close(f)
                children[pid] = socket.socket(fileno=fds[3])
                control.sendall(str(pid).encode())
        while children:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            report = {"returncode": os.waitstatus_to_exitcode(status),
                      "cpu": usage.ru_utime + usage.ru_stime}
            sock = children.pop(pid)
            try:
                sock.sendall(json.dumps(report).encode())
            except OSError:
                pass
            sock.close()


def _child(request: dict, fds: List[int]) -> None:
    """Become the command: streams, directory, environment, signals, argv, __main__;
    then run it and leave through the interpreter's own exit."""
    import builtins
    import runpy
    import signal
    import types
    os.close(fds[3])
    for target, source in zip((0, 1, 2), fds[:3]):
        os.dup2(source, target)
        os.close(source)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGHUP", "SIGTERM", "SIGQUIT", "SIGCHLD"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    import numpy as np
    np.random.seed()
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    mode, target, args = request["mode"], request["target"], request["args"]
    if mode == "-m":
        sys.argv = ["-m", *args]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(target, alter_argv=True)
    else:
        sys.argv = ["-c", *args]
        sys.path[0] = ""
        exec(compile(target, "<string>", "exec"), main.__dict__)
    sys.exit(0)


if __name__ == "__warm__":
    _serve(int(sys.argv[2]))
