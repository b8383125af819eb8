"""A `python3` for shell scripts under test whose t5lite commands run warm.

The launcher tests run the shipped shell scripts (scripts_gpu/*.sh, the SLURM examples),
which start `python3 -m t5lite.train ...` themselves, out of reach of train_helpers.run.
`environment(env)` gives such a script an environment whose PATH starts with a directory
holding a `python3` that is this file. Run as that `python3`:

- `-m t5lite.X ...` and `-c CODE ...`: it asks a broker thread in the test process, over
  a Unix socket, to start the command as a child of a warm interpreter
  (tests/warm_python.py) with this process's argv, working directory, environment,
  stdout and stderr (stdin: /dev/null). It forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT and
  SIGUSR1/2 to the child, and ends as the child ended: its exit status, or killed by the
  same signal. If it is killed itself (SIGKILL), the broker kills the child.
- anything else, or the first command of its environment (warm_python starts a warm
  interpreter at the second), or T5LITE_TESTS_COLD=1: it execs the real interpreter.

What a script sets for itself (SLURM_PROCID, CUDA_VISIBLE_DEVICES, its own settings)
differs from one command to the next; names that no module reads as it is imported can
be passed as `run_time_only`, so that such commands share one warm interpreter.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

BROKER_VAR = "T5LITE_TESTS_WARM_BROKER"
IGNORE_VAR = "T5LITE_TESTS_WARM_IGNORE"
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")

_BROKER = {}


# ----------------------------------------------------------------------------- test side


def environment(env, run_time_only=()):
    """`env` with this `python3` first on PATH and the broker's address (started on first
    use in this process). `run_time_only`: variable names (`NAME*` a prefix) that do not
    separate warm interpreters for these commands."""
    import tempfile
    import threading
    if "bin" not in _BROKER:
        root = tempfile.mkdtemp(prefix="t5lite-warm-shim-")
        os.mkdir(os.path.join(root, "bin"))
        shim = os.path.join(root, "bin", "python3")
        with open(shim, "w") as f:
            f.write(f'#!/bin/sh\nexec "{sys.executable}" -IS "{os.path.abspath(__file__)}" "$@"\n')
        os.chmod(shim, 0o755)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(os.path.join(root, "broker.sock"))
        listener.listen(16)
        threading.Thread(target=_accept, args=(listener,), daemon=True).start()
        _BROKER.update(bin=os.path.dirname(shim), sock=os.path.join(root, "broker.sock"))
    out = dict(env)
    out["PATH"] = _BROKER["bin"] + os.pathsep + env.get("PATH", os.defpath)
    out[BROKER_VAR] = _BROKER["sock"]
    out[IGNORE_VAR] = ",".join(run_time_only)
    return out


def _accept(listener):
    import threading
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve, args=(conn,), daemon=True).start()


def _serve(conn):
    """One shim's command: started warm (its pid sent back, then its exit status), or
    "cold" (the shim runs it itself). A shim gone before its child ends takes it along."""
    import subprocess
    import warm_python
    with conn:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 22, 2)
        try:
            request = json.loads(data)
            ignore = tuple(n for n in request["env"].get(IGNORE_VAR, "").split(",") if n)
            proc = warm_python.popen([sys.executable, *request["args"]], request["env"],
                                     request["cwd"], fds[0], fds[1], run_time_only=ignore)
        finally:
            for fd in fds:
                os.close(fd)
        if proc is None:
            conn.send(b"cold")
            return
        conn.send(f"pid {proc.pid}".encode())
        while True:
            try:
                proc.wait(0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if select.select([conn], [], [], 0)[0] and not conn.recv(16, socket.MSG_PEEK):
                proc.kill()  # the shim is gone (killed): so is its command
                proc.wait()
                return
        try:
            conn.send(f"exit {proc.returncode}".encode())
        except OSError:
            pass


# ----------------------------------------------------------------------------- the shim


def _warm(broker, args):
    """The command's exit status when it ran warm, None when the broker says "cold"."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(broker)
    request = {"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(conn, [json.dumps(request).encode()], [1, 2])
    reply = conn.recv(64).decode()
    if not reply.startswith("pid "):  # "cold", or the broker could not start it
        conn.close()
        return None
    pid = int(reply.split()[1])

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)
    report = conn.recv(64).decode()
    if not report:  # the broker (the test process) is gone
        return 1
    code = int(report.split()[1])
    if code < 0:  # end as the child did: killed by its signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def main():
    args = sys.argv[1:]
    broker = os.environ.get(BROKER_VAR)
    wanted = len(args) >= 2 and (args[0] == "-c" or (args[0] == "-m"
                                                     and args[1].startswith("t5lite.")))
    if broker and wanted and os.environ.get("T5LITE_TESTS_COLD", "") in ("", "0"):
        code = _warm(broker, args)
        if code is not None:
            sys.exit(code)
    os.execv(sys.executable, [sys.executable, *args])


if __name__ == "__main__":
    main()
