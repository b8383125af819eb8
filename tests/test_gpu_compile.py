"""Compiling for an H100 / H200 on this CPU machine (`tools.gpu_target`,
`tools.gpu_report`, `python -m t5lite.info --gpu`): the compile-only devices, the
program's kernels against XLA's own cost analysis, both families' steps, the switches
that change the GPU program (cuDNN attention), --memory on a GPU's plan, and one-line
errors. Needs the gpu-aot extra, which the test extra installs."""
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import model_helpers as mh
import train_helpers as th
from t5lite.config import parsing
from t5lite.errors import ConfigError
from t5lite.tools import benchmark, benchmarking, gpu_report, gpu_target, step_memory, step_time
from t5lite.tools.hlo import gpu_program

LENGTHS = ["--inputs_length=32", "--targets_length=16"]
# The tiny T5 cut further where its size is not what a test reads (a vocabulary of 512, not
# 32,128; one encoder and one decoder layer, not two): each compile for a GPU here costs
# about a fifth less, and what is compared (kernels, bytes, memory) is of one program.
SMALL_T5, SMALL_T5_FLAGS = mh.small_bindings(), mh.small_flags()


def _info(*args, extra=None):
    return th.run([sys.executable, "-m", "t5lite.info", *args], devices=1, cwd=th.REPO,
                  timeout=600, extra_env=extra)


