"""A disk that fills (issue: faults a long run meets): every writer ends in one `error:`
line (no space left, which directory, how much it needs, how much is free), what was
saved before is untouched and restorable, nothing half-written counts, and the same
command resumes once there is room.

The end-to-end cases run `t5lite.train` (the tiny T5 cut to one layer a side and a
512-entry vocabulary: a checkpoint of ~1.1 MB) on a real small filesystem (a tmpfs,
mounted where the tests run as root, as in CI); the in-process cases inject ENOSPC at the
writer and run everywhere.
"""
import errno
import os
import shutil
import subprocess
import uuid

import jax.numpy as jnp
import numpy as np
import pytest

import model_helpers as mh
import train_helpers as th
from t5lite.errors import DiskFullError, OutputWriteError
from t5lite.runtime.process import disk_space
from t5lite.runtime.checkpointing.checkpoints import Checkpointer
from t5lite.runtime.event_files import ScalarWriter, read_scalars
from t5lite.optim.train_state import TrainState

MB = 1 << 20
TENSORSTORE_FULL = ('RESOURCE_EXHAUSTED: Error writing "params.x/0" in OCDBT database: Failed '
                    'to write 2932736 bytes to file 4: No space left on device '
                    "[os_error_code='28']")


# ----------------------------------------------------------------------------- a small disk


class SmallDisk:
    """A tmpfs of `size` bytes at `path`; `resize` changes its size keeping its files."""

    def __init__(self, path, size):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._mount(f"size={int(size)}")

    def _mount(self, options, remount=False):
        cmd = ["mount", "-t", "tmpfs", "-o", ("remount," if remount else "") + options,
               "tmpfs", str(self.path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise PermissionError(proc.stderr.strip())

    def resize(self, size):
        self._mount(f"size={int(size)}", remount=True)

    def used(self):
        return shutil.disk_usage(self.path).used

    def unmount(self):
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def _tmpfs_permitted() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def small_disk(tmp_path):
    """A factory of small filesystems (tmpfs), unmounted after the test."""
    if not _tmpfs_permitted():
        pytest.skip("mounting a tmpfs needs root (CI runs as root); the injected-ENOSPC "
                    "tests below cover the same code paths")
    disks = []

    def make(size, name="disk"):
        disks.append(SmallDisk(tmp_path / name, size))
        return disks[-1]

    yield make
    for disk in disks:
        disk.unmount()


def _dir_size(path):
    return sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(path) for n in ns)


def _assert_clean_failure(proc, *needles):
    """One error line with the needles, exit 1, and none of Orbax's or TensorStore's
    background reports."""
    line = th.assert_one_error(proc, "no space left on the disk of", *needles)
    assert proc.returncode == 1, th.describe(proc)
    for noise in ("Exception ignored", "Event loop is closed", "RESOURCE_EXHAUSTED",
                  "Exception in thread", " ERROR "):
        assert noise not in proc.stderr, th.describe(proc)
    return line


def _leftovers(model_dir):
    """What in checkpoints/ is neither a complete step nor the run's own files."""
    return sorted(p for p in os.listdir(model_dir / "checkpoints") if not p.isdigit())


# ----------------------------------------------------------------------------- end to end


SMALL_MODEL = tuple(mh.small_flags())


def _train_command(model_dir, steps, **kw):
    return th.train_command(model_dir, *SMALL_MODEL, "--gin.CHECKPOINT_PERIOD=2",
                            "--gin.KEEP_CHECKPOINTS=None", "--gin.LOG_PERIOD=1", steps=steps,
                            **kw)


def _train(model_dir, steps, **kw):
    return th.run(_train_command(model_dir, steps, **kw))


def test_a_disk_that_fills_during_a_save_then_before_one_then_frees(small_disk, tmp_path):
    """Checkpoints 2 and 4 fit. Then the disk is left room for most of a checkpoint: the
    save of 6 starts (the room check passes) and fails half-way (asynchronous save);
    then too little room: the save of 6 is refused before writing. Each: one line, exit
    1, checkpoints 2 and 4 untouched and restorable, nothing half-written left. With
    room again the same command resumes from 4 and ends where an uninterrupted run
    ends."""
    disk = small_disk(400 * MB)
    model_dir = disk.path / "run"
    first = _train(model_dir, 4)
    assert first.returncode == 0, th.describe(first)
    size = _dir_size(model_dir / "checkpoints" / "4")

    disk.resize(disk.used() + 0.95 * size)  # the check passes, the write does not fit
    mid_save = _train(model_dir, 8, sync_checkpoints=False)
    line = _assert_clean_failure(mid_save, f"{model_dir / 'checkpoints'}", "checkpoint 6",
                                 "is free", "checkpoints 2, 4 in", "resume from step 4")
    assert th.logged_steps(mid_save.stderr)[-1] >= 6, line
    assert th.complete_steps(model_dir) == [2, 4] and _leftovers(model_dir) == []
    for step in (2, 4):
        assert int(th.load_state(model_dir, step)["step"]) == step

    disk.resize(disk.used() + 0.5 * size)  # too little: refused before writing a byte
    before = _train(model_dir, 8)
    _assert_clean_failure(before, "checkpoint 6", "it needs about",
                          "the size of checkpoint 4", "checkpoints 2, 4 in")
    assert th.complete_steps(model_dir) == [2, 4] and _leftovers(model_dir) == []

    disk.resize(400 * MB)
    reference = tmp_path / "reference"  # the resume and an uninterrupted run, one interpreter
    again, whole = th.run_mains([_train_command(d, 8)[3:] for d in (model_dir, reference)])
    assert again.returncode == 0, th.describe(again)
    assert "start: resume:4 at step 4" in again.stderr
    assert th.complete_steps(model_dir) == [2, 4, 6, 8]
    assert whole.returncode == 0, th.describe(whole)
    th.assert_trees_equal(th.load_state(model_dir, 8), th.load_state(reference, 8),
                          "resumed after a full disk vs uninterrupted")


def test_the_first_save_on_a_full_disk(small_disk):
    """No checkpoint yet: the line says so and gives the arrays' size as the bound."""
    disk = small_disk(512 * 1024)  # room for config.gin and the events, not the arrays
    model_dir = disk.path / "run"
    proc = _train(model_dir, 4, sync_checkpoints=True)
    _assert_clean_failure(proc, "checkpoint 2", "its arrays uncompressed",
                          "no checkpoint was saved")
    assert th.complete_steps(model_dir) == [] and _leftovers(model_dir) == []


def test_tensorboard_events_on_a_full_disk(small_disk):
    """The event file is what fills the disk: one line naming the events' directory."""
    disk = small_disk(1 * MB)
    filler = disk.path / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(disk.path).free - 28 * 1024))
    model_dir = disk.path / "run"
    proc = th.run_train(model_dir, *SMALL_MODEL, "--gin.CHECKPOINT_PERIOD=1000",
                        "--gin.LOG_PERIOD=1", steps=400)
    _assert_clean_failure(proc, f"{model_dir / 'train'}", "for the TensorBoard events")
    assert th.logged_steps(proc.stderr)[-1] < 400
    assert read_scalars(str(model_dir / "train"))["loss"]  # what was written still reads


