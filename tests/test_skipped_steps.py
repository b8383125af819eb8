"""Steps to skip, not runs to lose (issue 47, part 3): the optimizer wrapper alone
(`optim/skipping.py`: nothing applied and the inner state kept on a non-finite or too
large gradient, counters right), the loop's part alone (`SkipWatch`: a line per skipped
step, a stop after MAX_SKIPPED_IN_A_ROW), the settings' lines, and tiny T5 runs with
INJECT_BAD_GRADIENT: skipped steps keep the state bit for bit, TensorBoard counts them, a
resume with skips in the history is bit-exact, N in a row stop the run, and with the
setting off (the default) the NaN guard stops the run as before."""
from __future__ import annotations

import logging
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import train_helpers as th
from t5lite import train
from t5lite.errors import ConfigError, TrainingError
from t5lite.optim import skipping
from t5lite.runtime.skipped_steps import SkipSettings, SkipWatch


# ----------------------------------------------------------------------------- the wrapper
@pytest.mark.parametrize("bad,bound", [(None, None), (math.nan, None), (math.inf, None),
                                       (None, 0.5)])
def test_the_wrapper_applies_nothing_on_a_bad_gradient_and_keeps_its_state(bad, bound):
    params = {"w": jnp.arange(4.0), "b": jnp.ones(2)}
    inner = optax.adamw(0.1)
    tx = skipping.skip_bad_steps(inner, bound)
    state = tx.init(params)
    good = {"w": jnp.full(4, 0.1), "b": jnp.full(2, 0.2)}  # norm 0.245
    _, state = tx.update(good, state, params)  # one applied step first
    grads = {"w": jnp.full(4, 1.0), "b": jnp.full(2, 1.0 if bad is None else bad)}  # norm 2.45
    updates, new = tx.update(grads, state, params)
    skipped = bad is not None or bound is not None
    assert bool(new.applied) is (not skipped) and bool(skipping.applied(new)) is (not skipped)
    assert int(new.total) == int(skipped) and int(new.in_a_row) == int(skipped)
    want, want_inner = inner.update(grads, state.inner, params)
    if skipped:
        jax.tree.map(lambda u: np.testing.assert_array_equal(u, 0.0), updates)
        jax.tree.map(np.testing.assert_array_equal, new.inner, state.inner)
    else:
        jax.tree.map(np.testing.assert_array_equal, updates, want)
        jax.tree.map(np.testing.assert_array_equal, new.inner, want_inner)
    metrics = skipping.step_metrics(new)
    assert float(metrics["skipped"]) == float(skipped)
    assert skipping.step_metrics(state.inner) == {} and skipping.applied(state.inner) is None
    _, after = tx.update(good, new, params)  # an applied step ends the run of skips
    assert int(after.in_a_row) == 0 and int(after.total) == int(skipped)


@pytest.mark.parametrize("changes,needle", [
    (dict(enabled="yes"), "SKIP_BAD_STEPS"),
    (dict(enabled=True, max_grad_norm=0.0), "MAX_GRAD_NORM_TO_APPLY must be a positive"),
    (dict(enabled=True, max_grad_norm=math.inf), "MAX_GRAD_NORM_TO_APPLY must be a positive"),
    (dict(max_grad_norm=10.0), "set SKIP_BAD_STEPS=True"),
    (dict(enabled=True, max_in_a_row=0), "MAX_SKIPPED_IN_A_ROW"),
    (dict(inject=[2, 0]), "INJECT_BAD_GRADIENT")])
def test_bad_skip_settings_are_one_line(changes, needle):
    with pytest.raises(ConfigError) as e:
        SkipSettings(**changes)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- SkipWatch
class Ckpt:
    def __init__(self, events, latest):
        self.events, self.latest = events, latest

    def wait(self):
        self.events.append("wait")

    def latest_step(self):
        return self.latest


def _metrics(skipped, in_a_row, total):
    return {"skipped": np.float32(skipped), "skipped_in_a_row": np.float32(in_a_row),
            "skipped_steps": np.float32(total), "loss": np.float32(math.nan if skipped else 2.0),
            "grad_norm": np.float32(math.inf if skipped else 1.0)}


def test_the_watch_reads_one_step_late_says_each_skip_and_stops_after_n_in_a_row(
        caplog, tmp_path):
    events = []
    watch = SkipWatch(SkipSettings(enabled=True, max_in_a_row=2), Ckpt(events, 4), tmp_path)
    caplog.set_level(logging.WARNING)
    watch.after_step(5, _metrics(1, 1, 1), ends=False)
    assert not caplog.records  # step 5 read only once step 6 is queued
    watch.after_step(6, _metrics(0, 0, 1), ends=False)
    assert [r.getMessage() for r in caplog.records] == [
        "step 5 skipped (loss nan, gradient norm inf): parameters and optimizer state kept; "
        "1 in a row, 1 in all"]
    watch.after_step(7, _metrics(1, 1, 2), ends=False)
    watch.after_step(8, _metrics(1, 2, 3), ends=False)
    assert len(caplog.records) == 2 and events == []
    with pytest.raises(TrainingError) as e:
        watch.after_step(9, _metrics(0, 0, 3), ends=True)
    assert str(e.value).startswith("2 steps in a row skipped up to step 8 "
                                   "(MAX_SKIPPED_IN_A_ROW=2;")
    assert f"the last checkpoint is step 4 in {tmp_path}" in str(e.value) and events == ["wait"]