@pytest.fixture(scope="module")
def info_h200():
    """`info --gpu=h200 --memory --json` on the tiny T5 (SMALL_T5), run once for the tests
    that read it (the CLI's report, --memory from the report's compile, and the einsum
    baseline of the cuDNN test): (process, its JSON). jax logs each compile on stderr."""
    proc = _info("--gin_file=configs/models/t5_1_1/tiny.gin",
                 "--gin_file=configs/synthetic_pretrain.gin", *SMALL_T5_FLAGS, *LENGTHS,
                 "--gpu=h200", "--memory", "--devices=1", "--json",
                 extra={"JAX_LOG_COMPILES": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(proc.stdout)


def test_target_configs_come_from_the_plugin():
    for gpu, kind in gpu_target.GPUS.items():
        facts = gpu_target.device_facts(gpu_target.target_config(gpu))
        assert facts["device_kind"] == kind
        assert facts["core_count"] == 132
    assert gpu_target.device_facts(gpu_target.target_config("h200"))["memory_bandwidth"] == 4.8e12
    assert gpu_target.device_facts(gpu_target.target_config("h100"))["device_memory_size"] > 79e9
    with pytest.raises(ConfigError, match="h100, h200 or the path"):
        gpu_target.target_config("z100")


def test_launcher_options_are_the_launchers_flags(monkeypatch):
    """The CPU-side compile uses the flags of scripts_gpu/xla_flags.sh that shape a
    one-GPU program, with the same values."""
    text = (th.REPO / "scripts_gpu" / "xla_flags.sh").read_text()
    flags = dict(re.findall(r"--(xla_gpu_\w+)=(\w+)", text))
    for name, value in gpu_target.LAUNCHER_OPTIONS.items():
        assert flags[name] == str(value).lower(), name
    # the flags XLA reads from XLA_FLAGS alone: the launchers set them, and so does a
    # CPU-side compile for GPUs (before jax starts; here it has, so only the variable)
    for flag in gpu_target.ENV_FLAGS:
        name, value = flag[2:].split("=")
        assert flags[name] == value, name
    for name in ("XLA_FLAGS", "JAX_PLATFORMS"):  # restored after the test
        monkeypatch.setenv(name, os.environ.get(name, ""))
    gpu_target.use_cpu_platform()
    assert all(f in os.environ["XLA_FLAGS"] for f in gpu_target.ENV_FLAGS)


def test_a_large_sort_compiles_without_a_gpu():
    """XLA sizes CUB's radix sort by asking the CUDA runtime, which has no GPU here
    (`cudaErrorInvalidDevice`: what stopped Mixtral's dropless step compiling for 8
    H100s); `compiler_options` gives XLA's own sort instead, and the argsort of a million
    keys (dropless routing sorts token choices by expert) compiles."""
    devices = gpu_target.gpu_devices("h100")
    spec = jax.sharding.NamedSharding(jax.sharding.Mesh(devices, ("x",)),
                                      jax.sharding.PartitionSpec())
    keys = jax.ShapeDtypeStruct((1 << 20,), jnp.int32, sharding=spec)
    lowered = jax.jit(lambda k: jnp.argsort(k, stable=True)).lower(keys)
    with pytest.raises(Exception, match="cudaErrorInvalidDevice"):
        lowered.compile({k: v for k, v in gpu_target.compiler_options().items()
                         if k not in gpu_target.DEVICELESS_OPTIONS})
    assert "sort(" in lowered.compile(gpu_target.compiler_options()).as_text()


def _replicated_h200():
    """A sharding onto one compile-only H200: abstract arguments made with it compile for
    that GPU."""
    devices = gpu_target.gpu_devices("h200")
    assert devices[0].device_kind == gpu_target.GPUS["h200"]
    return jax.sharding.NamedSharding(jax.sharding.Mesh(devices, ("x",)),
                                      jax.sharding.PartitionSpec())


@pytest.fixture(scope="module")
def h200_program():
    """A matmul, a float32 softmax and a reduction, compiled for an H200 here."""
    spec = _replicated_h200()
    a = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=spec)
    b = jax.ShapeDtypeStruct((512, 384), jnp.bfloat16, sharding=spec)

    def f(a, b):
        return jax.nn.softmax((a @ b).astype(jnp.float32), axis=-1).sum(axis=0)

    return jax.jit(f).lower(a, b).compile(gpu_target.compiler_options())


def test_a_program_for_an_h200_against_xla_cost_analysis(h200_program):
    compiled = h200_program
    text = compiled.as_text()
    assert "__cublas$" in text  # the launchers' flags: GEMMs go to cuBLAS
    kernels = gpu_program.program_kernels(text)
    gemms = [k for k in kernels if k.kind == "cublas gemm"]
    assert len(gemms) == 1 and gemms[0].flops == 2 * 256 * 384 * 512
    assert gemms[0].bytes == 2 * (256 * 512 + 512 * 384 + 256 * 384)
    xla = gpu_report._cost_analysis(compiled)
    own = sum(k.bytes * k.count for k in kernels if k.kind != "cublas gemm")
    assert own == pytest.approx(xla["bytes"], rel=0.05)
    assert compiled.memory_analysis().temp_size_in_bytes > 0


def test_bench_predicts_the_program_the_gpu_compiled(h200_program, monkeypatch):
    """On a GPU, bench's result holds the predictor's time for the program that GPU
    compiled (its own target config); off a GPU, none."""
    assert benchmark.predicted_step_s(h200_program) is None  # jax runs on the CPU here
    spec = gpu_target.target_config("h200")
    monkeypatch.setattr(gpu_target, "local_target_config", lambda: spec)
    kernels = gpu_program.program_kernels(h200_program.as_text())
    expected = step_time.predict(kernels, gpu_target.device_facts(spec))
    assert benchmark.predicted_step_s(h200_program) == expected > 0


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_the_gated_mlps_backward_keeps_only_the_projections_on_a_gpu(act):
    """Compiled for an H200, the gradient of wo(act(wi_0 x) * wi_1 x) written plainly
    keeps one more [tokens, mlp] array than `activated_product`'s for tanh-GELU (its
    tanh), and moves more bytes; without the backward's barrier XLA merges the
    recomputation back into the forward. For SiLU, XLA already keeps no more."""
    from t5lite.models.activations import ACTIVATIONS, activated_product
    spec = _replicated_h200()
    x = jax.ShapeDtypeStruct((2048, 256), jnp.bfloat16, sharding=spec)
    w = jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16, sharding=spec)
    acts = [ACTIVATIONS[act], ACTIVATIONS["linear"]]

    def plain(ys):
        return acts[0](ys[0]) * ys[1]

    def program(product):
        def loss(x, w0, w1, wo):
            return jnp.sum(jnp.square((product([x @ w0, x @ w1]) @ wo.T).astype(jnp.float32)))
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(x, w, w, w).compile(
            gpu_target.compiler_options()).as_text()
        entry = text[text.index("\nENTRY "):]
        results = [m.group(1) for m in re.finditer(r" = (.*?) (?:fusion|custom-call)\(", entry)]
        hidden = sum(r.count("bf16[2048,1024]") for r in results)
        return hidden, gpu_program.totals(gpu_program.program_kernels(text))["bytes"]

    ours, ours_bytes = program(lambda ys: activated_product(acts, ys))
    theirs, theirs_bytes = program(plain)
    # h0, h1, the product forward; the product's gradient, dh0, dh1 backward
    assert ours == 6, ours
    if act == "gelu":  # plainly, tanh is written forward and read backward
        assert theirs == 7
        assert ours_bytes < theirs_bytes - 2 * 2048 * 1024 * 2 * 0.9
    else:  # XLA already recomputes SiLU's sigmoid: the same program's traffic
        assert theirs == 6 and ours_bytes <= theirs_bytes


