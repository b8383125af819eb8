"""The shell launchers users start from (scripts_gpu/), run on the CPU at the `tiny` size
(cut further by trailing gin flags, MODEL below):
single-node pretraining then finetuning from it, one process per device started by
hand, and the SLURM examples under a stand-in `srun` (tests/fake_slurm/srun) that gives
each task the environment a real one does, so that jax.distributed.initialize() finds
its task id, task count and coordinator exactly as on a cluster. Every flag a launcher
builds is checked where it lands (the run's config.gin), so a flag that stops reaching
the runner fails here; bad arguments give the usage and status 2."""
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import train_helpers as th
import warm_shim
from data_helpers import vocabulary
from t5lite.data.files import demo_corpus

SCRIPTS = th.REPO / "scripts_gpu"
FAKE_SLURM = th.REPO / "tests" / "fake_slurm"
LAUNCHERS = ("singlenode_pretrain_pile.sh", "singlenode_ft_frompile.sh",
             "multiprocess_pretrain_pile.sh", "example_slurm_pretrain_pile.sub",
             "example_slurm_ft_frompile.sub")
TIMEOUT = 300
# Every training run here ends with these flags: the tiny recipe's model cut to one layer
# each side and a 512-entry vocabulary (the test vocabulary's 400 ids: 300 pieces and 100
# sentinels), where T5's 32128 would make most of each step, checkpoint and weight
# comparison. What a launcher builds is checked all the same; a finetuning run loads its
# pretrained weights, so both take them.
MODEL = ("--gin.T5Config.vocab_size=512", "--gin.T5Config.num_encoder_layers=1",
         "--gin.T5Config.num_decoder_layers=1")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Pile-style jsonl.zst, MultiNLI jsonl and a vocabulary. (The launchers' `python3`
    is this interpreter, warm: `_run`.)"""
    root = tmp_path_factory.mktemp("launcher_data")
    demo_corpus.write_pile(str(root / "pile"), train_files=1, docs_per_file=60, eval_docs=2)
    demo_corpus.write_multinli(str(root / "mnli"), train=40, dev=6)
    empty_tfds = root / "tfds"
    empty_tfds.mkdir()
    return {"T5LITE_PILE_DIR": str(root / "pile"), "T5LITE_MNLI_DIR": str(root / "mnli"),
            "T5LITE_VOCABULARY_PATH": vocabulary(tmp_path_factory),
            "TFDS_DATA_DIR": str(empty_tfds), "PATH": os.environ["PATH"]}


def _run(script, *args, devices=1, env=None, slurm=False, unset=(), timeout=TIMEOUT):
    """bash scripts_gpu/`script` `args` from the repository root, as the docs say, with
    `env` added to the test environment and the variables in `unset` removed."""
    extra = dict(env or {})
    if slurm:
        extra["PATH"] = f"{FAKE_SLURM}{os.pathsep}{extra.get('PATH', os.environ['PATH'])}"
    full_env = th.env(devices, extra)
    for name in unset:
        full_env.pop(name, None)
    # the scripts' `python3 -m t5lite.train` runs warm (tests/warm_shim.py); what the test
    # and the scripts set for the scripts alone does not separate warm interpreters
    full_env = warm_shim.environment(full_env, run_time_only=(*extra, *SCRIPT_SET))
    return subprocess.run(["bash", str(SCRIPTS / script), *map(str, args)], cwd=th.REPO,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


# Variables the launchers and the stand-in srun set for their commands, none read by a
# module as it is imported (bash's own among them).
SCRIPT_SET = ("SLURM_*", "CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION", "PATH",
              "SHLVL", "_", "PWD", "OLDPWD")


def _config(model_dir):
    """The settings a run recorded: {macro or binding: value as written} from config.gin."""
    text = th.config_text(model_dir)
    return {m.group(1): m.group(2).strip() for m in
            re.finditer(r"^([\w.]+) = (.+)$", text, re.M)}


def _assert_config(model_dir, **expected):
    config = _config(model_dir)
    for name, value in expected.items():
        assert config.get(name) == value, (name, config.get(name), value)


def _slurm_job_id():
    """A job id whose coordinator port (JAX: id % 4096 + 61440) is free here."""
    for _ in range(50):
        job = int.from_bytes(os.urandom(3), "little")
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", job % 4096 + 61440))
                return job
            except OSError:
                continue
    raise AssertionError("no free port in 61440-65535")


def _slurm_env(data, job, **settings):
    """What sbatch puts in the batch script's environment for 2 one-task nodes, plus the
    script's settings."""
    return {**data, "SLURM_JOB_ID": str(job), "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": "2",
            "SLURM_SUBMIT_DIR": str(th.REPO), "GPUS_PER_NODE": "1", **settings}


