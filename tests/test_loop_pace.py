"""The training loop keeps pace with steps dispatched back to back: it fetches the next
batch while a step runs and reads a logged step's metrics only once the step after it is
queued, so its time per step matches the bench's `async_step_s` (within 5%) even when
every other step is logged and every batch costs the host time.

The batches are made slow on purpose (a host-side wait of 70% of a step, as a real input
pipeline can cost): a loop that waited for each logged step before fetching the next
batch would take the step plus the wait every other step, about 1.35x the bench's
figure (measured: the loop before this change took 1.64x it, logging every step). Both are timed in
one fresh process on one CPU device, in windows of 10 steps (the bench's before and after
the loop's); the fastest window of each is compared, which keeps most of the other tests'
load on the shared CPU out of the comparison."""
import json
import sys

import train_helpers as th

_MEASURE = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[2])
import train_helpers as th
from t5lite import train as train_command
from t5lite.runtime import run as run_module
from t5lite.tools import benchmark, benchmarking

GIN_FILES = ["configs/models/t5_1_1/tiny.gin", "configs/synthetic_pretrain.gin"]
BINDINGS = ["BATCH_SIZE = 4", "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 32}"]
WINDOW, WINDOWS, LOG_PERIOD = 10, 6, 5
delay = [0.0]


class SlowBatches:
    def __init__(self, iterator):
        self.iterator = iterator

    def __next__(self):
        time.sleep(delay[0])
        return next(self.iterator)

    def __iter__(self):
        return self

    def __getattr__(self, name):
        return getattr(self.iterator, name)


make = run_module.make_iterator
run_module.make_iterator = lambda *a, **k: SlowBatches(make(*a, **k))


def bench():
    the_run = benchmarking.build_bench_run(GIN_FILES, BINDINGS)
    return min(benchmark.bench(the_run, steps=WINDOW, warmup=3,
                               async_windows=WINDOWS)["async_window_step_s"])


device_step = bench()
delay[0] = 0.7 * device_step
ahead = bench()
model_dir = sys.argv[1]
steps = WINDOW * (WINDOWS + 1)
argv = [f"--gin_file={f}" for f in GIN_FILES] + [f"--gin.{b.replace(' ', '')}" for b in BINDINGS]
argv += [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}",
         f"--gin.LOG_PERIOD={LOG_PERIOD}", f"--gin.CHECKPOINT_PERIOD={steps}"]
assert train_command.main(argv) == 0
logged = th.scalars(model_dir)["step_time_s"]  # a step's time over each LOG_PERIOD steps
assert [s for s, _ in logged] == list(range(LOG_PERIOD, steps + 1, LOG_PERIOD))
per_log = [t for _, t in logged][WINDOW // LOG_PERIOD:]  # after the first window: compiling
n = WINDOW // LOG_PERIOD
loop = min(statistics.mean(per_log[i:i + n]) for i in range(0, len(per_log), n))
ahead = min(ahead, bench())  # the bench's windows before and after the loop's
print("PACE " + json.dumps({"device_step": device_step, "delay": delay[0], "ahead": ahead,
                            "loop": loop}))
"""


def test_the_loop_keeps_pace_with_steps_dispatched_ahead(tmp_path):
    proc = th.run([sys.executable, "-c", _MEASURE, str(tmp_path / "run"), str(th.REPO / "tests")],
                  cwd=th.REPO)
    assert proc.returncode == 0, th.describe(proc)
    line = [l for l in proc.stdout.splitlines() if l.startswith("PACE ")][-1]
    pace = json.loads(line[len("PACE "):])
    ahead, loop = pace["ahead"], pace["loop"]
    assert loop <= 1.05 * ahead, (f"the loop takes {loop * 1e3:.1f} ms a step, steps "
                                  f"dispatched ahead {ahead * 1e3:.1f} ms ({pace})")
    # and not much faster either (the timing is the loop's own; other tests' load can
    # still make one of two measurements of the same thing a few percent faster)
    assert loop >= 0.85 * ahead, pace
    # the slow batches did cost the host most of a step: without the overlap a step
    # would take device_step + delay
    assert pace["delay"] > 0.6 * pace["device_step"] and ahead < pace["device_step"] + pace["delay"]
