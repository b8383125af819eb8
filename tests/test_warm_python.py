"""tests/warm_python.py: a command forked from a warm interpreter behaves as `python -m` /
`python -c` started fresh (the reference: the same probe run as a real subprocess)."""
import json
import signal
import subprocess
import sys
import time

import pytest

import train_helpers as th
import warm_python
import warm_shim

# What a command sees of its process: argv, directory, __main__, its environment, exit.
PROBE = r"""
import json, os, sys
import numpy as np
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "name": __name__,
                  "path0": sys.path[0], "env": os.environ.get("T5LITE_PROBE"),
                  "jax_backends": "jax" in sys.modules
                                  and bool(sys.modules["jax._src.xla_bridge"]._backends),
                  "sigint": str(__import__("signal").getsignal(2)),
                  "sighup": str(__import__("signal").getsignal(1)),
                  "pid": os.getpid()}))
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["raise"]:
    raise ValueError("raised")
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


def _warm_run(cmd, env, cwd, timeout=120):
    """warm_python.run, asked twice when needed (the first command in an environment is
    left to its caller to run)."""
    return warm_python.run(cmd, env, str(cwd), timeout) or \
        warm_python.run(cmd, env, str(cwd), timeout)


def _both(argv, tmp_path, extra_env=None):
    """The probe as a real subprocess and as a warm child: (cold, warm) CompletedProcess."""
    environment = th.env(1, extra_env)
    cmd = [sys.executable, "-c", PROBE, *argv]
    cold = subprocess.run(cmd, env=environment, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    warm = _warm_run(cmd, environment, tmp_path)
    assert warm is not None
    return cold, warm


def _seen(proc):
    """What the probe printed, less what differs between any two processes (its pid) and
    what a fresh process inherits from this one (ignored signals: nohup, a shell's `&`)."""
    seen = json.loads(proc.stdout.splitlines()[0])
    for name in ("pid", "sigint", "sighup"):
        seen.pop(name)
    return seen


@pytest.mark.parametrize("argv, status", [([], 0), (["3"], 3), (["raise"], 1)])
def test_a_warm_child_sees_and_exits_as_a_fresh_process(tmp_path, argv, status):
    cold, warm = _both(argv, tmp_path, {"T5LITE_PROBE": str(tmp_path)})
    assert (cold.returncode, warm.returncode) == (status, status)
    assert _seen(warm) == _seen(cold)
    assert _seen(warm)["env"] == str(tmp_path) and _seen(warm)["name"] == "__main__"
    assert not _seen(warm)["jax_backends"]
    signals = json.loads(warm.stdout.splitlines()[0])  # a new interpreter's, as th.start's
    assert (signals["sigint"], signals["sighup"]) == (str(signal.default_int_handler),
                                                      str(signal.SIG_DFL))
    if status == 1:
        assert cold.stderr.splitlines()[-1] == warm.stderr.splitlines()[-1] == \
            "ValueError: raised"
    else:
        assert cold.stderr == warm.stderr == "to stderr\n"


def test_one_warm_interpreter_serves_run_time_only_variables_and_not_others(tmp_path):
    """The first command in an environment is the caller's to run; the second starts its
    warm interpreter, which serves every environment differing in RUN_TIME_ONLY."""
    cmd, new = [sys.executable, "-c", PROBE], th.env(1, {"JAX_UNREAD_BY_ANYONE": "1"})
    assert warm_python.run(cmd, new, str(tmp_path), 60) is None
    assert warm_python.run(cmd, new, str(tmp_path), 60).returncode == 0
    for value in ("a", "b"):
        assert _warm_run(cmd, th.env(1, {"T5LITE_PROBE": value}), tmp_path).returncode == 0
    assert warm_python._key(th.env(1, {"T5LITE_PROBE": "a"})) == \
        warm_python._key(th.env(1, {"T5LITE_PROBE": "b"}))
    assert warm_python._key(th.env(1)) != warm_python._key(th.env(2))
    assert warm_python._key(th.env(1)) != warm_python._key(th.env(1, {"JAX_X": "1"}))


def test_a_module_command_runs_as_main_and_other_commands_are_not_warmed(tmp_path):
    cmd = [sys.executable, "-m", "t5lite.train", "--help"]
    warm = _warm_run(cmd, th.env(1), tmp_path)
    cold = subprocess.run(cmd, env=th.env(1), cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert warm.returncode == cold.returncode == 0
    assert warm.stdout == cold.stdout and "usage:" in warm.stdout
    assert warm_python.run([sys.executable, "-m", "pytest", "--version"], th.env(1),
                           str(tmp_path), 60) is None
    assert warm_python.run(["bash", "-c", "true"], th.env(1), str(tmp_path), 60) is None


def test_signals_reach_the_child_and_its_status_says_so(tmp_path):
    """Started as th.start starts a run: its own pid; SIGTERM ends it with -15, Ctrl-C is
    a KeyboardInterrupt (status -2 as Python reports it), a time-out is TimeoutExpired."""
    code = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(60)"
    assert _warm_run([sys.executable, "-c", "pass"], th.env(1), tmp_path).returncode == 0
    for sig, status in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, -signal.SIGINT)):
        log = tmp_path / f"{sig}.log"
        proc = th.start([sys.executable, "-c", code], log)
        assert isinstance(proc, warm_python.WarmProcess)
        th.wait_for(lambda: th.read_log(log).strip(), "the pid", timeout=60, proc=proc)
        assert int(th.read_log(log).split()[0]) == proc.pid
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)
        assert proc.poll() is None
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == status
    with pytest.raises(subprocess.TimeoutExpired):
        _warm_run([sys.executable, "-c", "import time; time.sleep(60)"], th.env(1),
                  tmp_path, timeout=1)