def _assert_same_weights(a, b):
    flat_a, flat_b = th.flat(a["params"]), th.flat(b["params"])
    assert flat_a.keys() == flat_b.keys()
    for name in flat_a:
        np.testing.assert_array_equal(flat_a[name], flat_b[name], err_msg=name)


# ----------------------------------------------------------------------------- usage


@pytest.mark.parametrize("script", LAUNCHERS)
def test_every_launcher_prints_its_usage_on_help(script):
    for flag in ("--help", "-h"):
        proc = _run(script, flag)
        assert proc.returncode == 0, th.describe(proc)
        assert "usage:" in proc.stdout and script in proc.stdout, proc.stdout
        assert "#SBATCH" not in proc.stdout


@pytest.mark.parametrize("script,args,env,error", [
    ("singlenode_pretrain_pile.sh", ("tiny", "fp32"), {}, "expected at least 6 arguments, got 2"),
    ("singlenode_pretrain_pile.sh", ("huge", "fp32", 1, 2, "/tmp/l", "/tmp/m"), {},
     "MODEL must name a recipe configs/<MODEL>_pile_pretrain.gin (base, glam126m_64e, "
     "glam64b_64e, gpt126m, gpt175b, large, llama2_70b, llama2_7b, mixtral8x7b, small, "
     "switch_base8, tiny, xl, xxl), got 'huge'"),
    ("singlenode_pretrain_pile.sh", ("tiny", "fp16", 1, 2, "/tmp/l", "/tmp/m"), {},
     "PREC must be bf16 or fp32, got 'fp16'"),
    ("singlenode_pretrain_pile.sh", ("tiny", "fp32", "eight", 2, "/tmp/l", "/tmp/m"), {},
     "NUM_GPUS must be a whole number >= 1, got 'eight'"),
    ("singlenode_ft_frompile.sh", ("mnli", "tiny", "fp32", 1, 2, "/tmp/l"), {},
     "expected at least 7 arguments, got 6"),
    ("singlenode_ft_frompile.sh", ("cola", "tiny", "fp32", 1, 2, "/tmp/l", "/tmp/m"), {},
     "FT_TASK must be mnli or squad, got 'cola'"),
    ("singlenode_ft_frompile.sh", ("mnli", "xxxl", "fp32", 1, 2, "/tmp/l", "/tmp/m"), {},
     "SIZE must be tiny"),
    ("multiprocess_pretrain_pile.sh", ("tiny",), {}, "expected at least 6 arguments, got 1"),
    ("multiprocess_pretrain_pile.sh", ("tiny", "bf16", 0, 2, "/tmp/l", "/tmp/m"), {},
     "NUM_GPUS must be a whole number >= 1, got '0'"),
    ("example_slurm_pretrain_pile.sub", (), {"MODEL_DIR": "/tmp/m"},
     "not inside a SLURM job (SLURM_JOB_NUM_NODES is unset): submit with sbatch"),
    ("example_slurm_pretrain_pile.sub", (), {"SLURM_JOB_NUM_NODES": "2"}, "MODEL_DIR is not set"),
    ("example_slurm_pretrain_pile.sub", (),
     {"SLURM_JOB_NUM_NODES": "2", "MODEL_DIR": "/tmp/m", "T5_SIZE": "big"},
     "MODEL must name a recipe configs/<MODEL>_pile_pretrain.gin (base, "),
    ("example_slurm_pretrain_pile.sub", (),
     {"SLURM_JOB_NUM_NODES": "2", "MODEL_DIR": "/tmp/m", "TP_SIZE": "3"},
     "TP_SIZE=3 does not divide GPUS_PER_NODE=8"),
    ("example_slurm_pretrain_pile.sub", (),
     {"SLURM_JOB_NUM_NODES": "6", "MODEL_DIR": "/tmp/m", "PP_SIZE": "4"},
     "PP_SIZE=4 does not divide the 6 nodes"),
    ("example_slurm_pretrain_pile.sub", (),
     {"SLURM_JOB_NUM_NODES": "4", "MODEL_DIR": "/tmp/m", "PP_SIZE": "0"},
     "PP_SIZE must be a whole number >= 1, got '0'"),
    ("example_slurm_ft_frompile.sub", (), {"SLURM_JOB_NUM_NODES": "1", "MODEL_DIR": "/tmp/m"},
     "PRETRAINED_DIR is not set"),
    ("example_slurm_ft_frompile.sub", (),
     {"SLURM_JOB_NUM_NODES": "1", "MODEL_DIR": "/tmp/m", "PRETRAINED_DIR": "/tmp/p",
      "FT_TASK": "rte"}, "FT_TASK must be mnli or squad, got 'rte'"),
])
def test_bad_arguments_give_the_error_and_the_usage(script, args, env, error, tmp_path):
    # nothing may start: a `python3` or `srun` reached here fails the test
    for name in ("python3", "srun"):
        (tmp_path / name).write_text("#!/bin/sh\necho STARTED >&2\nexit 99\n")
        (tmp_path / name).chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    proc = _run(script, *args, env={**env, "PATH": path},
                unset={"SLURM_JOB_NUM_NODES", "MODEL_DIR", "PRETRAINED_DIR"} - set(env),
                timeout=60)
    assert proc.returncode == 2, th.describe(proc)
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("error: ") and error in lines[0], proc.stderr
    usage = [i for i, line in enumerate(lines) if line.startswith("usage: ")]
    assert usage and script in " ".join(lines[usage[0]:usage[0] + 2]), proc.stderr
    assert "STARTED" not in proc.stderr and proc.stdout == ""


