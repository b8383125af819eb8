"""Memory before hardware: the compiled train step's per-device memory
(`tools.step_memory`, `python -m t5lite.info --memory`) follows the mesh, the batch and
the remat switch as it must, `info` counts the optimizer the config binds, and its
answer says plainly whether a step fits."""
import json
import sys

import jax
import numpy as np
import pytest

import model_helpers as mh
import train_helpers as th
from t5lite.config import parsing
from t5lite.models import configs, model as model_lib
from t5lite.optim import optimizers
from t5lite.runtime import run
from t5lite.tools import benchmarking, footprint, step_memory
from t5lite.runtime.partitioning import MeshSettings

LENGTHS = {"inputs": 64, "targets": 32}


def _tiny_t5(**switches):
    """One encoder and one decoder layer; two for scanned stacks (a loop of one layer is
    no loop for XLA, and the remat comparison reads the scanned loop's saved activations).
    Each compile of the unrolled step takes about a third less than with two."""
    layers = 2 if switches.get("scan_layers") else 1
    cfg = configs.T5Config(vocab_size=256, emb_dim=64, num_heads=4, head_dim=16,
                           num_encoder_layers=layers, num_decoder_layers=layers, mlp_dim=256,
                           **switches)
    return model_lib.EncoderDecoderModel(cfg)


def _memory(model, batch, mesh_shape, optimizer=None, devices=8):
    data = run.TrainData("synthetic", LENGTHS, batch_size=batch, seed=0, pack=False)
    the_run = run.build_run(model=model, data=data, optimizer=optimizer or optimizers.adamw(1e-3),
                            mesh=MeshSettings(ici_mesh_shape=mesh_shape, dcn_mesh_shape=(1, 1, 1),
                                              partition_rules=()),
                            devices=jax.devices()[:devices])
    compiled = step_memory.compile_train_step(the_run, step_memory.abstract_batch(the_run,
                                                                                  LENGTHS))
    return step_memory.compiled_memory(compiled)


@pytest.fixture(scope="module")
def tiny_memory():
    """`_memory` of `_tiny_t5(**switches)` with AdamW on 8 devices, each program compiled
    once in this module (the state test's data-parallel step is the activation test's
    small one)."""
    compiled = {}

    def memory(batch, mesh_shape, **switches):
        key = (batch, mesh_shape, tuple(sorted(switches.items())))
        if key not in compiled:
            compiled[key] = _memory(_tiny_t5(**switches), batch, mesh_shape)
        return compiled[key]
    return memory


def _state_bytes(model, optimizer):
    params = footprint.abstract_params(model)
    return 4 * footprint.param_count(params) + footprint.optimizer_state_bytes(params,
                                                                               optimizer)


def test_state_is_sharded_by_fsdp_and_replicated_by_data_parallelism(tiny_memory):
    state = _state_bytes(_tiny_t5(), optimizers.adamw(1e-3))  # tiny_memory's optimizer
    data = tiny_memory(8, (8, 1, 1))
    fsdp = tiny_memory(8, (1, 8, 1))
    # data parallel: every device holds the whole state (plus batch, rng, step)
    assert state <= data.argument_bytes < state * 1.05
    # fsdp over 8: each holds about an eighth of it (small leaves stay replicated)
    assert fsdp.argument_bytes < state / 4
    # the donated state is aliased to the new state: outputs add no second copy
    assert data.alias_bytes >= state and data.peak_bytes < data.argument_bytes + data.temp_bytes * 1.01 + data.code_bytes + 2**20


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_activations_grow_with_the_batch_and_remat_shrinks_them(tiny_memory):
    small = tiny_memory(8, (8, 1, 1))     # 1 example per device
    large = tiny_memory(64, (8, 1, 1))    # 8 per device
    assert large.temp_bytes > 2 * small.temp_bytes
    # remat frees the saved activations; the CPU compiler credits it for scanned layers
    # (for an unrolled stack it schedules the recomputation early: see step_memory)
    scanned = tiny_memory(64, (8, 1, 1), scan_layers=True)
    remat = tiny_memory(64, (8, 1, 1), scan_layers=True, remat_policy="full")
    assert remat.temp_bytes < scanned.temp_bytes / 2


def test_verdict_is_a_plain_answer():
    assert step_memory.verdict(10 * 2**30, 80 * 2**30).startswith("fits in 80 GiB")
    no = step_memory.verdict(75 * 2**30, 80 * 2**30)   # above 90% of 80 GiB
    assert no.startswith("does not fit in 80 GiB") and "REMAT_POLICY" in no
    assert "NUM_MICROBATCHES" in no


