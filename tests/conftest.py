"""Test-wide environment: CPU only, 8 fake host devices for sharding tests.

Set before anything imports jax; subprocesses inherit it. x64 stays off.
"""
import gc
import os
import shutil
import sys
import tempfile
import weakref

import pytest

# XLA's CPU compiler at LLVM -O0, without its expensive passes: the tests' tiny programs
# take longer to compile than to run. Measured on this 2-core machine, the in-process
# test_switches + test_lora + test_trainer: 290 -> 193 s; the subprocess-heavy
# test_train_cli + test_train_tasks: 406 -> 391 s. Steps run slower (the demo's 0.088 ->
# 0.130 s), so the demo test, 600 steps as shipped, runs at LLVM -O1 (`th.optimized`).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# One JAX persistent compilation cache for the whole test run, this process and every
# subprocess it starts (a CLI test's `python -m t5lite.train` compiles the same tiny
# train step as the one before it): a new directory each run, removed at its end, so no
# run depends on another's. Every compiled program is cached, however quick to compile.
# (Measured: the suite 24:23 -> 20:12; alone, test_watchdog.py 24.1 -> 19.2 s and
# test_run_lock.py 18.8 -> 13.3 s. `JAX_COMPILATION_CACHE_DIR= pytest ...` runs without.)
# The commands' own setting (T5LITE_COMPILATION_CACHE_DIR) names the same directory, so
# no test writes to the user's cache (~/.cache/t5lite/compilation).
_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="t5lite-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ["T5LITE_COMPILATION_CACHE_DIR"] = os.environ["JAX_COMPILATION_CACHE_DIR"]


def pytest_sessionfinish(session, exitstatus):
    if _CACHE:
        shutil.rmtree(_CACHE, ignore_errors=True)

# PyPI's torch for Python 3.12 (the `test` extra's, for the Hugging Face parity tests) is
# the CUDA build, which brings triton. Loading triton's native library after TensorFlow's
# crashes the process (TF 2.21 / triton 3.7: a segfault in triton's import, reached from
# transformers through torch._dynamo); loaded first, both work. So load it first.
try:
    import triton  # noqa: F401,E402
except ImportError:
    pass


@pytest.fixture(scope="module")
def hf_t5(tmp_path_factory):
    """A random transformers T5 v1.1 (tiny, untied), saved as safetensors."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                num_heads=4, feed_forward_proj="gated-gelu",
                                tie_word_embeddings=False, relative_attention_num_buckets=16,
                                relative_attention_max_distance=20)
    path = tmp_path_factory.mktemp("hf_t5")
    transformers.T5ForConditionalGeneration(cfg).save_pretrained(str(path),
                                                                 safe_serialization=True)
    return path


# A command run in this process (train / eval / infer's `main(argv)`) leaves its tf.data
# pipelines to Python's cycle collector. Collected later, while another test's pipeline
# runs, TensorFlow removes their functions from its eager context under that pipeline: a
# test worker once died of it (a segmentation fault in a garbage collection during a LoRA
# test's first step, a jsonl reader running in a tf.data thread). So a test that ran a
# command collects them as it ends, when none of its pipelines is running any more.
_COMMANDS_RUN = [0]


def _count_commands():
    command = sys.modules.get("t5lite.config.command")
    if command is None or getattr(command.run_model_command, "counted", False):
        return
    original = command.run_model_command

    def counted(*args, **kwargs):
        _COMMANDS_RUN[0] += 1
        return original(*args, **kwargs)
    counted.counted = True
    command.run_model_command = counted


# A data iterator a test leaves open (a failed test's frames keep theirs alive, in
# sys.last_traceback, until the next failure) keeps tf.data's prefetch threads reading ahead,
# a Pile reader running Python in one of them, until a garbage collection in some later
# test destroys it. A worker died once in such a collection (a segmentation fault at a
# compilation-cache write, the collector running, another test's Pile reader in a tf.data
# thread). So every iterator a test made is closed as it ends: released then, at a quiet
# point, by reference counting (tests/test_pipeline.py checks that close() does).
_ITERATORS: "weakref.WeakSet" = weakref.WeakSet()


def _register_iterators():
    pipeline = sys.modules.get("t5lite.data.pipeline")
    if pipeline is None or getattr(pipeline.SeqioIterator.__init__, "registered", False):
        return
    original = pipeline.SeqioIterator.__init__

    def registered(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _ITERATORS.add(self)
    registered.registered = True
    pipeline.SeqioIterator.__init__ = registered


@pytest.fixture(autouse=True)
def _pipelines_released_as_each_test_ends():
    _count_commands()
    _register_iterators()
    before = _COMMANDS_RUN[0]
    yield
    for iterator in list(_ITERATORS):
        iterator.close()
    _ITERATORS.clear()
    if _COMMANDS_RUN[0] != before and "tensorflow" in sys.modules:
        gc.collect()


# The longest files first. Under `-n auto --dist loadfile` each xdist worker takes a whole
# file at a time, in the order of this list (pytest.ini's --no-loadscope-reorder; xdist's
# own order is by test count, which started the demo's 4 tests, 5 minutes, last, one
# worker running it alone at the end while the other idled). Seconds measured per file in
# tests/file_costs.json; a file not listed there keeps its place after those listed.
def _file_costs():
    import json
    path = os.path.join(os.path.dirname(__file__), "file_costs.json")
    with open(path) as f:
        return json.load(f)["seconds"]


# Python's cycle collector, set as a command sets it (t5lite/runtime/process/gc_settings.py):
# what is imported by the end of collection (jax, TensorFlow, the test modules) frozen out
# of its walks, and a collection every 50,000 allocations instead of 700. Tracing a model
# allocates millions of short-lived objects; with the defaults, a profile of the whole
# suite (perf, every process) found 9% of its CPU in the collector, the test processes'
# share as large as the subprocesses'.
def pytest_collection_finish(session):
    from t5lite.runtime.process import gc_settings
    gc_settings.for_command()


def pytest_collection_modifyitems(session, config, items):
    costs = _file_costs()
    items.sort(key=lambda item: -costs.get(os.path.basename(str(item.path)), 0))


def pytest_addoption(parser):
    parser.addoption("--cpu-profile", metavar="DIR", default=None,
                     help="write each test's CPU seconds (its own and its subprocesses') "
                          "to DIR/cpu_<worker>.jsonl; `python tests/cpu_profile.py DIR` "
                          "sums them up (tests/cpu_profile.py)")


def pytest_configure(config):
    directory = config.getoption("--cpu-profile")
    if directory:
        import cpu_profile
        config.pluginmanager.register(cpu_profile.CpuProfile(os.path.abspath(directory)),
                                      "t5lite_cpu_profile")


# `-n auto`: one worker more than the cores this process may use. A core-bound suite
# leaves about an eighth of a 2-core machine idle with one worker a core (measured: 1.74
# of 2 cores busy), while workers wait on subprocesses starting, timers and sleeps
# (watchdogs, peer time-outs, grace periods); a third worker fills it.
def pytest_xdist_auto_num_workers(config):
    return len(os.sched_getaffinity(0)) + 1