# ----------------------------------------------------------------------------- runs


def test_single_node_pretraining_then_finetuning_from_it(data, tmp_path):
    """Every positional switch and a trailing gin flag land in the run's configuration;
    the finetuning run starts from the pretrained weights (learning rate 0 keeps them)."""
    model_dir, logs = tmp_path / "tiny", tmp_path / "logs"
    # SIZE PREC NUM_GPUS BSIZE_PER_GPU LOGDIR MODEL_DIR GRAD_ACCUM FP8 TRANSPOSE FUSE PACK
    proc = _run("singlenode_pretrain_pile.sh", "tiny", "fp32", 2, 2, logs, model_dir,
                2, 0, 1, 1, 1, "--gin.TRAIN_STEPS=4", "--gin.CHECKPOINT_PERIOD=4", *MODEL,
                devices=2, env=data)
    assert proc.returncode == 0, th.describe(proc)
    log = (logs / "tiny_fp32_gpu2_bs2.log").read_text()
    assert th.logged_steps(log) and th.logged_steps(log)[-1] == 4, log
    assert th.complete_steps(model_dir) == [4]
    _assert_config(model_dir, BATCH_SIZE="8", NUM_MICROBATCHES="2", TRAIN_STEPS="4",
                   ACTIVATION_DTYPE="'float32'", TRANSPOSE_BS="True", FUSE_QKV="True",
                   PACK="True", ICI_MESH_SHAPE="[-1, 1, 1]",
                   MIXTURE_OR_TASK_NAME="'pile_span_corruption'")

    # FT_TASK SIZE PREC GPUS BSIZE LOGDIR MODEL_DIR ACCUM MAKE_FT_DIR FP8 TRANSPOSE FUSE PACK
    proc = _run("singlenode_ft_frompile.sh", "mnli", "tiny", "fp32", 2, 2, logs, model_dir,
                1, 1, 0, 1, 1, 0, "--gin.TRAIN_STEPS=2", "--gin.CHECKPOINT_PERIOD=2",
                "--gin.EVAL_PERIOD=None", "--gin.adafactor.learning_rate=0.0",
                "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}", *MODEL,
                devices=2, env=data)
    assert proc.returncode == 0, th.describe(proc)
    ft_dir = model_dir / "ft_mnli"
    assert (logs / "ft_mnli_tiny_fp32.log").exists()
    assert th.complete_steps(ft_dir) == [2] and th.complete_steps(model_dir) == [4]
    _assert_config(ft_dir, BATCH_SIZE="4", NUM_MICROBATCHES="1", PACK="False",
                   INITIAL_CHECKPOINT_PATH=f"'{model_dir}'", MIXTURE_OR_TASK_NAME="'mnli'",
                   FUSE_QKV="True")
    _assert_same_weights(th.load_state(model_dir, 4), th.load_state(ft_dir, 2))