def test_children_draw_their_own_random_numbers(tmp_path):
    code = "import numpy as np, random; print(np.random.randint(1 << 30), random.random())"
    outs = {_warm_run([sys.executable, "-c", code], th.env(1), tmp_path).stdout
            for _ in range(2)}
    assert len(outs) == 2


def test_cold_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("T5LITE_TESTS_COLD", "1")
    assert warm_python.run([sys.executable, "-c", "pass"], th.env(1), str(tmp_path),
                           60) is None
    start = time.monotonic()
    assert th.run([sys.executable, "-c", "pass"], cwd=tmp_path).returncode == 0
    assert time.monotonic() - start < 60


# ----------------------------------------------------------------------------- warm_shim

SHIM_SET = ("PATH", "SHLVL", "_", "PWD", "OLDPWD")  # what bash changes for its commands


def _script(tmp_path, body, extra_env=None, run_time_only=SHIM_SET):
    """`bash -c body` with tests/warm_shim.py's `python3` first on PATH."""
    env = warm_shim.environment(th.env(1, extra_env), run_time_only=run_time_only)
    return subprocess.run(["bash", "-c", body], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)


def test_a_script_s_python3_runs_warm_from_its_second_command_as_a_fresh_one_would(tmp_path):
    """A script's `python3 -c PROBE` three times: what each prints (stdout, stderr, exit
    status through bash) is what a fresh process prints; the first execs the real
    interpreter (the probe's pid is the shim's: $!), the later ones are warm children (a
    pid of their own). SLURM_PROCID, set by the script and named run-time only, shares
    the warm interpreter."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    body = "\n".join(
        f'SLURM_PROCID={i} python3 -c "$(cat {probe})" {arg} > out{i} 2> err{i} & '
        f'shim=$!; wait $shim; echo "$shim $?"' for i, arg in enumerate(["", "3", "raise"]))
    started = warm_python.STATS["started"]
    proc = _script(tmp_path, body, {"JAX_SHIM_TEST": str(tmp_path)},
                   run_time_only=(*SHIM_SET, "SLURM_*"))
    assert proc.returncode == 0, th.describe(proc)
    shims = [line.split() for line in proc.stdout.splitlines()]
    assert [int(status) for _, status in shims] == [0, 3, 1]
    pids = [json.loads((tmp_path / f"out{i}").read_text().splitlines()[0])["pid"]
            for i in range(3)]
    assert pids[0] == int(shims[0][0])  # cold: the shim exec'd python
    assert pids[1] != int(shims[1][0]) and pids[2] != int(shims[2][0])  # warm children
    assert warm_python.STATS["started"] == started + 2
    cold = subprocess.run([sys.executable, "-c", PROBE, "3"], env=th.env(1), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert _seen(subprocess.CompletedProcess([], 3, (tmp_path / "out1").read_text())) == \
        _seen(cold)
    assert (tmp_path / "err1").read_text() == "to stderr\n"
    assert (tmp_path / "err2").read_text().splitlines()[-1] == "ValueError: raised"


def test_a_signal_to_the_shim_reaches_its_child_and_a_killed_shim_takes_it_along(tmp_path):
    """SIGTERM to a script's warm `python3` ends its child, and bash sees 143 (killed by
    SIGTERM) as from a fresh process; SIGKILL to the shim (which cannot pass it on) and
    the broker kills the child."""
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    body = f"""
python3 -c pass; python3 -c pass   # this environment's warm interpreter started
for sig in TERM KILL; do
  python3 -c "{code}" > $sig.pid & shim=$!
  for i in $(seq 600); do [ -s $sig.pid ] && break; sleep 0.1; done
  kill -$sig $shim; wait $shim; echo "$sig $? $shim $(cat $sig.pid)"
done
"""
    proc = _script(tmp_path, body)
    assert proc.returncode == 0, th.describe(proc)
    (_, term, shim, child), (_, killed, kshim, kchild) = \
        [line.split() for line in proc.stdout.splitlines()]
    assert (int(term), int(killed)) == (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    assert shim != child and kshim != kchild  # both were warm children
    th.wait_for(lambda: not _alive(int(kchild)), "the killed shim's child gone", timeout=30)
    assert not _alive(int(child))


def _alive(pid):
    """Whether `pid` runs (not a zombie); a process reaped between the open and the read
    of its stat file reads as ESRCH (ProcessLookupError): gone too."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