def test_the_residual_stream_is_not_copied_around_the_gemms_on_a_gpu():
    """Three pre-norm sublayers x = x + norm(x) @ w, differentiated and compiled for an
    H200: with the add folded into each GEMM (cuBLAS's C operand, overwritten), XLA
    copies the stream first, since the next norm's backward keeps it; with
    `residual_add` in a training step without dropout nothing is copied and fewer bytes
    move."""
    from t5lite.models.common.layers import residual_add, rms_norm
    spec = _replicated_h200()
    # [batch, length, embed]: the GEMMs see it reshaped to [tokens, embed], and XLA
    # then lets the reshape's single use decide the stream may be overwritten
    x = jax.ShapeDtypeStruct((8, 256, 512), jnp.bfloat16, sharding=spec)
    w = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=spec)
    s = jax.ShapeDtypeStruct((512,), jnp.float32, sharding=spec)

    def program(training):
        def loss(x, ws, s):
            for w in ws:
                x = residual_add(x, rms_norm(x, s, 1e-6, jnp.bfloat16) @ w, 0.0,
                                 deterministic=not training)
            return jnp.sum(jnp.square(x.astype(jnp.float32)))
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, [w] * 3, s).compile(
            gpu_target.compiler_options()).as_text()
        entry = text[text.index("\nENTRY "):]
        copies = len(re.findall(r" = bf16\[2048,512\]\S* copy\(", entry))
        return copies, gpu_program.totals(gpu_program.program_kernels(text))["bytes"]

    (ours, ours_bytes), (plain, plain_bytes) = program(True), program(False)
    assert ours == 0 and plain == 3, (ours, plain)  # one a sublayer
    assert ours_bytes < plain_bytes - 3 * 2048 * 512 * 2, (ours_bytes, plain_bytes)


def test_gemms_reading_one_input_add_their_gradients_in_place_on_a_gpu():
    """Six GEMMs that read one [batch, length, embed] input, differentiated and compiled
    for an H200. Plainly, XLA folds the gradient sum into a GEMM (cuBLAS's C operand) only
    where the add's partial sum is not already such a GEMM's result, and adds the rest in
    kernels of their own; with `layers.gemm_input_views` every GEMM but one adds in place,
    no add kernel is left and fewer bytes move."""
    from t5lite.models.common.layers import gemm_input_views
    spec = _replicated_h200()
    n = 6
    x = jax.ShapeDtypeStruct((8, 256, 512), jnp.bfloat16, sharding=spec)
    w = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=spec)

    def program(views):
        def loss(x, ws):
            h = jnp.tanh(x)
            reads = gemm_input_views(h, n) if views else (h,) * n
            return sum(jnp.sum(jnp.square(jnp.tanh(r @ w).astype(jnp.float32)))
                       for r, w in zip(reads, ws))
        text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, [w] * n).compile(
            gpu_target.compiler_options()).as_text()
        entry = text[text.index("\nENTRY "):]
        in_place = len(re.findall(r"__cublas\$lt\$matmul.*output_to_operand_aliasing", entry))
        adds = len(re.findall(r" = bf16\[2048,512\]\S* fusion\(.*calls=%wrapped_add", entry))
        return in_place, adds, gpu_program.totals(gpu_program.program_kernels(text))["bytes"]

    (ours, ours_adds, ours_bytes), (plain, plain_adds, plain_bytes) = program(True), program(False)
    assert (ours, ours_adds) == (n - 1, 0), (ours, ours_adds)
    assert plain < n - 1 and plain_adds > 0, (plain, plain_adds)
    assert ours_bytes < plain_bytes - 2 * 2048 * 512 * 2, (ours_bytes, plain_bytes)


