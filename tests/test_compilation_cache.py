"""The persistent compilation cache every command uses (issue 38): a second run loads
the programs the first saved; None turns it off; a cache directory that is a file, is
read-only or fills up, or holds an entry cut short, costs one warning line and never the
run; the processes of a multi-process run share it (process 0 writes).

The commands run as subprocesses (`python -m t5lite.train`, the tiny T5 cut to one layer a
side and a 512-entry vocabulary, one step), each with its own cache directory;
tests/conftest.py has JAX cache every program, however quick to compile. The small
filesystems are tmpfs mounts, which need root (CI runs as root); the read-only case falls
back to file permissions elsewhere.
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

import model_helpers as mh
import train_helpers as th
from t5lite.config import parsing
from t5lite.errors import ConfigError
from t5lite.runtime.process import compilation_cache as cc

GIN_FILES = (th.MODEL_FILES["t5"], th.SYNTHETIC)
# Every command of this file runs this model: the same programs, so a warm cache serves
# each (the vocabulary and layers do not matter to what the cache does).
SMALL_MODEL = tuple(mh.small_flags())


def _train(model_dir, cache, *extra, steps=1, **kw):
    """One tiny training run whose T5LITE_COMPILATION_CACHE_DIR is `cache`."""
    return th.run(th.train_command(model_dir, *SMALL_MODEL, *extra, steps=steps),
                  extra_env={cc.ENV: str(cache)}, **kw)


def _warnings(proc):
    return [line for line in proc.stderr.splitlines() if re.search(r"\bWARNING\b", line)]


def _assert_ok(proc, warnings=0):
    """Exit 0, no traceback, no raw JAX cache warning, `warnings` warning lines (each the
    compilation cache's). Returns those lines."""
    assert proc.returncode == 0, th.describe(proc)
    for noise in ("Traceback", "UserWarning", "Error writing persistent", "Error reading "
                  "persistent"):
        assert noise not in proc.stderr, th.describe(proc)
    lines = _warnings(proc)
    assert len(lines) == warnings and all("compilation cache" in l for l in lines), \
        th.describe(proc)
    return lines


def _entries(cache):
    return sorted(p for p in os.listdir(cache) if p.endswith("-cache"))


def _whole(path):
    """Whether a cache entry reads back (JAX's own decompression)."""
    from jax._src.compilation_cache import decompress_executable
    try:
        decompress_executable(open(path, "rb").read())
        return True
    except Exception:  # noqa: BLE001
        return False


def _summary(proc):
    found = re.findall(r"compilation cache \S+: (\d+) hits?, (\d+) miss(?:es)?, (\d+) saved",
                       proc.stderr)
    assert found, th.describe(proc)
    return tuple(int(n) for n in found[-1])


# ----------------------------------------------------------------------------- settings


def test_the_directory_comes_from_the_macro_then_the_environment_then_the_default(
        monkeypatch, tmp_path):
    for name in (cc.ENV, cc.JAX_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home_default = str(tmp_path / "home" / ".cache" / "t5lite" / "compilation")
    assert cc.resolve() == (home_default, "the default")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.resolve() == (str(tmp_path / "xdg" / "t5lite" / "compilation"), "the default")
    monkeypatch.setenv(cc.JAX_ENV, str(tmp_path / "jax"))
    assert cc.resolve() == (str(tmp_path / "jax"), cc.JAX_ENV)
    monkeypatch.setenv(cc.ENV, "~/mine")
    assert cc.resolve() == (str(tmp_path / "home" / "mine"), cc.ENV)
    monkeypatch.chdir(tmp_path)
    assert cc.resolve("relative") == (str(tmp_path / "relative"), cc.MACRO)
    for off in (None, "None", ""):
        assert cc.resolve(off) == (None, cc.MACRO)
        monkeypatch.setenv(cc.ENV, off or "")
        assert cc.resolve() == (None, cc.ENV)
    with pytest.raises(ValueError, match="COMPILATION_CACHE_DIR must be a directory"):
        cc.resolve(3)


def test_every_config_takes_the_macro_on_the_command_line_and_its_typos_are_caught():
    parsing.check_command_line_macros(GIN_FILES, ["COMPILATION_CACHE_DIR = None"])
    parsing.check_command_line_macros(["models/t5_1_1/tiny.gin"],
                                      ["COMPILATION_CACHE_DIR = '/tmp/cache'"])
    with pytest.raises(ConfigError, match="did you mean COMPILATION_CACHE_DIR"):
        parsing.check_command_line_macros(GIN_FILES, ["COMPILATION_CACHE_DI = None"])


# ----------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache one run has filled, and that run."""
    root = tmp_path_factory.mktemp("warm")
    proc = _train(root / "run", root / "cache")
    return root / "cache", proc


def test_a_second_run_loads_the_programs_the_first_saved(warm, tmp_path):
    cache, first = warm
    _assert_ok(first)
    assert f"compilation cache: {cache} (T5LITE_COMPILATION_CACHE_DIR; empty)" in first.stderr
    assert re.search(r"compilation cache: jit\(step_fn\) compiled in [\d.]+ s, saved",
                     first.stderr), th.describe(first)
    hits, misses, saved = _summary(first)  # (a program compiled twice: the second, a hit)
    assert misses >= 2 and saved == misses
    assert any(e.startswith("jit_step_fn-") for e in _entries(cache))
    assert all(_whole(cache / e) for e in _entries(cache))
    # the line before the step compiles, and the compile time remembered for the run
    # (runtime/process/compile_record.py; its own tests: test_compile_record.py)
    announced = first.stderr.index(
        "compiling the train step (jit(step_fn)); the first time for this MODEL_DIR")
    assert announced < first.stderr.index("compilation cache: jit(step_fn) compiled in")
    record = json.loads((cache / "compile_seconds.json").read_text())
    assert list(record) == [f"{cache.parent / 'run'}|jit(step_fn)"] and record[
        f"{cache.parent / 'run'}|jit(step_fn)"] > 0
    # the gin macro wins over the environment (which names a directory never made)
    second = _train(tmp_path / "run", tmp_path / "unused",
                    f"--gin.COMPILATION_CACHE_DIR='{cache}'")
    _assert_ok(second)
    assert f"compilation cache: {cache} (COMPILATION_CACHE_DIR; " in second.stderr
    # a program gets its own line when it took a second or more (cc.LOG_SECONDS): each
    # that compiled in 2 s or more has one when loaded. (JAX stores a program's compile
    # time in whole seconds, rounded down and without its save, which the compiled line's
    # time includes: one that compiled and saved in 1-2 s may load as "0 s", without a
    # line; the tiny initializer's is near a second, on either side from run to run.)
    timed = {p: float(m.group(1)) for p in ("init", "step_fn") for m in [re.search(
        rf"compilation cache: jit\({p}\) compiled in ([\d.]+) s", first.stderr)] if m}
    assert "step_fn" in timed
    for program in [p for p, seconds in timed.items() if seconds >= 2.0]:
        assert re.search(rf"compilation cache: jit\({program}\) loaded in [\d.]+ s",
                         second.stderr), th.describe(second)
    assert _summary(second)[0] >= 2 and _summary(second)[1:] == (0, 0)
    assert not (tmp_path / "unused").exists()


def test_none_turns_it_off(tmp_path):
    proc = th.run(th.train_command(tmp_path / "run", *SMALL_MODEL,
                                   "--gin.COMPILATION_CACHE_DIR=None", steps=1),
                  extra_env={cc.ENV: str(tmp_path / "ours"), cc.JAX_ENV: str(tmp_path / "jax")})
    _assert_ok(proc)
    assert "compilation cache: off (COMPILATION_CACHE_DIR)" in proc.stderr
    assert not (tmp_path / "ours").exists() and not (tmp_path / "jax").exists()


def _mount_tmpfs(path, options):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")


def _as_root():
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")


@pytest.fixture
def mounts():
    """Mount points to unmount after the test."""
    points = []
    yield points
    for point in points:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_bench_reads_it_and_says_so_in_its_result(warm, tmp_path):
    out = tmp_path / "bench.json"
    proc = th.run([sys.executable, "-m", "t5lite.bench", *(f"--gin_file={f}" for f in GIN_FILES),
                   th.SMALL_FEATURES, *SMALL_MODEL, "--startup_only", f"--json_out={out}"],
                  extra_env={cc.ENV: str(warm[0])})
    _assert_ok(proc)
    assert re.search(r"jit\(step_fn\) loaded in", proc.stderr), th.describe(proc)
    result = json.loads(out.read_text())["compilation_cache"]
    assert result["directory"] == str(warm[0]) and result["hits"] >= 2, result


def test_a_cache_path_that_is_a_file_is_one_warning(tmp_path):
    """(info --memory: it compiles the train step, without the cache; at the other runs'
    small lengths and a batch of 2, not info's default 512/128 and full batch, which
    only made that compile slower.)"""
    (tmp_path / "cache").write_text("not a directory")
    proc = th.run([sys.executable, "-m", "t5lite.info", *(f"--gin_file={f}" for f in GIN_FILES),
                   "--inputs_length=32", "--targets_length=16", "--memory", "--devices=1",
                   "--per_device_batch=2", *SMALL_MODEL],
                  extra_env={cc.ENV: str(tmp_path / "cache")})
    line, = _assert_ok(proc, warnings=1)
    assert f"compilation cache {tmp_path / 'cache'}: it is a file, not a directory; " \
           f"compiling without it" in line
    assert "peak" in proc.stdout, th.describe(proc)


def test_a_read_only_cache_is_one_warning_and_still_read(warm, tmp_path, mounts):
    cache = tmp_path / "cache"
    if os.geteuid() == 0:  # root writes through permissions: a read-only filesystem
        _mount_tmpfs(cache, "size=64m")
        mounts.append(cache)
        shutil.copytree(warm[0], cache, dirs_exist_ok=True)
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
    else:
        shutil.copytree(warm[0], cache)
        cache.chmod(stat.S_IRUSR | stat.S_IXUSR)
    before = sorted(os.listdir(cache))
    try:
        proc = _train(tmp_path / "run", cache)
    finally:
        if os.geteuid() != 0:
            cache.chmod(stat.S_IRWXU)
    line, = _assert_ok(proc, warnings=1)
    assert f"compilation cache {cache}: cannot write to it (" in line and "reading it only" \
        in line
    assert re.search(r"jit\(step_fn\) loaded in", proc.stderr), th.describe(proc)
    assert sorted(os.listdir(cache)) == before


def test_a_cache_disk_that_fills_is_one_warning_and_leaves_no_partial_entry(tmp_path,
                                                                            mounts):
    _as_root()
    cache = tmp_path / "cache"
    _mount_tmpfs(cache, "size=200k")  # this file's T5's programs need ~540 kB
    mounts.append(cache)
    proc = _train(tmp_path / "run", cache)
    line, = _assert_ok(proc, warnings=1)
    assert f"compilation cache {cache}: cannot save " in line and \
        "No space left on device" in line and "programs compiled from now on are not saved" \
        in line
    assert all(_whole(cache / e) for e in _entries(cache)), _entries(cache)


def test_an_entry_cut_short_is_one_warning_and_replaced(warm, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(warm[0], cache)
    step, = [cache / e for e in _entries(cache) if e.startswith("jit_step_fn-")]
    data = step.read_bytes()
    step.write_bytes(data[:len(data) // 2])  # a process killed while it wrote
    proc = _train(tmp_path / "run", cache)
    line, = _assert_ok(proc, warnings=1)
    assert f"compilation cache {cache}: a saved jit_step_fn could not be read (" in line \
        and "compiling it again and replacing the entry" in line
    assert re.search(r"jit\(step_fn\) compiled in [\d.]+ s, saved", proc.stderr)
    assert "1 unreadable (compiled again)" in proc.stderr
    assert _whole(step)


def _pair(model_dir, cache, logs, steps):
    """A two-process run (jax.distributed on 127.0.0.1) sharing `cache`; its logs."""
    port = th.free_port()
    logs.mkdir(parents=True, exist_ok=True)
    procs = [th.start(th.train_command(
        model_dir, *SMALL_MODEL, "--gin.ICI_MESH_SHAPE=[1,1,1]",
        "--gin.DCN_MESH_SHAPE=[2,1,1]",
        f"--coordinator_address=127.0.0.1:{port}", "--process_count=2",
        f"--process_index={i}", steps=steps), logs / f"p{i}.log",
        extra_env={cc.ENV: str(cache)}) for i in range(2)]
    try:
        rcs = [th.finish(p) for p in procs]
    finally:
        for p in procs:
            th.kill(p)
    texts = [th.read_log(logs / f"p{i}.log") for i in range(2)]
    assert rcs == [0, 0], "\n".join(th.tail(t) for t in texts)
    for text in texts:
        assert "Traceback" not in text and " WARNING " not in text, text
    return texts


def test_the_processes_of_a_run_share_it_and_process_0_writes(tmp_path):
    cache = tmp_path / "cache"
    cold = _pair(tmp_path / "run", cache, tmp_path / "cold", steps=1)
    assert re.search(r"jit\(step_fn\) compiled in [\d.]+ s, saved", cold[0]), cold[0]
    assert re.search(r"jit\(step_fn\) compiled in [\d.]+ s; not saved: process 0 saves",
                     cold[1]), cold[1]
    assert any(e.startswith("jit_step_fn-") for e in _entries(cache))
    # the restart: process 0 loads its step. (On the CPU each process's programs have
    # keys of their own, so process 1, which saves nothing, compiles again; on GPUs JAX
    # leaves the device assignment out of the key and every process loads.)
    warm = _pair(tmp_path / "run", cache, tmp_path / "warm", steps=2)
    assert re.search(r"jit\(step_fn\) loaded in [\d.]+ s", warm[0]), warm[0]
    assert "start: " in warm[1] and "step 2/2" in warm[0]