def test_the_watch_reads_the_last_step_at_once(caplog, tmp_path):
    watch = SkipWatch(SkipSettings(enabled=True), Ckpt([], None), tmp_path)
    caplog.set_level(logging.WARNING)
    watch.after_step(3, _metrics(1, 1, 1), ends=True)
    assert "step 3 skipped" in caplog.records[0].getMessage() and watch.pending is None


# ----------------------------------------------------------------------------- runs
# The tiny T5 cut to one layer a side and a 512-entry vocabulary (the synthetic task draws
# its tokens below it): skipping does not depend on either, and the real vocabulary's
# embedding and logits dominated each step and each of the saves.
COMMON = [f"--gin_file={th.SYNTHETIC}", "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
          "--gin.T5Config.vocab_size=512", "--gin.T5Config.num_encoder_layers=1",
          "--gin.T5Config.num_decoder_layers=1", "--gin.LOG_PERIOD=1",
          "--gin.CHECKPOINT_PERIOD=1", "--gin.KEEP_CHECKPOINTS=None",
          "--gin.RANDOM_SEED=0", "--gin.ACTIVATION_DTYPE='float32'", th.SYNC_CHECKPOINTS,
          "--gin.train.optimizer=@adamw()", "--gin.adamw.learning_rate=1e-2"]


def _train(run, steps, *extra):
    return train.main([f"--gin_file={th.MODEL_FILES['t5']}"] + COMMON + [
        f'--gin.MODEL_DIR="{run}"', f"--gin.TRAIN_STEPS={steps}", *extra])


def _errors(capsys):
    return [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]


def test_skipped_steps_keep_the_state_count_and_resume_bit_exact(tmp_path, capsys):
    skip = ["--gin.SKIP_BAD_STEPS=True", "--gin.INJECT_BAD_GRADIENT=[2, 4]"]
    a = tmp_path / "a"
    assert _train(a, 5, *skip) == 0
    said = [l for l in capsys.readouterr().err.splitlines() if " skipped (" in l]
    assert len(said) == 2 and "WARNING step 2 skipped (loss " in said[0], said
    assert said[0].endswith("gradient norm nan): parameters and optimizer state kept; 1 in a "
                            "row, 1 in all"), said
    assert "WARNING step 4 skipped (" in said[1] and said[1].endswith("1 in a row, 2 in all")
    tb = th.scalars(a)
    assert [v for _, v in sorted(tb["skipped_steps"])] == [0, 1, 1, 2, 2]
    assert [v for _, v in sorted(tb["skipped"])] == [0, 1, 0, 1, 0]
    states = {s: th.flat(th.load_state(a, s)) for s in (1, 2, 3, 4)}
    for before, skipped in ((1, 2), (3, 4)):  # a skipped step changes nothing but its count
        changed = [k for k in states[before]
                   if not np.array_equal(states[before][k], states[skipped][k])]
        assert sorted(changed) == ["['opt_state']['applied']", "['opt_state']['in_a_row']",
                                   "['opt_state']['total']", "['step']"], changed
    assert any(not np.array_equal(states[2][k], states[3][k])
               for k in states[2] if "['params']" in k)  # an applied step moves them
    # resumed from step 3 (skips before it and after it): the same step 5, bit for bit
    b = tmp_path / "b"
    shutil.copytree(a, b)
    for step in (4, 5):
        shutil.rmtree(th.checkpoints_dir(b) / str(step))
    assert _train(b, 5, *skip, "--gin.CHECKPOINT_PERIOD=5") == 0  # step 5 alone is read
    first, second = th.flat(th.load_state(a, 5)), th.flat(th.load_state(b, 5))
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)
    assert int(second["['opt_state']['total']"]) == 2
    # n in a row stop the run; with the setting off the NaN guard stops it as before.
    # (The stopped run saves step 3 alone, the one its line names: its saves of steps 1
    # and 2 would be read by nothing.)
    capsys.readouterr()
    assert _train(tmp_path / "c", 5, "--gin.SKIP_BAD_STEPS=True", "--gin.MAX_SKIPPED_IN_A_ROW=2",
                  "--gin.INJECT_BAD_GRADIENT=[2, 3]", "--gin.CHECKPOINT_PERIOD=3") == 1
    lines = _errors(capsys)
    assert len(lines) == 1 and "2 steps in a row skipped up to step 3" in lines[0], lines
    assert "the last checkpoint is step 3" in lines[0], lines
    assert th.complete_steps(tmp_path / "c") == [3]
    assert _train(tmp_path / "d", 5, "--gin.INJECT_BAD_GRADIENT=[2]") == 1
    lines = _errors(capsys)
    assert len(lines) == 1 and "not finite at step 2" in lines[0], lines
    assert th.complete_steps(tmp_path / "d") == [1]
