"""`python -m t5lite.plot`: runs' TensorBoard scalars (written by the training loop's own
writer) drawn one panel a tag, the runs overlaid; what each panel shows is what the event
files hold; bad input is one line."""
import json
import struct
import sys

import pytest

import model_helpers as mh
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
    proc = th.run_train(tmp_path / "run", "--gin.LOG_PERIOD=1", *mh.small_flags(), steps=3)
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


# ----------------------------------------------------------------------------- bytes


def _report(path, rows, **more):
    path.write_text(json.dumps({"name": "tiny_b2_h100", "device_kind": "NVIDIA H100",
                                "kernels_by_part": rows, **more}))
    return path


def test_a_step_s_bytes_by_part_drawn_and_labelled_predicted(tmp_path, capsys):
    rows = [{"group": ["MLP", "cublas gemm"], "bytes": 3e9},
            {"group": ["attention scores", "cudnn attention"], "bytes": 4e9},
            {"group": ["MLP", "loop fusion"], "bytes": 2e9},  # the part's kinds add up
            {"group": ["embeddings", "loop fusion"], "bytes": 0}]  # nothing: left out
    report = _report(tmp_path / "step.json", rows)
    out = tmp_path / "bytes.png"
    assert plot.main([f"--bytes_of={report}", f"--out={out}"]) == 0
    width, height = _png_size(out)
    assert width > height > 0
    assert capsys.readouterr().out.splitlines() == [
        "MLP: 5.0 GB", "attention scores: 4.0 GB", f"wrote {out}"]
    from t5lite.tools import bytes_chart
    assert bytes_chart.bytes_by_part(json.loads(report.read_text())) == [
        ("MLP", 5e9), ("attention scores", 4e9)]
    svg = tmp_path / "bytes.svg"  # the title says what it is: a prediction
    assert plot.main([f"--bytes_of={report}", f"--out={svg}"]) == 0
    text = svg.read_text()
    assert "predicted" in text and "not measured" in text and "NVIDIA H100" in text


def test_the_docs_chart_is_the_shipped_report_s_figures():
    """docs/performance.md's figures for T5 large on an H200 are the report's sums."""
    from t5lite.tools import bytes_chart
    report = json.loads((th.REPO / "docs/perf/gpu/aot/large_b32_h200.json").read_text())
    parts = dict(bytes_chart.bytes_by_part(report))
    text = (th.REPO / "docs/performance.md").read_text()
    assert f"MLP {parts['MLP'] / 1e9:.1f}, attention projections " \
           f"{parts['attention projections'] / 1e9:.1f}" in " ".join(text.split())
    assert "(images/large_h200_bytes.png)" in text
    assert (th.REPO / "docs/images/large_h200_bytes.png").stat().st_size > 10_000


@pytest.mark.parametrize("args,needle", [
    ([], "give RUN_DIRs (training curves) or --bytes_of=REPORT.json"),
    (["somerun", "--bytes_of=r.json"], "one of the two"),
    (["--bytes_of=missing.json"], "--bytes_of missing.json: cannot read it"),
    (["--bytes_of=notjson.json"], "--bytes_of notjson.json: not JSON"),
    (["--bytes_of=curves.json"], "has no kernels_by_part: give the JSON of a step compiled "
                                 "for a GPU"),
    (["--bytes_of=badrow.json"], "a kernels_by_part row without a group and bytes"),
    (["--bytes_of=step.json", "--out=chart.txt"], "must end in .png, .svg, .pdf"),
])
def test_bad_bytes_input_is_one_line(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notjson.json").write_text("{oops")
    (tmp_path / "curves.json").write_text(json.dumps({"loss": [1, 2]}))
    _report(tmp_path / "badrow.json", [{"bytes": 3}])
    _report(tmp_path / "step.json", [{"group": ["MLP", "x"], "bytes": 1e9}])
    out = [] if any(a.startswith("--out") for a in args) else ["--out=chart.png"]
    assert plot.main(args + out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not (tmp_path / "chart.png").exists()


def test_a_later_writer_wins_when_the_file_names_tie_to_the_second(tmp_path):
    """Event files are read in the order written: two writers of one process in one second
    differ only in TensorBoard's counter, the 10th after the 9th (not as strings)."""
    for counter, value in ((9, 1.0), (10, 2.0)):
        scratch = tmp_path / f"w{counter}"
        writer = event_files.ScalarWriter(str(scratch))
        writer.write_scalars(1, {"loss": value})
        writer.close()
        (written,) = scratch.iterdir()
        written.rename(tmp_path / f"events.out.tfevents.1796000000.host.4242.{counter}")
    assert event_files.read_scalars(str(tmp_path))["loss"] == [(1, 1.0), (1, 2.0)]
    assert plot.curves.read_curves(str(tmp_path))["loss"] == ([1], [2.0])