# ----------------------------------------------------------------------------- in process



def test_a_vocabulary_written_onto_a_full_disk_keeps_the_old_one(small_disk, tmp_path,
                                                                  capsys):
    """`t5lite.vocab --output` over a vocabulary a run uses, on a disk with no room for
    the new one: one line, status 1, and the old file byte for byte (before: truncated)."""
    from t5lite import vocab
    from t5lite.data.files import demo_corpus
    text = demo_corpus.write_text(str(tmp_path / "notes.txt"), lines=800, seed=7)
    disk = small_disk(512 * 1024)  # the new model takes 244 kB
    old = disk.path / "spm.model"
    old.write_bytes(b"the vocabulary a run uses " * 4000)  # 104 kB
    (disk.path / "filler").write_bytes(b"x" * (300 * 1024))
    before = old.read_bytes()
    rc = vocab.main([f"--input={text}", "--vocab_size=300", f"--output={old}"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert th.error_lines(err) == [l for l in err.splitlines() if l], err
    assert f"no space left on the disk of {disk.path} for the vocabulary" in err, err
    assert f"{old} is as it was" in err, err
    assert old.read_bytes() == before
    assert sorted(os.listdir(disk.path)) == ["filler", "spm.model"]
    os.remove(disk.path / "filler")  # room again: the same command writes it
    assert vocab.main([f"--input={text}", "--vocab_size=300", f"--output={old}"]) == 0
    assert old.read_bytes() != before

def _state(step, n=4096):
    rng = np.random.RandomState(step)
    params = {"params": {"w": jnp.asarray(rng.randn(n), jnp.float32)}}
    return TrainState(step=jnp.asarray(step, jnp.int32), params=params, fp8={},
                      opt_state={"m": jnp.zeros((n,), jnp.float32)}, rng=jnp.zeros((2,), jnp.uint32))


def _abstract(state):
    import jax
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=x.sharding), state)