# the launcher's two-process run of the tiny model, 4 steps, checkpoints at 2 and 4
LAUNCHER_ARGS = ("tiny", "fp32", 2, 2)
LAUNCHER_FLAGS = ("--gin.TRAIN_STEPS=4", "--gin.CHECKPOINT_PERIOD=2", "--gin.LOG_PERIOD=1",
                  "--peer_timeout_seconds=5", *MODEL)


@pytest.fixture(scope="module")
def slurm_pretrained(data, tmp_path_factory):
    """The SLURM pretraining example's uninterrupted run: two one-device tasks, the tiny
    model in float32, a global batch of 4, 4 steps, checkpoints at 2 and 4 (the layout of
    the multiprocess launcher's run above: data parallel over the 2 processes). Its
    completed process, job id and MODEL_DIR. The SLURM test checks it, and it is the
    uninterrupted run the multiprocess launcher's resumed run must match."""
    pretrained, job = tmp_path_factory.mktemp("slurm_pretrain") / "pretrain", _slurm_job_id()
    proc = _run("example_slurm_pretrain_pile.sub", "--gin.CHECKPOINT_PERIOD=2", *MODEL,
                env=_slurm_env(data, job, MODEL_DIR=str(pretrained), T5_SIZE="tiny",
                               PREC="fp32", BSIZE_PER_GPU="2", TRAIN_STEPS="4"), slurm=True)
    return proc, job, pretrained


def test_multiprocess_launcher_fails_when_a_process_fails(data, tmp_path):
    proc = _run("multiprocess_pretrain_pile.sh", "tiny", "fp32", 2, 2, tmp_path / "logs",
                tmp_path / "run", "--gin.NO_SUCH_SETTING=1",
                env={**data, "PORT": str(th.free_port())})
    assert proc.returncode == 2, th.describe(proc)
    assert re.search(r"error: process [01] exited with status 2 \(its log: .*/proc_[01]\.log; "
                     r"last line: error: .*NO_SUCH_SETTING", proc.stderr), th.describe(proc)
    # the process that failed first names the setting in its log; the other may be
    # stopped by its peer's exit before it reaches the same error (a race, either order)
    assert any("NO_SUCH_SETTING" in (tmp_path / "logs" / f"proc_{i}.log").read_text()
               for i in (0, 1))


def test_multiprocess_launcher_names_the_process_that_failed_joins_and_resumes(
        data, tmp_path, slurm_pretrained):
    """Process 1 hangs in step 3 (INJECT_STALL, its watchdog ends it with status 3): the
    launcher names it and its log, process 0 ends by itself (status 4, well inside the
    grace period), and the same command without the fault resumes from checkpoint 2 to
    the weights of an uninterrupted run (the SLURM example's run of the same model, batch
    and mesh, `slurm_pretrained`). The resumed run also checks what the launcher's
    uninterrupted run was checked for (once test_multiprocess_launcher_joins_its_processes,
    its own run): each process joins jax.distributed as process i of 2, checkpoints 2 and 4
    are complete, and the launcher's settings land in config.gin."""
    model_dir, logs = tmp_path / "run", tmp_path / "logs"
    args = (*LAUNCHER_ARGS, logs, model_dir, *LAUNCHER_FLAGS)
    # a grace period far longer than the run takes even on a loaded machine (about 50 s),
    # so that ending well inside it shows process 0 ended by itself, not by the kill
    env = {**data, "GRACE_SECONDS": "400", "PORT": str(th.free_port())}
    t = time.monotonic()
    proc = _run("multiprocess_pretrain_pile.sh", *args, "--gin.INJECT_STALL='1:3:600'",
                "--gin.WATCHDOG_FLOOR_SECONDS=3", "--gin.WATCHDOG_WARMUP_STEPS=1", env=env)
    assert proc.returncode == 3, th.describe(proc)
    assert time.monotonic() - t < 300  # process 0 was not left to the grace period's kill
    line = th.error_lines(proc.stderr)[0]
    assert line.startswith(f"error: process 1 exited with status 3 (its log: {logs}/proc_1.log; "
                           f"last line: error: process 1 on "), line
    assert "is hung" in line and "run the same command to resume" in line
    assert "because process 1 (host " in (logs / "proc_0.log").read_text()
    assert th.complete_steps(model_dir) == [2]
    proc = _run("multiprocess_pretrain_pile.sh", *args, env=env)  # the same port at once
    assert proc.returncode == 0, th.describe(proc)
    assert "start: resume:2 at step 2" in (logs / "proc_0.log").read_text()
    for i in range(2):
        log = (logs / f"proc_{i}.log").read_text()
        assert f"jax.distributed: process {i} of 2, 1 local / 2 global devices" in log, log
    assert th.complete_steps(model_dir) == [2, 4]
    _assert_config(model_dir, BATCH_SIZE="4", TRAIN_STEPS="4", ACTIVATION_DTYPE="'float32'",
                   ICI_MESH_SHAPE="[1, 1, 1]", DCN_MESH_SHAPE="[-1, 1, 1]")
    reference, reference_logs = slurm_pretrained[2], sorted(
        (slurm_pretrained[2] / "logs").glob(f"{slurm_pretrained[1]}_*.log"))
    assert slurm_pretrained[0].returncode == 0, th.describe(slurm_pretrained[0]) + "".join(
        th.tail(p.read_text()) for p in reference_logs)
    _assert_same_weights(th.load_state(model_dir, 4), th.load_state(reference, 4))


