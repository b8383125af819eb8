"""Helpers for tests that run `python -m t5lite.train` (and friends) as subprocesses
(a Python command as a child forked from a warm interpreter that has done its imports
once: tests/warm_python.py).

Every subprocess gets JAX_PLATFORMS=cpu and its own fake device count
(`XLA_FLAGS=--xla_force_host_platform_device_count=N`, replacing the 8 that
tests/conftest.py sets for the pytest process), and runs from a directory outside the
repository, so the documented `--gin_file=configs/...` paths are resolved by t5lite's own
search path, as they are for a user.

    proc = run_train(tmp_path / "run", steps=10, model="gpt", devices=1)
    assert proc.returncode == 0, describe(proc)
    complete_steps(tmp_path / "run")             # [10]
    load_state(tmp_path / "run", 10)["params"]   # numpy tree
    data_step(tmp_path / "run", 10)              # 10: the data position saved with it
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import warm_python

REPO = Path(__file__).resolve().parents[1]
PathLike = Union[str, Path]

MODEL_FILES = {
    "t5": "configs/models/t5_1_1/tiny.gin",
    "gpt": "configs/models/gpt/tiny.gin",
    "llama": "configs/models/llama2/tiny.gin",
    "mixtral": "configs/models/mixtral/tiny.gin",
}
SYNTHETIC = "configs/synthetic_pretrain.gin"
SMALL_FEATURES = "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 16}"
SYNC_CHECKPOINTS = "--gin.CheckpointSettings.async_save=False"
DEFAULT_TIMEOUT = 420


# ----------------------------------------------------------------------------- processes


# glibc's allocator kept from handing a step's temporaries back to the kernel: one arena,
# no mmap, no trimming. By default each step of the demo's optimized program maps fresh
# pages for its temporaries (about 140 MB, 35,000 page faults a step) that the kernel
# zeroes, about a fifth of the step's CPU time. Measured, 150 demo steps on this 2-core
# machine: 0.117 -> 0.088 s a step, 60.9 -> 52.5 CPU s for the whole command, 5.29 M ->
# 0.56 M page faults, 2.0 -> 2.4 GB peak. Only for step-heavy runs: with one arena,
# XLA's multithreaded compilation contends on it (compile-heavy in-process tests: +25%
# CPU; the fast-compile training subprocesses: no change).
STEP_HEAVY_MALLOC = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
                     "glibc.malloc.trim_threshold=4294967296")


def optimized(devices: int = 1) -> Dict[str, str]:
    """The environment additions of a subprocess that runs many steps: `devices` fake
    host devices, XLA's CPU backend at LLVM -O1 instead of the tests' fast-compile flags
    (conftest.FAST_COMPILE), and glibc's allocator keeping its memory (STEP_HEAVY_MALLOC;
    results are the same). -O1, not the default -O2: the demo test (pretraining 300
    steps, then finetune / eval / infer) 175 -> 155 CPU s, its steps no slower (0.08-0.09
    s); measured alone, pretraining 97.6 -> 73-80 CPU s with the same losses."""
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={int(devices)} "
                         "--xla_backend_optimization_level=1",
            "GLIBC_TUNABLES": STEP_HEAVY_MALLOC}


def env(devices: int = 1, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a CPU subprocess with `devices` fake host devices."""
    out = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                   out.get("XLA_FLAGS", "")).split()
    flags.append(f"--xla_force_host_platform_device_count={int(devices)}")
    out["XLA_FLAGS"] = " ".join(flags)
    out["JAX_PLATFORMS"] = "cpu"
    out["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if not _installed():  # an uninstalled checkout: make `python -m t5lite...` importable
        out["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p])
    out.pop("SLURM_NTASKS", None)  # a test run inside a SLURM job stays single-process
    if extra:
        out.update(extra)
    return out


def _installed() -> bool:
    """Whether t5lite is installed (pip install [-e]): importable from any directory."""
    from importlib import metadata
    try:
        metadata.distribution("t5lite")
        return True
    except metadata.PackageNotFoundError:
        return False


def train_command(model_dir: Optional[PathLike], *extra: str, model: str = "t5",
                  steps: Optional[int] = None, small: bool = True,
                  sync_checkpoints: bool = True, module: str = "t5lite.train") -> List[str]:
    """argv of `python -m t5lite.train` on the synthetic task: the tiny `model`, MODEL_DIR
    and TRAIN_STEPS (when given), small feature lengths and synchronous checkpointing
    unless told otherwise, then `extra` (later flags win)."""
    cmd = [sys.executable, "-m", module, f"--gin_file={MODEL_FILES[model]}",
           f"--gin_file={SYNTHETIC}"]
    if model_dir is not None:
        cmd.append(f'--gin.MODEL_DIR="{model_dir}"')
    if steps is not None:
        cmd.append(f"--gin.TRAIN_STEPS={int(steps)}")
    if small:
        cmd.append(SMALL_FEATURES)
    if sync_checkpoints:
        cmd.append(SYNC_CHECKPOINTS)
    return cmd + list(extra)


def run(cmd: Sequence[str], devices: int = 1, cwd: Optional[PathLike] = None,
        timeout: float = DEFAULT_TIMEOUT, extra_env: Optional[Mapping[str, str]] = None
        ) -> subprocess.CompletedProcess:
    """Run `cmd` to completion (text stdout / stderr captured); a Python command as a
    child of a warm interpreter (tests/warm_python.py)."""
    environment, directory = env(devices, extra_env), str(cwd or _outside())
    if _warmable(extra_env):
        proc = warm_python.run(cmd, environment, directory, timeout)
        if proc is not None:
            return proc
    return subprocess.run(list(cmd), env=environment, cwd=directory,
                          capture_output=True, text=True, timeout=timeout)


def _warmable(extra_env: Optional[Mapping[str, str]]) -> bool:
    """Whether a command may run as a child of a warm interpreter (tests/warm_python.py):
    not one with variables of its own that a module reads as it is imported (the demo's
    XLA flags and allocator settings), which few other commands share; variables read only
    when a command runs (warm_python.RUN_TIME_ONLY: T5LITE_COMPILATION_CACHE_DIR, ...)
    leave it the warm interpreter of the tests' environment."""
    return all(name.startswith(warm_python.RUN_TIME_ONLY) for name in extra_env or {})


HEAVY_PACKAGES = ("tensorflow", "tensorflow_datasets", "seqio", "t5", "clu")


def imports_after(code: str, packages: Sequence[str] = HEAVY_PACKAGES,
                  cwd: Optional[PathLike] = None, timeout: float = 300,
                  devices: Optional[int] = None
                  ) -> Tuple[subprocess.CompletedProcess, List[str]]:
    """Run `code` in a fresh interpreter (which must succeed; `devices` fake host devices,
    None: this process's environment as it is), then list the modules of `packages` that
    it imported. Returns (the process, the sorted module names)."""
    probe = ("\nimport sys as _s, json as _j\n"
             f"print('IMPORTED', _j.dumps(sorted(n for n in _s.modules "
             f"if n.split('.')[0] in {set(packages)!r})))\n")
    proc = subprocess.run([sys.executable, "-c", code + probe], capture_output=True,
                          text=True, timeout=timeout, cwd=str(cwd) if cwd else None,
                          env=None if devices is None else env(devices))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("IMPORTED ")][-1]
    return proc, json.loads(line[len("IMPORTED "):])


def run_train(model_dir: Optional[PathLike], *extra: str, devices: int = 1,
              timeout: float = DEFAULT_TIMEOUT, cwd: Optional[PathLike] = None,
              **kw) -> subprocess.CompletedProcess:
    """`train_command(...)` run to completion."""
    return run(train_command(model_dir, *extra, **kw), devices=devices, cwd=cwd,
               timeout=timeout)


# Several runs of one command in one fresh interpreter: each argv through the command's
# `main` as `python -m` runs it (a ConfigError is `error: ...` and status 2; any other
# exception its traceback and status 1), with that run's stdout and stderr captured. For
# cases that end before training (bad settings), or runs that follow one another on one
# model directory: one interpreter start and import instead of one a run. Each command keeps a
# real subprocess test of its own. A `Between` in the list is Python run in that
# interpreter between two runs (a test changing the files the next run reads).
_MAINS = r"""
import contextlib, importlib, io, json, sys, traceback
from t5lite.config import command
from t5lite.errors import ConfigError
for module, argv in json.loads(sys.argv[1]):
    if module is None:
        exec(argv, {})
        continue
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv) or 0
        except ConfigError as e:
            print(f"error: {command.one_line(e)}", file=sys.stderr)
            status = command.EXIT_CONFIG_ERROR
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except Exception:
            traceback.print_exc()
            status = 1
    print("RUN " + json.dumps([status, out.getvalue(), err.getvalue()]), flush=True)
"""


class Between(str):
    """Python source that `run_mains` runs between two of its runs, in their interpreter."""


def run_mains(argvs: Sequence[Union[Sequence[str], Between]], devices: int = 1,
              module: Union[str, Sequence[str]] = "t5lite.train",
              timeout: float = DEFAULT_TIMEOUT, cwd: Optional[PathLike] = None,
              extra_env: Optional[Mapping[str, str]] = None
              ) -> List[subprocess.CompletedProcess]:
    """Each argv (without `python -m module`) run by `module.main` in one interpreter, in
    order (`module`: one for all, or one per argv: train, then eval, then infer), a
    `Between` run as Python where it stands; a CompletedProcess per argv (its returncode
    the status the command would exit with, its stdout and stderr that run's), so
    `assert_one_error` reads them as it reads a subprocess."""
    runs_only = [a for a in argvs if not isinstance(a, Between)]
    modules = [module] * len(runs_only) if isinstance(module, str) else list(module)
    assert len(modules) == len(runs_only), (modules, runs_only)
    modules_left, entries = iter(modules), []
    for item in argvs:
        entries.append([None, str(item)] if isinstance(item, Between)
                       else [next(modules_left), list(item)])
    proc = run([sys.executable, "-c", _MAINS, json.dumps(entries)],
               devices=devices, timeout=timeout, cwd=cwd, extra_env=extra_env)
    runs = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("RUN ")]
    assert proc.returncode == 0 and len(runs) == len(runs_only), describe(proc)
    return [subprocess.CompletedProcess(argv, status, out, err)
            for argv, (status, out, err) in zip(runs_only, runs)]