def test_optimizer_state_is_counted_from_the_optimizer_itself():
    # Adafactor factors matrices whose both sides are >= 128: a model wide enough for that
    model = model_lib.EncoderDecoderModel(configs.T5Config(
        vocab_size=256, emb_dim=128, num_heads=4, head_dim=32, num_encoder_layers=2,
        num_decoder_layers=2, mlp_dim=512))
    params = footprint.abstract_params(model)
    n = footprint.param_count(params)
    adamw = footprint.optimizer_state_bytes(params, optimizers.adamw(1e-3))
    assert 8 * n <= adamw <= 8 * n + 64          # two float32 moments + step counters
    ada = footprint.optimizer_state_bytes(params, optimizers.adafactor(1e-2))
    # by shape alone the [embed, heads, kv] attention kernels stay whole (their
    # second-largest side, kv, is under 128); the rest is factored: under 4 B/param
    assert ada < 2 * n
    # by the model's axis names they are factored too, as T5X's [embed, heads*kv]:
    # only the relative-position tables and the norm scales are kept whole
    axes = model.logical_axes()["params"]
    ada_t5x = footprint.optimizer_state_bytes(params, optimizers.adafactor(1e-2), axes)
    whole = sum(int(np.prod(leaf.shape)) for path, leaf in
                jax.tree_util.tree_leaves_with_path(params)
                if "relpos" in jax.tree_util.keystr(path) or "scale" in jax.tree_util.keystr(path))
    assert ada_t5x < 4 * whole + 0.1 * n
    momentum = footprint.optimizer_state_bytes(params, optimizers.adafactor(1e-2,
                                                                            momentum=0.9))
    assert momentum >= ada + 4 * n               # a full first moment on top


def test_placeholders_fill_only_unset_run_macros(tmp_path):
    recipe = tmp_path / "recipe.gin"
    recipe.write_text("include 'models/t5_1_1/tiny.gin'\ninclude 'runs/pretrain.gin'\n"
                      "TRAIN_STEPS = 5000\nMIXTURE_OR_TASK_NAME = 'pile_span_corruption'\n")
    import gin
    parsing.parse_gin([str(recipe)], ["BATCH_SIZE = 16"], placeholders=parsing.RUN_PLACEHOLDERS)
    assert gin.query_parameter("TRAIN_STEPS/gin.macro.value") == 5000
    assert gin.query_parameter("MIXTURE_OR_TASK_NAME/gin.macro.value") == "pile_span_corruption"
    assert gin.query_parameter("MODEL_DIR/gin.macro.value") == "/tmp/t5lite_placeholder"
    # the step run still reads random batches: no TensorFlow, no PILE_DIR
    the_run = benchmarking.step_run(parsing.resolve_macro("MODEL"), devices=jax.devices()[:1])
    assert the_run.batch_size == 16 and type(the_run.iterator).__name__ == "SyntheticIterator"


# --------------------------------------------------------------------------- the command

def _info(*args):
    return th.run([sys.executable, "-m", "t5lite.info", *args], devices=1, cwd=th.REPO,
                  timeout=300)


# The tiny T5 and GPT cut further where their size is not what a test reads (vocabulary
# 512; one T5 layer a stack; the pipeline's GPT 4 layers, one a stage)
SMALL_T5 = mh.small_flags()
T5_MEMORY = ["--gin_file=configs/models/t5_1_1/tiny.gin",
             "--gin_file=configs/synthetic_pretrain.gin", *SMALL_T5]
PIPELINE = ["--gin_file=configs/models/gpt/tiny.gin", "--gin_file=configs/synthetic_pretrain.gin",
            "--gin.DecoderConfig.num_layers=4", "--gin.DecoderConfig.vocab_size=512",
            "--seq_length=32", "--memory", "--devices=8", "--per_device_batch=2",
            "--cpu_compiler", "--json", "--gin.PIPELINE_MICROBATCHES=4",
            "--gin.ICI_MESH_SHAPE=[1,2,1,1,4]"]
INFO_RUNS = {
    # first: jax starts with the interpreter's 8 CPU devices; the later runs take fewer
    "pipeline": PIPELINE,
    "memory": T5_MEMORY + ["--inputs_length=64", "--targets_length=32", "--memory",
                           "--devices=4", "--per_device_batch=2",
                           "--gin.ICI_MESH_SHAPE=[1, 4, 1]", "--cpu_compiler", "--json"],
    "too_small": T5_MEMORY + ["--memory", "--devices=2", "--per_device_batch=2",
                              "--device_memory_gib=0.00001", "--cpu_compiler"],
    "zero": T5_MEMORY + ["--memory", "--devices=8", "--per_device_batch=1",
                         "--gin.SHARD_OPTIMIZER_OVER_DATA=True", "--cpu_compiler", "--json"],
    "adamw": ["--gin_file=configs/large_pile_pretrain.gin", "--json"],
    "adafactor": ["--gin_file=configs/large_pile_pretrain.gin", "--optimizer=adafactor",
                  "--json"],
}
MISTAKES = [  # info's argv, the words its one error line names
    (["--gin_file=configs/models/t5_1_1/tiny.gin", "--memory", "--devices=2"],
     ["BATCH_SIZE", "--per_device_batch"]),
    (["--gin_file=configs/models/t5_1_1/tiny.gin", "--gin_file=configs/synthetic_pretrain.gin",
      "--memory", "--devices=2", "--per_device_batch=1", "--gin.NUM_MICROBATCHES=4"],
     ["NUM_MICROBATCHES"]),
    (["--gin_file=configs/models/t5_1_1/tiny.gin", "--memory", "--devices=0"], ["--devices"]),
    (T5_MEMORY + ["--memory", "--devices=2", "--per_device_batch=1",
                  "--gin.SHARD_OPTIMIZER_OVER_DATA=1"],
     ["SHARD_OPTIMIZER_OVER_DATA", "True or False"]),
]
INFO_RUNS.update({f"mistake{i}": args for i, (args, _) in enumerate(MISTAKES) if i})


