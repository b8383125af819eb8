"""The training loop keeps pace with steps dispatched back to back: it fetches the next
batch while a step runs and reads a logged step's metrics only once the step after it is
queued (MaxText reads its metrics one step late too). Only a step that is saved or
evaluated is read at once: those wait for the step anyway.

Proven by the order of what the loop asks for, not by timing it (speed lives in the
bench: `python -m t5lite.bench` reports `async_step_s`, the pace of steps dispatched
ahead, and docs/performance.md compares the loop with it). Every train step call, batch
fetch and metrics read of a real run is recorded in order; a loop that waited for a
step's metrics before fetching the next batch, or read a logged step before queuing the
next one, puts them in another order."""
import dataclasses

import model_helpers as mh
import train_helpers as th
from t5lite import train as train_command
from t5lite.runtime import loop, step_duties

STEPS, LOG_PERIOD, CHECKPOINT_PERIOD = 12, 5, 8


def _recorded_run(monkeypatch, tmp_path):
    events = []
    build = loop.build_run

    def recording_build_run(**kwargs):
        run = build(**kwargs)
        step, next_batch = run.step_fns.train_step, run.next_batch

        def train_step(state, batch):
            events.append(("step", len([e for e in events if e[0] == "step"]) + 1))
            return step(state, batch)

        def fetch():
            events.append(("batch",))
            return next_batch()

        run.step_fns = dataclasses.replace(run.step_fns, train_step=train_step)
        run.next_batch = fetch
        return run

    read = step_duties.Reports.read

    def recording_read(self, step, step_metrics):
        events.append(("read", step))
        return read(self, step, step_metrics)

    monkeypatch.setattr(loop, "build_run", recording_build_run)
    monkeypatch.setattr(step_duties.Reports, "read", recording_read)
    model_dir = tmp_path / "run"
    argv = ["--gin_file=configs/models/t5_1_1/tiny.gin", "--gin_file=configs/synthetic_pretrain.gin",
            "--gin.BATCH_SIZE=8", "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
            f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={STEPS}",
            f"--gin.LOG_PERIOD={LOG_PERIOD}", f"--gin.CHECKPOINT_PERIOD={CHECKPOINT_PERIOD}",
            "--gin.CheckpointSettings.async_save=False",
            *mh.small_flags()]  # the order is what counts, not the model: T5 cut small
    assert train_command.main(argv) == 0
    return events, model_dir


def test_the_next_batch_is_fetched_and_metrics_read_while_the_next_step_runs(monkeypatch,
                                                                                 tmp_path):
    events, model_dir = _recorded_run(monkeypatch, tmp_path)
    at = {e: i for i, e in enumerate(events)}
    steps = [i for i, e in enumerate(events) if e[0] == "step"]
    assert len(steps) == STEPS, events
    saved = {CHECKPOINT_PERIOD, STEPS}
    for n in range(1, STEPS):
        between = events[steps[n - 1] + 1:steps[n]]  # after step n is queued, before n + 1
        assert ("batch",) in between, (n, events)  # the batch for step n + 1
        if n not in saved:  # fetched before anything waits for step n
            assert between[0] == ("batch",), (n, events)
    logged = [n for n in range(LOG_PERIOD, STEPS + 1, LOG_PERIOD)]
    assert logged == [5, 10]
    for n in logged:  # neither saved: read once step n + 1 is queued
        assert at[("read", n)] > at[("step", n + 1)], (n, events)
    for n in saved:  # a saved step is read at once: nothing non-finite is saved
        assert ("read", n) in at and (n == STEPS or at[("read", n)] < at[("step", n + 1)]), events
    reads = [e[1] for e in events if e[0] == "read"]
    assert sorted(reads) == sorted(set(logged) | saved), events  # no other step waited on
    # and the late reads were logged at their own step
    assert [s for s, _ in th.scalars(model_dir)["loss"]] == logged + [STEPS]