def test_the_losss_backward_is_one_pass_over_the_logits_on_a_gpu():
    """The weighted cross entropy of [tokens, vocab] bf16 logits (as the logits GEMM
    writes them), differentiated and compiled for an H200: with the gradient written out
    (`losses.cross_entropy_with_logits`) no scatter is left and the program moves a third
    of what autodiff of the gather makes (a zeroed float32 [tokens, vocab] array, the
    scatter into it, and their reads)."""
    from t5lite.models.common import losses
    spec = _replicated_h200()
    tokens, vocab = 2048, 8192
    logits = jax.ShapeDtypeStruct((tokens, vocab), jnp.bfloat16, sharding=spec)
    targets = jax.ShapeDtypeStruct((tokens,), jnp.int32, sharding=spec)

    def as_written(logits, targets):
        lse = jax.nn.logsumexp(logits, axis=-1)
        return lse - jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0], lse

    def program(loss_fn):
        def loss(logits, targets):
            tok, _ = loss_fn(logits.astype(jnp.float32), targets)
            return jnp.sum(tok)
        text = jax.jit(jax.grad(loss)).lower(logits, targets).compile(
            gpu_target.compiler_options()).as_text()
        entry = text[text.index("\nENTRY "):]
        return "scatter" in entry, gpu_program.totals(gpu_program.program_kernels(text))["bytes"]

    (ours_scatter, ours_bytes) = program(losses.cross_entropy_with_logits)
    (plain_scatter, plain_bytes) = program(as_written)
    assert plain_scatter and not ours_scatter
    array = tokens * vocab * 2  # the bf16 logits
    # the forward's reductions, then one read of the logits and one write of their gradient
    assert ours_bytes < 4.5 * array and plain_bytes > 2.5 * ours_bytes, (ours_bytes, plain_bytes)


def test_a_loop_over_stacked_layers_counts_each_layers_slice_and_update():
    """A scan over stacked weights [layers, n, n] compiled for an H200: each layer's
    GEMM (XLA's dynamic-slice fusion around cuBLAS) counts its FLOPs and reads one
    layer's weights, the activation kept for each layer writes its own slice of the
    stack, and the whole program moves about what the unrolled loop does (counted in
    full, each launch would read or write the whole stack)."""
    spec = _replicated_h200()
    layers, n, m = 8, 512, 2048
    ws = jax.ShapeDtypeStruct((layers, n, n), jnp.bfloat16, sharding=spec)
    x = jax.ShapeDtypeStruct((m, n), jnp.bfloat16, sharding=spec)

    def layer(h, w):
        h = jnp.tanh(h @ w)
        return h, h

    def unrolled(ws, x):
        hs = []
        for i in range(layers):
            x, _ = layer(x, ws[i])
            hs.append(x)
        return x, jnp.stack(hs)

    def kernels(f):
        text = jax.jit(f).lower(ws, x).compile(gpu_target.compiler_options()).as_text()
        return gpu_program.program_kernels(text)

    scanned = kernels(lambda ws, x: jax.lax.scan(layer, x, ws))
    gemms = [k for k in scanned if k.kind == "cublas gemm"]
    assert [k.count for k in gemms] == [layers]
    assert gemms[0].flops == 2 * m * n * n and "dot_general" in gemms[0].op_name
    assert gemms[0].bytes == 2 * (n * n + 2 * m * n) + 4  # + the layer's index
    updates = [k for k in scanned if "dynamic_update_slice" in k.op_name]
    assert updates and all(k.bytes <= 2 * 2 * m * n + 4 for k in updates)
    totals = gpu_program.totals(scanned)
    assert totals["flops"] == pytest.approx(layers * 2 * m * n * n, rel=0.01)
    assert totals["bytes"] < 1.3 * gpu_program.totals(kernels(unrolled))["bytes"]