# A Python child started through this trampoline has Ctrl-C and SIGHUP at their default
# dispositions, as a run started from a terminal has them, whatever this test process
# inherited (`nohup` ignores SIGHUP, a shell's `&` ignores SIGINT; ignored dispositions
# survive exec, and the training loop rightly keeps a signal its process was started
# ignoring). exec keeps the process id, so signals sent to the Popen reach the run.
_DEFAULT_SIGNALS = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                    "signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")


def start(cmd: Sequence[str], log_path: PathLike, devices: int = 1,
          cwd: Optional[PathLike] = None, extra_env: Optional[Mapping[str, str]] = None
          ) -> Union[subprocess.Popen, warm_python.WarmProcess]:
    """Start `cmd` in the background; stdout and stderr go to `log_path` (poll it with
    `read_log`). The caller must `finish` or `kill` it. A Python `cmd` starts with SIGINT
    and SIGHUP at their defaults (the signal tests send them)."""
    cmd, environment, directory = list(cmd), env(devices, extra_env), str(cwd or _outside())
    log = open(log_path, "w")
    try:
        warm = (warm_python.popen(cmd, environment, directory, log.fileno(), log.fileno())
                if _warmable(extra_env) else None)
        if warm is not None:  # its child starts with those signals at their defaults
            return warm
        if cmd and cmd[0] == sys.executable:
            cmd = [sys.executable, "-c", _DEFAULT_SIGNALS] + cmd[1:]
        return subprocess.Popen(cmd, env=environment, cwd=directory, stdout=log,
                                stderr=subprocess.STDOUT, text=True)
    finally:
        log.close()  # the child holds its own copy of the descriptor