@pytest.fixture(scope="module")
def info_runs():
    """{name: CompletedProcess} of INFO_RUNS, by info's main in one interpreter with 8 CPU
    devices (th.run_mains), each returncode the status the command would exit with; this
    file's real `python -m t5lite.info` subprocess is the first one-line mistake's."""
    argvs = list(INFO_RUNS.values())
    procs = th.run_mains(argvs, devices=8, module="t5lite.info", cwd=th.REPO,
                         timeout=600)
    return dict(zip(INFO_RUNS, procs))


def test_info_counts_the_optimizer_the_recipe_binds(info_runs):
    proc = info_runs["adamw"]
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["optimizer"] == "adamw" and report["optimizer_source"] == "bound by the config"
    n = report["params"]
    assert 8 * n <= report["optimizer_state_bytes"] <= 8 * n + 64   # ~5.8 GiB, not 0.07
    assert "adamw state" in proc.stderr and "bound by the config" in proc.stderr
    proc = info_runs["adafactor"]
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["optimizer"] == "adafactor"


@pytest.mark.slow  # out of the quick local subset (-m "not slow"); CI runs it
def test_info_memory_on_simulated_devices(info_runs):
    proc = info_runs["memory"]
    assert proc.returncode == 0, proc.stderr
    mem = json.loads(proc.stdout)["step_memory"]
    assert mem["devices"] == 4 and mem["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1,
                                                   "expert": 1, "stage": 1, "context": 1}
    assert mem["per_device_batch"] == 2 and mem["batch_size"] == 8
    assert mem["peak_bytes"] == (mem["argument_bytes"] + mem["output_bytes"]
                                 - mem["alias_bytes"] + mem["temp_bytes"] + mem["code_bytes"])
    assert mem["verdict"].startswith("fits in 80 GiB")
    assert "train step memory" in proc.stderr and "4 simulated CPU devices" in proc.stderr
    # the same step on a device of a few KiB: a plain no, with what to change
    proc = info_runs["too_small"]
    assert proc.returncode == 0, proc.stderr
    assert "does not fit in 0 GiB" in proc.stdout and "REMAT_POLICY" in proc.stdout


def test_info_memory_says_the_optimizer_state_split_over_data(info_runs):
    """`info --memory` with SHARD_OPTIMIZER_OVER_DATA on 8 data-parallel devices: each
    device holds the whole parameters and 1/8 of the optimizer state (read off the state's
    shardings; the compiled arguments are their sum and the batch), and says so."""
    proc = info_runs["zero"]
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    mem = report["step_memory"]
    assert mem["mesh"]["data"] == 8 and mem["shard_optimizer_over_data"] is True
    assert mem["params_bytes_per_device"] == report["param_bytes"]
    whole = report["optimizer_state_bytes"]
    assert whole / 8 <= mem["optimizer_state_bytes_per_device"] < 1.05 * whole / 8
    assert 0 < mem["argument_bytes"] - mem["params_bytes_per_device"] - \
        mem["optimizer_state_bytes_per_device"] < 0.01 * whole  # + the batch, step, key
    assert "split over data too" in proc.stderr


@pytest.mark.parametrize("case", range(len(MISTAKES)))
def test_info_memory_mistakes_are_one_line(info_runs, case):
    """The first case a real `python -m t5lite.info` (status and stderr as a shell sees
    them), the others by info's main in `info_runs`' interpreter."""
    args, words = MISTAKES[case]
    proc = _info(*args) if case == 0 else info_runs[f"mistake{case}"]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_info_memory_of_a_pipeline_per_device(info_runs):
    """`info --memory` compiles a pipelined step on its mesh ([stage=4, fsdp=2]) and says
    what a device needs (the arrays' own shardings are checked in
    test_pipeline_parallelism)."""
    piped = info_runs["pipeline"]
    assert piped.returncode == 0, piped.stderr
    mem = json.loads(piped.stdout)["step_memory"]
    assert mem["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1, "stage": 4, "context": 1}
    assert mem["verdict"].startswith("fits in 80 GiB") and mem["argument_bytes"] > 0
    assert "stage 4" in piped.stderr