def _report(gin_files, bindings, batch=4, lengths=None):
    parsing.parse_gin(gin_files, bindings, [], placeholders=parsing.RUN_PLACEHOLDERS)
    model = parsing.resolve_macro("MODEL", origin="test")
    optimizer, _ = benchmarking.run_optimizer()
    return gpu_report.gpu_step_report(model, optimizer, "h200", batch,
                                      lengths or {"inputs": 32, "targets": 16}, init=False)


def test_the_decoder_only_step_compiles_for_a_gpu_with_its_parts():
    """GPT tiny as the decoder-only recipes train it (packed sequences, cuDNN's attention
    with the mask as ids): each layer's attention is one cuDNN call each way, told the
    mask is causal (so it skips the blocks above the diagonal), its segments a [batch, 1,
    q, k] bias made once for every layer and head; no [batch, heads, q, k] array."""
    parsing.parse_gin(["configs/models/gpt/tiny.gin", "configs/runs/pretrain.gin"],
                      ["TASK_FEATURE_LENGTHS = {'targets': 32}", "ATTENTION_IMPL = 'cudnn'",
                       "ATTENTION_MASK = 'lengths'"], [], placeholders=parsing.RUN_PLACEHOLDERS)
    model = parsing.resolve_macro("MODEL", origin="test")
    layers, heads = model.config.num_layers, model.config.num_heads
    batch, length = 4, 32
    the_run = benchmarking.step_run(model, batch_size=batch, devices=gpu_target.gpu_devices(
        "h200"), task_feature_lengths={"targets": length},
        optimizer=benchmarking.run_optimizer()[0])
    compiled = step_memory.compile_train_step(
        the_run, step_memory.abstract_batch(the_run, {"targets": length}, pack=True),
        options=gpu_target.compiler_options(None), timings={})
    text = compiled.as_text()
    kernels = gpu_program.program_kernels(text)
    parts = {k.part for k in kernels}
    assert {"attention scores", "attention projections", "MLP", "layer norm",
            "logits and loss"} <= parts, parts
    calls = re.findall(r"custom_call_target=\"__cudnn\$fmha(\w+)\".*", text)
    assert len(calls) == 2 * layers, calls
    forward = [line for line in text.splitlines() if "__cudnn$fmhaScaleBiasSoftmax\"" in line]
    assert len(forward) == layers
    for line in forward:
        assert '"mask_type":"CAUSAL"' in line.replace(" ", ""), line[:300]
        assert f"bf16[{batch},1,{length},{length}]" in line  # the bias: one for every head
    assert f"[{batch},{heads},{length},{length}]" not in text
    biases = {re.search(r"custom-call\((?:[^,]*, ){3}%([\w.-]+)", line).group(1)
              for line in forward}
    assert len(biases) == 1, biases  # made once, read by every layer
    assert sum(k.flops for k in kernels) >= the_run.flops_per_example * batch * 0.95


def test_cudnn_attention_compiles_for_a_gpu_and_moves_fewer_bytes(info_h200):
    """ATTENTION_IMPL='cudnn' with the mask as lengths: cuDNN's fused attention forward
    and backward (no [batch, heads, q, k] tensor in memory), fewer bytes than the
    einsum attention on the same model (info's report of it, same batch and lengths:
    the SMALL_T5)."""
    base = ["configs/models/t5_1_1/tiny.gin", "configs/synthetic_pretrain.gin"]
    einsum = info_h200[1]["gpu_step"]
    assert einsum["task_feature_lengths"] == {"inputs": 32, "targets": 16}
    cudnn = _report(base, [*SMALL_T5, "ATTENTION_IMPL = 'cudnn'",
                           "ATTENTION_MASK = 'lengths'"], batch=einsum["batch_size"])
    kinds = {row["group"][0] for row in cudnn["kernels_by_kind"]}
    assert "cudnn attention" in kinds
    launches = {row["group"][0]: row["launches"] for row in cudnn["kernels_by_kind"]}
    # forward and backward for each of the 1 + 1 self- and 1 cross-attention layers
    assert launches["cudnn attention"] == 2 * 3
    scores = {r["group"][0]: r for r in einsum["kernels_by_part"] if r["group"][0] ==
              "attention scores"}
    assert cudnn["program_bytes"] < einsum["program_bytes"] - 0.5 * scores[
        "attention scores"]["bytes"]


