"""`python -m t5lite.plot`: runs' TensorBoard scalars (written by the training loop's own
writer) drawn one panel a tag, the runs overlaid; what each panel shows is what the event
files hold; bad input is one line."""
import struct
import sys

import pytest

import train_helpers as th
from t5lite import plot
from t5lite.runtime import event_files

pytest.importorskip("matplotlib")


def _run(path, points, resumed=()):
    """A MODEL_DIR whose train/ holds `points` ({tag: [(step, value)]}) and, in a second
    event file (a resumed run's), `resumed`."""
    for batch in (points, resumed):
        if not batch:
            continue
        writer = event_files.ScalarWriter(str(path / "train"))
        for step in sorted({s for values in batch.values() for s, _ in values}):
            writer.write_scalars(step, {tag: v for tag, values in batch.items()
                                        for s, v in values if s == step})
        writer.close()
    return path


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return struct.unpack(">II", data[16:24])


def test_two_runs_overlaid_one_panel_a_tag(tmp_path, capsys):
    dense = _run(tmp_path / "dense", {
        "loss_per_token": [(s, 10.0 - s) for s in (1, 2, 3, 4)],
        "accuracy": [(s, 0.1 * s) for s in (1, 2, 3, 4)],
        "seq_per_s": [(s, 50.0) for s in (1, 2, 3, 4)]},
        # resumed from step 2: steps 3-4 trained again, and 5
        resumed={"loss_per_token": [(3, 6.5), (4, 5.5), (5, 5.0)],
                 "accuracy": [(3, 0.35), (4, 0.45), (5, 0.5)],
                 "seq_per_s": [(3, 51.0), (4, 51.0), (5, 51.0)]})
    moe = _run(tmp_path / "moe", {"loss_per_token": [(2, 8.0), (4, 6.0)],
                                  "accuracy": [(2, 0.2), (4, 0.4)],
                                  "seq_per_s": [(2, 40.0), (4, 40.0)]})
    out = tmp_path / "curves.png"
    assert plot.main([str(dense), str(moe), f"--out={out}"]) == 0
    width, height = _png_size(out)
    assert width > 3 * height > 0  # three panels side by side
    shown = plot.curves.draw({"dense": plot.curves.read_curves(str(dense / "train")),
                              "moe": plot.curves.read_curves(str(moe / "train"))},
                             ["loss_per_token"], str(tmp_path / "again.svg"))
    assert shown == {"loss_per_token": {
        "dense": ([1, 2, 3, 4, 5], [9.0, 8.0, 6.5, 5.5, 5.0]),  # the resumed run's values
        "moe": ([2, 4], [8.0, 6.0])}}
    assert (tmp_path / "again.svg").read_text().lstrip().startswith("<?xml")
    out_lines = capsys.readouterr().out.splitlines()
    assert "loss_per_token: dense steps 1-5 (5 points); moe steps 2-4 (2 points)" in out_lines
    assert out_lines[-1] == f"wrote {out}"


def test_a_real_run_and_its_inference_eval_subdir(tmp_path):
    """The scalars a tiny training run writes, read back through the command."""
    proc = th.run_train(tmp_path / "run", "--gin.LOG_PERIOD=1", steps=3)
    assert proc.returncode == 0, th.describe(proc)
    proc = th.run([sys.executable, "-m", "t5lite.plot", str(tmp_path / "run"),
                   f"--out={tmp_path / 'run.png'}", "--tags=loss_per_token,learning_rate"])
    assert proc.returncode == 0, th.describe(proc)
    assert "loss_per_token: run steps 1-3 (3 points)" in proc.stdout
    _png_size(tmp_path / "run.png")


@pytest.mark.parametrize("args,needles", [
    (["{empty}", "--out={tmp}/x.png"], ["{empty}/train holds no TensorBoard event files",
                                        "--subdir"]),
    (["{run}", "--out={tmp}/x.png", "--tags=nope"], ["no run logged nope",
                                                     "the runs logged: loss_per_token"]),
    (["{run}", "--out={tmp}/x.jpeg"], ["--out", "must end in .png, .svg, .pdf"]),
    (["{run}", "--out={tmp}/no/such/dir/x.png", "--tags=loss_per_token"],
     ["cannot write {tmp}/no/such/dir/x.png"]),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, needles):
    run = _run(tmp_path / "run", {"loss_per_token": [(1, 2.0)]})
    (tmp_path / "empty").mkdir()
    fill = {"empty": tmp_path / "empty", "run": run, "tmp": tmp_path}
    status = plot.main([a.format(**fill) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert status in (1, 2) and len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle.format(**fill) in err[0], (needle, err)