def finish(proc: subprocess.Popen, timeout: float = DEFAULT_TIMEOUT) -> int:
    """Wait for `proc`; kill it (and fail) when it does not end within `timeout`."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise AssertionError(f"{proc.args} did not finish within {timeout} s") from None


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the process we started (by its pid) and reap it if it was SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=60)


def read_log(path: PathLike) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = DEFAULT_TIMEOUT,
             proc: Optional[subprocess.Popen] = None, log_path: Optional[PathLike] = None,
             poll: float = 0.05) -> None:
    """Poll `predicate` until true; fail after `timeout` s or when `proc` ends first."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            if predicate():
                return
            raise AssertionError(f"process ended (rc={proc.returncode}) before {what}:\n"
                                 f"{tail(read_log(log_path)) if log_path else ''}")
        if time.monotonic() > deadline:
            if proc is not None:
                kill(proc)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n"
                                 f"{tail(read_log(log_path)) if log_path else ''}")
        time.sleep(poll)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _outside() -> str:
    """A working directory outside the repository (the documented command's habit)."""
    return str(Path(os.environ.get("TMPDIR", "/tmp")))


# ----------------------------------------------------------------------------- output


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


def describe(proc: subprocess.CompletedProcess) -> str:
    """A failure message: the command's status and the ends of its output."""
    return (f"rc={proc.returncode}\n--- stdout\n{tail(proc.stdout or '')}\n"
            f"--- stderr\n{tail(proc.stderr or '')}")