def test_xla_flags_are_known_to_jax(tmp_path):
    """scripts_gpu/xla_flags.sh's flags start jax (an unknown flag aborts at backend start;
    scripts_gpu/image_smoke.sh checks them under the GPU image's jax too)."""
    proc = subprocess.run(["bash", "-c", f"source {SCRIPTS}/xla_flags.sh && echo \"$XLA_FLAGS\" && "
                           f"{sys.executable} -c 'import jax; print(len(jax.devices()))'"],
                          env=th.env(1), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, th.describe(proc)
    assert "--xla_gpu_nccl_termination_timeout_seconds=1200" in proc.stdout


@pytest.mark.parametrize("status,requeued", [(4, True), (3, True), (5, True), (137, True),
                                             (2, False), (1, False)])
def test_slurm_examples_requeue_after_a_fault(data, tmp_path, status, requeued):
    """The batch script requeues its job (scontrol requeue) when the step ends in a way a
    restart mends, at most MAX_RESTARTS times, and exits with the step's status."""
    for name, body in (("srun", f"exit {status}"),
                       ("scontrol", f'echo "$@" >> {tmp_path}/scontrol.calls')):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{data['PATH']}"
    for restarts, expect in ((0, requeued), (3, False)):
        calls = tmp_path / "scontrol.calls"
        calls.unlink(missing_ok=True)
        proc = _run("example_slurm_pretrain_pile.sub",
                    env=_slurm_env({**data, "PATH": path}, 4242, MODEL_DIR=str(tmp_path / "m"),
                                   SLURM_RESTART_COUNT=str(restarts)))
        assert proc.returncode == status, th.describe(proc)
        assert calls.exists() == expect, th.describe(proc)
        if expect:
            assert calls.read_text().split() == ["requeue", "4242"]
            assert f"requeueing job 4242 (restart {restarts + 1} of 3)" in proc.stderr
        elif requeued:
            assert "after 3 restarts (MAX_RESTARTS=3); not requeueing" in proc.stderr


def test_slurm_examples_pretrain_then_finetune_across_two_tasks(data, tmp_path,
                                                              slurm_pretrained):
    """Two tasks on two one-device "nodes": jax.distributed.initialize() takes the task id,
    the task count and the coordinator (first node, port from the job id) from SLURM's
    variables alone; the finetuning job starts from the pretraining job's weights (its
    last checkpoint, 4; the pretraining run is `slurm_pretrained`, shared with the
    multiprocess launcher's resume test)."""
    proc, job, pretrained = slurm_pretrained
    logs = sorted((pretrained / "logs").glob(f"{job}_*.log"))
    assert proc.returncode == 0, th.describe(proc) + "".join(th.tail(p.read_text()) for p in logs)
    assert [p.name for p in logs] == [f"{job}_0.log", f"{job}_1.log"]
    for i, path in enumerate(logs):
        assert f"jax.distributed: process {i} of 2, 1 local / 2 global devices" in \
            path.read_text(), path.read_text()
    assert th.complete_steps(pretrained) == [2, 4]
    _assert_config(pretrained, BATCH_SIZE="4", TRAIN_STEPS="4", ACTIVATION_DTYPE="'float32'",
                   ICI_MESH_SHAPE="[1, 1, 1]", DCN_MESH_SHAPE="[2, 1, 1, 1, 1]",
                   CHECKPOINT_PERIOD="2")

    finetuned, job = tmp_path / "mnli", _slurm_job_id()
    proc = _run("example_slurm_ft_frompile.sub", "--gin.CHECKPOINT_PERIOD=2",
                "--gin.EVAL_PERIOD=None", "--gin.adafactor.learning_rate=0.0",
                "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}", *MODEL,
                env=_slurm_env(data, job, MODEL_DIR=str(finetuned),
                               PRETRAINED_DIR=str(pretrained), T5_SIZE="tiny", PREC="fp32",
                               BSIZE_PER_GPU="1", NUM_MICROBATCHES="2", TRAIN_STEPS="2"),
                slurm=True)
    logs = sorted((finetuned / "logs").glob(f"{job}_*.log"))
    assert proc.returncode == 0, th.describe(proc) + "".join(th.tail(p.read_text()) for p in logs)
    assert len(logs) == 2 and th.complete_steps(finetuned) == [2]
    _assert_config(finetuned, BATCH_SIZE="4", NUM_MICROBATCHES="2", TRAIN_STEPS="2",
                   INITIAL_CHECKPOINT_PATH=f"'{pretrained}'", MIXTURE_OR_TASK_NAME="'mnli'",
                   DCN_MESH_SHAPE="[2, 1, 1]")
    _assert_same_weights(th.load_state(pretrained, 4), th.load_state(finetuned, 2))


def test_slurm_example_counts_the_global_batch_as_t5x_does(data, tmp_path):
    """T5X's GPU table line for T5 XXL (64 nodes x 8 GPUs, TP 8, 36 sequences a GPU):
    the global batch is GPUs x BSIZE_PER_GPU / TP = 2304, and the mesh puts TP within a
    node and the replicas across nodes. A stand-in srun prints the command it was given."""
    (tmp_path / "srun").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/srun.args\n')
    (tmp_path / "srun").chmod(0o755)
    env = _slurm_env({**data, "PATH": f"{tmp_path}{os.pathsep}{data['PATH']}"}, 4243,
                     MODEL_DIR=str(tmp_path / "m"), SLURM_JOB_NUM_NODES="64",
                     SLURM_NTASKS="512", GPUS_PER_NODE="8", T5_SIZE="xxl", TP_SIZE="8",
                     BSIZE_PER_GPU="36")
    proc = _run("example_slurm_pretrain_pile.sub", env=env)
    assert proc.returncode == 0, th.describe(proc)
    args = (tmp_path / "srun.args").read_text()
    for flag in ("--gin_file=configs/xxl_pile_pretrain.gin", "--gin.BATCH_SIZE=2304",
                 "--gin.NUM_MICROBATCHES=1", "--gin.ICI_MESH_SHAPE=[1,1,8]",
                 "--gin.DCN_MESH_SHAPE=[64,1,1,1,1]"):
        assert flag in args.split(), (flag, args)
    assert "PIPELINE_MICROBATCHES" not in args


def test_the_pretraining_launchers_take_every_family_s_recipe(data, tmp_path):
    """MODEL names any configs/<MODEL>_pile_pretrain.gin: LLaMA-2 70B on 8 nodes, TP 8,
    pipelined over 2 stages (a stand-in srun prints the command it was given)."""
    (tmp_path / "srun").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/srun.args\n')
    (tmp_path / "srun").chmod(0o755)
    env = _slurm_env({**data, "PATH": f"{tmp_path}{os.pathsep}{data['PATH']}"}, 4244,
                     MODEL_DIR=str(tmp_path / "m"), SLURM_JOB_NUM_NODES="8",
                     GPUS_PER_NODE="8", MODEL="llama2_70b", TP_SIZE="8", PP_SIZE="2",
                     BSIZE_PER_GPU="4", NUM_MICROBATCHES="2")
    proc = _run("example_slurm_pretrain_pile.sub", env=env)
    assert proc.returncode == 0, th.describe(proc)
    args = (tmp_path / "srun.args").read_text().split()
    # replicas: 64 GPUs / (TP 8 x PP 2) = 4; 4 a replica x 2 microbatches x 4 = 32
    for flag in ("--gin_file=configs/llama2_70b_pile_pretrain.gin", "--gin.BATCH_SIZE=32",
                 "--gin.ICI_MESH_SHAPE=[1,1,8]", "--gin.DCN_MESH_SHAPE=[4,1,1,1,2]",
                 "--gin.PIPELINE_MICROBATCHES=8"):
        assert flag in args, (flag, args)
