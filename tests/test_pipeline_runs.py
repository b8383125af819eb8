"""Pipelined runs through `python -m t5lite.train` on 8 CPU devices: a tiny GPT of 8 layers
on [stage=4, fsdp=2] (a circular pipeline: 2 repeats) trains with the unpipelined run's
loss curve; its checkpoint resumes on stage=4 bit-exact, on stage=1 and stage=2, and one
saved on stage=1 resumes on stage=4, each to the uninterrupted run's parameters. Bad pipeline settings are
one `error:` line each.

The one-process runs, the bad settings' too, share one process (`train.main`, as the
command runs it; the `runs` fixture), so the imports are paid once; each still compiles its
own step."""
import json
import sys

import numpy as np
import pytest

import train_helpers as th

GPT8 = ["--gin.DecoderConfig.num_layers=8", "--gin.DecoderConfig.vocab_size=256",
        "--gin.ACTIVATION_DTYPE='float32'", "--gin.TASK_FEATURE_LENGTHS={'targets': 16}",
        "--gin.BATCH_SIZE=16", "--gin.LOG_PERIOD=1", "--gin.CHECKPOINT_PERIOD=2",
        "--gin.SCAN_LAYERS=True"]
PIPELINED = ["--gin.PIPELINE_MICROBATCHES=4", "--gin.PIPELINE_REPEATS=2"]
# Parameters after 4 Adafactor steps, relative to each array's largest value (measured:
# 3e-5). Not the key projection's bias: softmax does not see it, so its gradient is
# rounding noise, which Adafactor's normalized update turns into steps either way.
PARAM_RTOL = 1e-4
NOISE_ONLY = "['self_attention']['key']['bias']"
STAGES = {1: "--gin.ICI_MESH_SHAPE=[1, 8, 1]", 2: "--gin.ICI_MESH_SHAPE=[1, 4, 1, 1, 2]",
          4: "--gin.ICI_MESH_SHAPE=[1, 2, 1, 1, 4]"}

_RUNS = r"""
import contextlib, io, json, shutil, sys
from pathlib import Path
from t5lite import train
from t5lite.config import command
from t5lite.errors import ConfigError
for op in json.loads(sys.argv[1]):
    if op[0] == "copy":  # a run's MODEL_DIR as it stood at step `keep`
        _, src, dst, keep = op
        shutil.copytree(src, dst)
        for step in Path(dst, "checkpoints").iterdir():
            if step.name.isdigit() and int(step.name) > keep:
                shutil.rmtree(step)
        continue
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = train.main(op[1])
        except ConfigError as e:  # what command.run_main makes of it
            print(f"error: {command.one_line(e)}", file=sys.stderr)
            status = 2
        except BaseException as e:
            status = f"{type(e).__name__}: {e}"
    print(json.dumps([op[2], status, err.getvalue()[-3000:]]), flush=True)
"""


def _run_all(ops):
    proc = th.run([sys.executable, "-c", _RUNS, json.dumps(ops)], devices=8, cwd=th.REPO,
                  timeout=900)
    assert proc.returncode == 0, th.describe(proc)
    return {name: (status, err) for name, status, err in
            (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))}


def _train(name, model_dir, steps, stages, *extra):
    argv = th.train_command(model_dir, *GPT8, STAGES[stages], *extra, model="gpt",
                            steps=steps)[3:]
    return ["train", argv, name]


def _params(model_dir, step):
    """The parameters of checkpoint `step`, the stacked layers as one [layers] axis."""
    from t5lite.models import layouts
    params = th.load_state(model_dir, step)["params"]["params"]
    return th.flat(layouts.join_repeats(params))