def error_lines(text: str) -> List[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def assert_one_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Non-zero exit, exactly one `error:` line on stderr, no Traceback, and the line
    (the whole of stderr's last line) contains every needle. Returns the line."""
    assert proc.returncode not in (0, None), describe(proc)
    assert "Traceback" not in proc.stderr, describe(proc)
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, describe(proc)
    assert proc.stderr.rstrip().splitlines()[-1] == lines[0], describe(proc)
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def logged_steps(log: str) -> List[int]:
    """Steps of the `step N/M | ...` log lines."""
    return [int(m) for m in re.findall(r"INFO step (\d+)/\d+ \|", log)]


# ----------------------------------------------------------------------------- MODEL_DIR


def checkpoints_dir(model_dir: PathLike) -> Path:
    return Path(model_dir) / "checkpoints"


def complete_steps(model_dir: PathLike) -> List[int]:
    """Committed training checkpoints under MODEL_DIR, oldest first."""
    from t5lite.formats import checkpoint_files
    return checkpoint_files.complete_steps(str(checkpoints_dir(model_dir)))


def load_state(model_dir: PathLike, step: int) -> dict:
    """The `state` item of checkpoint `step` as a tree of numpy arrays (no target needed:
    shapes and dtypes come from the checkpoint's metadata; any device count)."""
    import jax
    import orbax.checkpoint as ocp
    from etils import epath

    item = epath.Path(checkpoints_dir(model_dir) / str(int(step)) / "state")
    handler = ocp.PyTreeCheckpointHandler()
    try:
        meta = handler.metadata(item).tree
    finally:
        handler.close()
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
    with ocp.PyTreeCheckpointer() as ckptr:
        return ckptr.restore(item, args=ocp.args.PyTreeRestore(restore_args=restore_args))


def data_step(model_dir: PathLike, step: int) -> int:
    """The synthetic iterator's position saved in checkpoint `step` (the `data` item)."""
    import orbax.checkpoint as ocp
    from etils import epath

    item = epath.Path(checkpoints_dir(model_dir) / str(int(step)) / "data")
    with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as ckptr:
        return int(ckptr.restore(item)["step"])


def flat(tree) -> Dict[str, np.ndarray]:
    """{"a/b/c": array} over a nested dict's leaves."""
    import jax
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def assert_trees_equal(a, b, what: str = "trees") -> None:
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys(), f"{what}: different leaves"
    different = [k for k in fa if not np.array_equal(fa[k], fb[k])]
    assert not different, f"{what}: {len(different)} leaves differ, e.g. {different[:3]}"


def config_text(model_dir: PathLike) -> str:
    """MODEL_DIR/config.gin with gin's continued lines (a long value wraps after `= \\`)
    joined, so that each binding is one line."""
    return re.sub(r"\\\n\s*", "", (Path(model_dir) / "config.gin").read_text())


def scalars(model_dir: PathLike, subdir: str = "train") -> Dict[str, List[Tuple[int, float]]]:
    """TensorBoard scalars written under MODEL_DIR/<subdir> ({tag: [(step, value)]})."""
    from t5lite.runtime import event_files
    return event_files.read_scalars(str(Path(model_dir) / subdir))


def snapshot(directory: PathLike) -> Dict[str, Tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file and directory under `directory`."""
    root = Path(directory)
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out