@pytest.mark.parametrize("async_save", [False, True])
def test_checkpoint_room_check_refuses_before_writing(tmp_path, monkeypatch, async_save):
    ckpt = Checkpointer(tmp_path / "run", keep=None, async_save=async_save)
    ckpt.save(1, _state(1))
    ckpt.wait()
    monkeypatch.setattr(disk_space, "free_bytes", lambda path: 900)
    with pytest.raises(DiskFullError) as e:
        ckpt.save(2, _state(2))
    assert "checkpoint 2" in str(e.value) and "the size of checkpoint 1" in str(e.value)
    assert "900 B is free" in str(e.value)
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["1"]
    monkeypatch.undo()
    ckpt.save(3, _state(3))  # room again: the same Checkpointer goes on
    ckpt.close()
    assert ckpt.all_steps() == [1, 3]


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   ValueError(TENSORSTORE_FULL), OSError(errno.EIO, "I/O error")])
def test_a_save_that_fails_half_way_leaves_nothing(tmp_path, monkeypatch, async_save, error):
    """Injected at the writer (Orbax's array writer): the step's temporary directory is
    removed, the error is one line (DiskFullError for a full disk, OutputWriteError for
    any other), a later wait / close raises nothing more, and the checkpoint before
    restores."""
    from orbax.checkpoint._src.serialization import serialization
    ckpt = Checkpointer(tmp_path / "run", keep=None, async_save=async_save)
    ckpt.save(1, _state(1))
    ckpt.wait()
    real = serialization.async_serialize_from_host

    async def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(serialization, "async_serialize_from_host", failing)
    expected = DiskFullError if disk_space.is_disk_full(error) else OutputWriteError
    with pytest.raises(expected) as e:
        ckpt.save(2, _state(2))
        ckpt.wait()
    assert "checkpoint 2" in str(e.value) and "\n" not in str(e.value)
    if expected is DiskFullError:
        assert "up to" not in str(e.value) and "the size of checkpoint 1" in str(e.value)
    monkeypatch.setattr(serialization, "async_serialize_from_host", real)
    ckpt.wait()
    ckpt.close()
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["1"]
    again = Checkpointer(tmp_path / "run", keep=None, async_save=False)
    state, _ = again.restore(None, _abstract(_state(1)))
    np.testing.assert_array_equal(state.params["params"]["w"], _state(1).params["params"]["w"])
    again.close()


def test_event_writer_thread_failure_is_one_error(tmp_path, monkeypatch, capfd):
    """TensorBoard writes in a thread of its own: its ENOSPC comes back as one
    DiskFullError at the next call, and the thread's own traceback is not printed."""
    from tensorboard.summary.writer import record_writer
    writer = ScalarWriter(str(tmp_path / "train"))
    writer.write_scalars(1, {"loss": 1.0})
    writer.flush()

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    with pytest.raises(DiskFullError) as e:
        writer.write_scalars(2, {"loss": 2.0})
        writer.flush()
    assert "for the TensorBoard events" in str(e.value) and str(tmp_path / "train") in str(e.value)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    monkeypatch.undo()
    writer.close()  # the failure was reported once; closing does not report it again
    assert read_scalars(str(tmp_path / "train"))["loss"] == [(1, 1.0)]


def test_replace_file_keeps_the_old_file_on_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    disk_space.replace_file(path, "old\n")
    real_replace = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(DiskFullError) as e:
        disk_space.replace_file(path, "new\n")
    assert "metrics.json" in str(e.value) and str(tmp_path) in str(e.value)
    monkeypatch.setattr(os, "replace", real_replace)
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["metrics.json"]


def test_infer_output_on_a_full_disk_says_what_is_kept(tmp_path):
    from t5lite.inference import predict
    out = tmp_path / predict.OUTPUT_FILE
    out.write_text('{"a": 1}\n{"a": 2}\n{"a"')
    with pytest.raises(DiskFullError) as e:
        with predict._appending(out, 2):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert f"the 2 complete lines in {out} are kept" in str(e.value)
    assert predict.complete_lines(out) == 2  # the rerun cuts the partial line off


def test_is_disk_full_and_human():
    assert disk_space.is_disk_full(OSError(errno.ENOSPC, "x"))
    assert disk_space.is_disk_full(OSError(errno.EDQUOT, "x"))
    assert disk_space.is_disk_full(ValueError(TENSORSTORE_FULL))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert disk_space.is_disk_full(outer)
    assert not disk_space.is_disk_full(OSError(errno.EIO, "I/O error"))
    assert not disk_space.is_disk_full(ValueError("RESOURCE_EXHAUSTED: out of memory"))
    assert [disk_space.human(n) for n in (0, 999, 24_617_348, 3.2e9)] == \
        ["0 B", "999 B", "24.6 MB", "3.2 GB"]
    assert disk_space.free_bytes("gs://bucket/run") is None
    assert disk_space.free_bytes(f"/tmp/{uuid.uuid4()}/not/yet") is not None