def test_info_gpu_reports_compiles_memory_kernels_and_a_prediction(info_h200):
    proc, out = info_h200
    r = out["gpu_step"]
    assert r["device_kind"] == "NVIDIA H200 141GB HBM3e" and r["batch_size"] == 8
    assert r["step_compile_s"] > 0 and r["init_compile_s"] > 0
    assert r["memory"]["peak_bytes"] > r["memory"]["argument_bytes"] > 0
    assert r["program_flops"] == pytest.approx(r["model_flops"], rel=0.15)
    parts = {row["group"][0] for row in r["kernels_by_part"]}
    assert {"attention scores", "MLP", "layer norm", "embeddings and position bias"} <= parts
    assert sum(row["bytes"] for row in r["kernels_by_part"]) == r["program_bytes"]
    assert r["predicted_step_s"] == pytest.approx(
        sum(row["predicted_s"] for row in r["kernels_by_kind"]), rel=1e-9)
    for words in ("compiled for NVIDIA H200", "initializer", "predicted step",
                  "by part and kind", "attention scores"):
        assert words in proc.stderr


def test_info_gpu_memory_reads_the_reports_compiled_step(info_h200):
    """--gpu --memory: the memory table is the GPU report's compiled step, compiled once."""
    proc, out = info_h200
    mem, r = out["step_memory"], out["gpu_step"]
    assert {k: mem[k] for k in r["memory"]} == r["memory"] and "step_memory" not in r
    assert mem["device_kind"] == gpu_target.GPUS["h200"] and mem["devices"] == 1
    assert mem["batch_size"] == mem["per_device_batch"] == r["batch_size"]
    assert mem["device_bytes"] == r["device_memory_size"]
    assert mem["verdict"].startswith("fits in 141 GiB")
    assert "1 compile-only NVIDIA H200 141GB HBM3e devices" in proc.stderr
    assert proc.stderr.count("Finished XLA compilation of jit(step_fn)") == 1, proc.stderr


MEMORY_ARGS = ["--gin_file=configs/models/t5_1_1/tiny.gin",
               "--gin_file=configs/synthetic_pretrain.gin", *SMALL_T5_FLAGS, *LENGTHS,
               "--memory", "--devices=2", "--per_device_batch=2", "--json"]
MISTAKES = [
    (["--gpu=z100"], ["--gpu='z100'", "h100, h200"]),
    (["--gpu=h200", "--autotune_results=/nonexistent/a.textproto"], ["--autotune_results"]),
]


@pytest.fixture(scope="module")
def info_runs():
    """info's --memory for 2 H100s (the default where the extra is installed), then for
    2 simulated CPUs (--cpu_compiler), then each of MISTAKES, by info's main in one
    interpreter with 2 CPU devices (th.run_mains; `info_h200` is this file's real
    `python -m t5lite.info`): {"gpu": ..., "cpu": ..., "mistakes": [...]}, each a
    CompletedProcess (its returncode the status the command would exit with)."""
    base = ["--gin_file=configs/models/t5_1_1/tiny.gin",
            "--gin_file=configs/synthetic_pretrain.gin", *LENGTHS]
    argvs = [MEMORY_ARGS, MEMORY_ARGS + ["--cpu_compiler"]] + [base + a for a, _ in MISTAKES]
    procs = th.run_mains(argvs, devices=2, module="t5lite.info", cwd=th.REPO,
                         timeout=600)
    return {"gpu": procs[0], "cpu": procs[1], "mistakes": procs[2:]}


