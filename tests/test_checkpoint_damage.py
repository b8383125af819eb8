"""Damaged checkpoints (hardening): a latest checkpoint that does not restore is skipped
for the newest one that does, named in a warning and kept aside (never deleted); when
none restores the run ends in one line and moves nothing; a deletion by retention that a
crash cut short is finished, not reported as an uncommitted save."""
import glob
import os
import shutil

import pytest

import model_helpers as mh
import train_helpers as th


def _damage(model_dir, step):
    """Cut the largest array file of a checkpoint short (a disk or copy failure)."""
    files = glob.glob(str(model_dir / "checkpoints" / str(step) / "state" / "**" / "d" / "*"),
                      recursive=True)
    with open(max(files, key=os.path.getsize), "r+b") as f:
        f.truncate(100)


# The tiny T5 cut to one layer a side and 512 ids: what is checked is how checkpoints are
# chosen and kept, not the model (each run compiles and saves less).
TINY = mh.small_flags()


def _train(model_dir, steps, *extra):
    return th.run_train(model_dir, *TINY, "--gin.CHECKPOINT_PERIOD=2",
                        "--gin.KEEP_CHECKPOINTS=None", "--gin.LOG_PERIOD=1", *extra,
                        steps=steps)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run to step 4 (checkpoints 2 and 4), trained once; each test damages a copy."""
    model_dir = tmp_path_factory.mktemp("damage") / "run"
    proc = _train(model_dir, 4)
    assert proc.returncode == 0, th.describe(proc)
    return model_dir


@pytest.fixture
def model_dir(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def test_damaged_latest_falls_back_to_the_previous_good_one(model_dir):
    _damage(model_dir, 4)
    proc = _train(model_dir, 6)
    assert proc.returncode == 0, th.describe(proc)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    # a run's own lines (about 20: the cache, start, compile, 4 steps, saves, done), no
    # repeated warnings or stacks from the damaged step
    assert len(proc.stderr.splitlines()) < 26, proc.stderr[-2000:]
    warning = [l for l in proc.stderr.splitlines() if "skipped damaged checkpoint 4" in l]
    assert len(warning) == 1 and "kept as 4.damaged-" in warning[0], proc.stderr
    assert "start: resume:2 at step 2" in proc.stderr
    assert th.logged_steps(proc.stderr) == [3, 4, 5, 6]
    kept = [p.name for p in (model_dir / "checkpoints").iterdir() if ".damaged-" in p.name]
    assert len(kept) == 1 and kept[0].startswith("4.damaged-")
    assert th.complete_steps(model_dir) == [2, 4, 6]   # step 4 written again, afresh


def test_no_restorable_checkpoint_is_one_line_and_moves_nothing(model_dir):
    _damage(model_dir, 2)
    _damage(model_dir, 4)
    before = sorted(os.listdir(model_dir / "checkpoints"))
    proc = _train(model_dir, 6)
    line = th.assert_one_error(proc, "no checkpoint in", "restores", "step 4", "step 2",
                               "nothing was moved or deleted")
    assert proc.returncode == 1, line
    assert sorted(os.listdir(model_dir / "checkpoints")) == before


def test_retention_cut_short_by_a_crash_is_finished_quietly(model_dir):
    # retention had started deleting step 2: its commit markers (the marker files and the
    # commit time in its metadata) are gone, some data remains
    step2 = model_dir / "checkpoints" / "2"
    for marker in [*step2.rglob("commit_success.txt"), step2 / "_CHECKPOINT_METADATA"]:
        marker.unlink()
    proc = _train(model_dir, 6)
    assert proc.returncode == 0, th.describe(proc)
    assert "never committed" not in proc.stderr
    assert "start: resume:4 at step 4" in proc.stderr
    names = os.listdir(model_dir / "checkpoints")
    assert not [n for n in names if ".incomplete-" in n], names
    assert th.complete_steps(model_dir) == [4, 6]