# Bad pipeline settings: (the line's needle, the flags).
BAD_CASES = {
    "layers": ("12 layers do not split into 4 stages x 2 repeat(s)",
               [STAGES[4], "--gin.PIPELINE_MICROBATCHES=4", "--gin.PIPELINE_REPEATS=2",
                "--gin.DecoderConfig.num_layers=12"]),
    "repeats": ("PIPELINE_REPEATS=3 must divide the 8 layers",
                [STAGES[4], "--gin.PIPELINE_MICROBATCHES=4", "--gin.PIPELINE_REPEATS=3"]),
    "few": ("PIPELINE_MICROBATCHES=2 is fewer than the 4 pipeline stages",
            [STAGES[4], "--gin.PIPELINE_MICROBATCHES=2"]),
    "unset": ("set PIPELINE_MICROBATCHES", [STAGES[4]]),
    "batch": ("a pipeline microbatch of 3 examples (24 / PIPELINE_MICROBATCHES=8) does "
              "not divide over the 2 data shards",
              [STAGES[4], "--gin.PIPELINE_MICROBATCHES=8", "--gin.BATCH_SIZE=24"]),
    "multiple": ("PIPELINE_MICROBATCHES=6 is not a multiple of the 4 pipeline stages",
                 [STAGES[4], "--gin.PIPELINE_MICROBATCHES=6", "--gin.BATCH_SIZE=48"]),
    "mesh": ("has 6 devices but 8 are present", ["--gin.ICI_MESH_SHAPE=[1, 2, 1, 1, 3]"]),
    "t5": ("does not run as a pipeline", [STAGES[4]]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every one-process run of the file in one interpreter: the pipelined runs and their
    resumes, then the BAD_CASES. (MODEL_DIRs by name, {name: (status, stderr's end)})."""
    root = tmp_path_factory.mktemp("pipeline")
    d = {k: root / k for k in ("plain", "piped", "again", "on1", "on2", "back", *BAD_CASES)}
    ops = [_train("plain", d["plain"], 4, 1),
           _train("piped", d["piped"], 4, 4, *PIPELINED),
           ["copy", str(d["piped"]), str(d["again"]), 2],
           _train("again", d["again"], 4, 4, *PIPELINED),  # the same stages: bit-exact
           ["copy", str(d["piped"]), str(d["on1"]), 2],
           _train("on1", d["on1"], 3, 1, *PIPELINED),      # saved on stage=4, on to step 3
           ["copy", str(d["piped"]), str(d["on2"]), 2],
           _train("on2", d["on2"], 4, 2, *PIPELINED),
           ["copy", str(d["on1"]), str(d["back"]), 3],
           _train("back", d["back"], 4, 4, *PIPELINED)]    # saved on stage=1, on stage=4
    for name, (_, extra) in BAD_CASES.items():
        model = "t5" if name == "t5" else "gpt"
        flags = [f for f in GPT8 if model == "gpt" or "DecoderConfig" not in f and
                 "TASK_FEATURE" not in f]
        argv = th.train_command(d[name], *flags, *extra, model=model, steps=2)[3:]
        ops.append(["train", argv, name])
    return d, _run_all(ops)


def test_a_pipelined_run_trains_and_resumes_on_any_stage_count(runs):
    d, all_results = runs
    results = {k: v for k, v in all_results.items() if k not in BAD_CASES}
    assert results.keys() == {"plain", "piped", "again", "on1", "on2", "back"}
    assert all(status == 0 for status, _ in results.values()), results
    plain = [v for _, v in th.scalars(d["plain"])["loss"]]
    piped = [v for _, v in th.scalars(d["piped"])["loss"]]
    assert len(plain) == 4
    np.testing.assert_allclose(piped, plain, rtol=1e-5)  # the same loss curve
    th.assert_trees_equal(th.load_state(d["again"], 4), th.load_state(d["piped"], 4),
                          "a resume on the same stages")
    reference = _params(d["plain"], 4)
    for name in ("piped", "on2", "back"):
        assert th.complete_steps(d[name])[-1] == 4, name
        got = _params(d[name], 4)
        assert got.keys() == reference.keys()
        worst = {key: float(np.abs(got[key] - value).max() / np.abs(value).max())
                 for key, value in reference.items() if not key.endswith(NOISE_ONLY)}
        assert max(worst.values()) < PARAM_RTOL, (name, worst)


def test_bad_pipeline_settings_are_one_line(runs):
    d, all_results = runs
    results = {k: v for k, v in all_results.items() if k in BAD_CASES}
    assert results.keys() == BAD_CASES.keys()
    for name, (needle, _) in BAD_CASES.items():
        status, err = results[name]
        lines = th.error_lines(err)
        assert status in (1, 2) and len(lines) == 1 and "Traceback" not in err, (name, err)
        assert needle in lines[0], (name, lines[0])
        assert not (d[name] / "checkpoints").exists(), name


def test_a_pipeline_across_two_processes(tmp_path, runs):
    """The stage axis across two processes (DCN_MESH_SHAPE's stage entry; gloo's
    collectives on this CPU), FSDP within each (2 devices a process): the loss curve and
    parameters of the unpipelined one-process run (`runs`' "plain", on 8 devices) at
    step 2, to the tolerances the one-process pipelined runs meet."""
    d, results = runs
    assert results["plain"][0] == 0, results["plain"]
    flags = [*GPT8, "--gin.PIPELINE_MICROBATCHES=4", "--gin.CHECKPOINT_PERIOD=2"]
    # peers given 120 s, not 30, to answer a heartbeat: on 2 busy cores (CI) both
    # processes once missed 30 s of them while compiling this step, each then ending
    # for the other (a lost peer is test_multiprocess_faults.py's, not this test's)
    cmd = th.train_command(tmp_path / "two", *flags, "--gin.ICI_MESH_SHAPE=[1, 2, 1]",
                           "--gin.DCN_MESH_SHAPE=[1, 1, 1, 1, 2]", "--peer_timeout_seconds=120",
                           model="gpt", steps=2)
    port, procs = th.free_port(), []
    try:
        for i in range(2):
            procs.append(th.start(cmd + [f"--coordinator_address=127.0.0.1:{port}",
                                         "--process_count=2", f"--process_index={i}"],
                                  tmp_path / f"{i}.log", devices=2))
        statuses = [th.finish(p, timeout=300) for p in procs]
    finally:
        for p in procs:
            th.kill(p)
    logs = "\n".join(th.tail(th.read_log(tmp_path / f"{i}.log")) for i in range(2))
    assert statuses == [0, 0], logs
    assert "'stage': 2" in th.read_log(tmp_path / "0.log"), logs
    two = [v for _, v in th.scalars(tmp_path / "two")["loss"]]
    assert len(two) == 2, logs
    np.testing.assert_allclose(two, [v for _, v in th.scalars(d["plain"])["loss"]][:2],
                               rtol=1e-5)
    assert 2 in th.complete_steps(d["plain"])
    got, want = _params(tmp_path / "two", 2), _params(d["plain"], 2)
    worst = {k: float(np.abs(got[k] - v).max() / np.abs(v).max())
             for k, v in want.items() if not k.endswith(NOISE_ONLY)}
    assert max(worst.values()) < PARAM_RTOL, worst