def test_info_memory_plans_for_a_gpu_where_the_extra_is_installed(info_runs):
    gpu = info_runs["gpu"]
    assert gpu.returncode == 0, gpu.stderr
    assert "2 compile-only NVIDIA H100 80GB HBM3 devices" in gpu.stderr
    cpu = info_runs["cpu"]
    assert cpu.returncode == 0, cpu.stderr
    assert "2 simulated CPU devices" in cpu.stderr
    gpu_mem, cpu_mem = (json.loads(p.stdout)["step_memory"] for p in (gpu, cpu))
    assert gpu_mem["argument_bytes"] == cpu_mem["argument_bytes"]  # the same sharded state
    assert gpu_mem["device_kind"] == gpu_target.GPUS["h100"] and cpu_mem["device_kind"] is None


def test_info_gpu_mistakes_are_one_line(info_runs):
    """Each of info's --gpu mistakes is one `error:` line and exit status 2: an unknown
    GPU, and an --autotune_results file that does not exist. (Run by info's main in the
    `info_runs` interpreter: a real subprocess would prove nothing more;
    tests/test_step_memory.py and tests/test_configs.py run info's one-line errors as real
    subprocesses.)"""
    for proc, (args, words) in zip(info_runs["mistakes"], MISTAKES):
        assert proc.returncode == 2, (args, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
        for word in words:
            assert word in lines[0]


_INIT_PROGRAMS = """
from t5lite.tools import gpu_target
gpu_target.use_cpu_platform()
import jax, jax.numpy as jnp
from t5lite.config import parsing
from t5lite.tools import benchmarking
parsing.parse_gin(["configs/models/t5_1_1/tiny.gin", "configs/synthetic_pretrain.gin"],
                  %r, [], placeholders=parsing.RUN_PLACEHOLDERS)
run = benchmarking.step_run(parsing.resolve_macro("MODEL", origin="test"),
                            devices=gpu_target.gpu_devices("h200"),
                            optimizer=benchmarking.run_optimizer()[0])
lowered = run.step_fns.init.lower(jax.ShapeDtypeStruct((2,), jnp.uint32))
def program(*options):
    text = lowered.compile(*options).as_text()
    return text[text.index("\\n"):]
lhs = "xla_gpu_enable_latency_hiding_scheduler"
as_run = program()
print(as_run == program({lhs: False}), as_run == program({lhs: True}),
      jax.config.jax_threefry_gpu_kernel_lowering,
      'custom_call_target="cu_threefry2x32' in program(gpu_target.compiler_options()))
""" % (SMALL_T5,)


def test_the_initializers_compile_options_and_threefry_gpu_kernel():
    """With the launchers' XLA_FLAGS (the latency-hiding scheduler on), the initializer (of
    the SMALL_T5: four compiles for an H200) compiles as the run compiles it with its own
    options (train_step.INIT_COMPILER_OPTIONS: the scheduler off), and that program is not
    the scheduled one.

    And, in the same process on the same lowered initializer (what
    test_the_initializer_draws_with_jax_threefry_gpu_kernel checked in its own build of
    the tiny T5's run): random bits on a GPU come from jax's threefry CUDA kernel (set by
    the partitioner as the run's mesh was made): compiled with `compiler_options()` the
    initializer calls it instead of unrolling the hash into its fusions, which is what
    made large's initializer compile in 4.7 s instead of 10.7 s for an H200."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"}
    out = subprocess.run([sys.executable, "-c", _INIT_PROGRAMS], capture_output=True,
                         text=True, env=env, cwd=th.REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False", "True", "True"]


def test_the_threefry_kernel_setting_leaves_an_explicit_environment_alone():
    code = ("import jax; from t5lite.runtime import partitioning as p; "
            "p.use_threefry_gpu_kernel(); print(jax.config.jax_threefry_gpu_kernel_lowering)")
    for env, expected in (({}, "True"), ({"JAX_THREEFRY_GPU_KERNEL_LOWERING": "0"}, "False")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=th.env(devices=1, extra=env), cwd=th.REPO, timeout=120)
        assert out.stdout.strip() == expected, out.stderr
