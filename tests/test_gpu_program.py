"""The kernel account of a GPU program (`tools.hlo.gpu_program`) and the predicted step time
(`tools.step_time`), on HLO written by hand (every number below is counted by hand) and
on a program XLA compiled for an H200 here, checked against XLA's own cost analysis."""
import json

import pytest

from t5lite.tools.hlo import gpu_program as gp
from t5lite.tools import step_time

HLO = r'''HloModule jit_step_fn, is_scheduled=true

FileNames
1 "/site-packages/optax/_src/transform.py"
2 "/t5lite/runtime/train_step.py"
3 "/site-packages/optax/tree_utils/_tree_math.py"

FunctionNames
1 "scale_by_adam.<locals>.update_fn"
2 "make_train_step.<locals>.step_fn"
3 "tree_norm"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=20 end_line=20 column=1 end_column=2}
3 {file_name_id=3 function_name_id=3 line=30 end_line=30 column=1 end_column=2}

StackFrames
1 {file_location_id=2 parent_frame_id=0}
2 {file_location_id=1 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=2}


%fused_mul (p0: f32[4,8], p1: f32[4,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[4,8]{1,0} parameter(1)
  ROOT %m = f32[4,8]{1,0} multiply(%p0, %p1), metadata={op_name="jit(step_fn)/jvp(T5)/T5.encode/encoder/layers_3/mlp/mul"}
}

%gemm_comp (p0.1: bf16[16,32], p1.1: bf16[32,8]) -> bf16[16,8] {
  %p0.1 = bf16[16,32]{1,0} parameter(0)
  %p1.1 = bf16[32,8]{1,0} parameter(1)
  ROOT %dot.1 = bf16[16,8]{1,0} dot(%p0.1, %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_update (p0.2: f32[4,8]) -> f32[4,8] {
  %p0.2 = f32[4,8]{1,0} parameter(0)
  %c = f32[] constant(2)
  %b = f32[4,8]{1,0} broadcast(%c), dimensions={}
  %s = f32[4,8]{1,0} subtract(%p0.2, %b), metadata={op_name="jit(step_fn)/sub" stack_frame_id=2}
  ROOT %e = f32[4,8]{1,0} exponential(%s), metadata={op_name="jit(step_fn)/exp" stack_frame_id=2}
}

%fused_norm_update (p0.3: f32[4,8]) -> (f32[4,8], f32[]) {
  %p0.3 = f32[4,8]{1,0} parameter(0)
  %n = f32[4,8]{1,0} multiply(%p0.3, %p0.3), metadata={op_name="jit(step_fn)/reduce_sum" stack_frame_id=3}
  %z = f32[] constant(0)
  %rs = f32[] reduce(%n, %z), dimensions={0,1}, to_apply=%cond, metadata={op_name="jit(step_fn)/reduce_sum" stack_frame_id=3}
  %up = f32[4,8]{1,0} add(%p0.3, %p0.3), metadata={op_name="jit(step_fn)/add" stack_frame_id=2}
  ROOT %t2 = (f32[4,8]{1,0}, f32[]) tuple(%up, %rs)
}

%body (param: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %param = (s32[], f32[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%param), index=0
  %x = f32[4,8]{1,0} get-tuple-element(%param), index=1
  %f = f32[4,8]{1,0} fusion(%x, %x), kind=kLoop, calls=%fused_mul, metadata={op_name="jit(step_fn)/jvp(T5)/T5.encode/encoder/layers_3/mlp/mul"}
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %f)
}

%cond (param.1: (s32[], f32[4,8])) -> pred[] {
  %param.1 = (s32[], f32[4,8]{1,0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main.9 (a: bf16[16,32], b: bf16[32,8], q: bf16[2,64,4,16], k: bf16[2,32,4,16], v: bf16[2,32,4,16], x: f32[4,8]) -> f32[] {
  %a = bf16[16,32]{1,0} parameter(0)
  %b = bf16[32,8]{1,0} parameter(1)
  %q = bf16[2,64,4,16]{3,2,1,0} parameter(2)
  %k = bf16[2,32,4,16]{3,2,1,0} parameter(3)
  %v = bf16[2,32,4,16]{3,2,1,0} parameter(4)
  %x = f32[4,8]{1,0} parameter(5)
  %g = bf16[16,8]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_comp, metadata={op_name="jit(step_fn)/transpose(jvp(T5))/T5.encode/encoder/layers_0/attention/out/dot_general"}
  %cc = (bf16[16,8]{1,0}, s8[1024]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step_fn)/jvp(T5)/T5.decode/decoder/layers_1/mlp/wi_0/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %fa = (bf16[2,64,4,16]{3,2,1,0}, f32[2,4,64]{2,1,0}, u8[256]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaScaleBiasSoftmax", metadata={op_name="jit(step_fn)/jvp(T5)/T5.encode/encoder/layers_0/attention/attention._dot_product_attention/dot_product_attention"}
  %t0 = (s32[], f32[4,8]{1,0}) tuple(%a, %x)
  %w = (s32[], f32[4,8]{1,0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"6"}}
  %u = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_update
  %nu = (f32[4,8]{1,0}, f32[]) fusion(%x), kind=kInput, calls=%fused_norm_update
  %bc = f32[4,8]{1,0} bitcast(%u)
  ROOT %r = f32[] reduce(%bc, %bc), dimensions={0,1}, to_apply=%cond, metadata={op_name="jit(step_fn)/reduce_sum" stack_frame_id=3}
}
'''


@pytest.fixture(scope="module")
def kernels():
    return {k.name: k for k in gp.program_kernels(HLO)}


def test_every_launch_is_a_kernel_and_nothing_else(kernels):
    # parameters, tuples, bitcasts, get-tuple-elements and the while itself launch nothing
    assert sorted(kernels) == ["cc", "f", "fa", "g", "nu", "r", "u"]
    assert kernels["f"].count == 6 and all(k.count == 1 for n, k in kernels.items() if n != "f")


def test_bytes_are_operands_plus_results_without_scratch(kernels):
    gemm = 16 * 32 * 2 + 32 * 8 * 2 + 16 * 8 * 2
    assert kernels["g"].bytes == gemm
    assert kernels["cc"].bytes == gemm               # the s8[1024] workspace left out
    qkv = 2 * 64 * 4 * 16 * 2 + 2 * (2 * 32 * 4 * 16 * 2)
    assert kernels["fa"].bytes == qkv + 2 * 64 * 4 * 16 * 2 + 2 * 4 * 64 * 4  # no u8[256]
    assert kernels["f"].bytes == 3 * 4 * 8 * 4
    assert kernels["r"].bytes == 2 * 4 * 8 * 4 + 4
    totals = gp.totals(kernels.values())
    assert totals["launches"] == 6 + 6
    assert totals["bytes"] == sum(k.bytes * k.count for k in kernels.values())


def test_flops_of_matmuls_attention_and_elementwise(kernels):
    assert kernels["g"].flops == 2 * 16 * 8 * 32 and kernels["g"].kind == "gemm fusion"
    assert kernels["cc"].flops == 2 * 16 * 8 * 32 and kernels["cc"].kind == "cublas gemm"
    # q [2, 64, 4, 16], k [2, 32, ...]: QK^T and PV, 2 * B * H * Sq * Sk * D each
    assert kernels["fa"].flops == 2 * (2 * 2 * 4 * 64 * 32 * 16)
    assert kernels["fa"].kind == "cudnn attention"
    assert kernels["f"].flops == 32 and kernels["f"].kind == "loop fusion"
    assert kernels["u"].flops == 2 * 32           # subtract and exp; broadcast is free


def test_parts_and_phases_from_op_names_and_source(kernels):
    assert (kernels["g"].part, kernels["g"].phase) == ("attention projections", "backward")
    assert (kernels["cc"].part, kernels["cc"].phase) == ("MLP", "forward")
    assert kernels["fa"].part == "attention scores"
    assert kernels["f"].part == "MLP"
    # no op_name of its own: the fused instructions' (optax's update, from its frames)
    assert (kernels["u"].part, kernels["u"].phase) == ("optimizer update", "update")
    assert kernels["r"].part == "norms and metrics"   # tree_norm called from step_fn
    # named after its norm's reduce (2 of its 3 ops), but it updates: the optimizer's
    assert gp.op_path(kernels["nu"].op_name) == "reduce_sum"
    assert kernels["nu"].part == "optimizer update"
    assert gp.op_path(kernels["f"].op_name) == "jvp(T5)/T5.encode/encoder/layers_N/mlp/mul"
    norm = "jit(step_fn)/jvp(T5)/T5.encode/encoder/layers_2/pre_attention_layer_norm/mul"
    assert gp._part(norm, []) == "layer norm"
    assert gp._part("jit(step_fn)/jvp(T5)/T5.decode/decoder/layers_1/encoder_decoder_attention"
                    "/kv/dot_general", []) == "attention projections"


def test_predicted_time_is_the_roofline_sum(kernels):
    gpu = {"peak_flops": 1e15, "memory_bandwidth": 4e12}
    ks = list(kernels.values())
    expected = 0.0
    for k in ks:
        rate = (1e15 * 0.5 if k.kind in step_time.MATRIX_KINDS else step_time.VECTOR_PEAK_FLOPS)
        memory = k.bytes / (4e12 * step_time.MEMORY_EFFICIENCY)
        expected += (max(k.flops / rate, memory) + step_time.LAUNCH_S) * k.count
    assert step_time.predict(ks, gpu, 0.5) == pytest.approx(expected, rel=1e-12)
    parts = step_time.breakdown(ks, gpu, 0.5)
    assert sum(parts.values()) == pytest.approx(expected, rel=1e-12)
    assert parts["launch_s"] == pytest.approx(12 * step_time.LAUNCH_S)
    # a big GEMM is compute-bound, and halving the efficiency doubles its time
    big = gp.Kernel("big", "cublas gemm", "MLP", "forward", "", 2e12, 10**6)
    assert step_time.predict([big], gpu, 0.25) - step_time.LAUNCH_S == pytest.approx(
        2 * (step_time.predict([big], gpu, 0.5) - step_time.LAUNCH_S))


def test_the_calibration_constant_is_the_fit_of_the_measured_rows():
    """GEMM_EFFICIENCY is what fit_gemm_efficiency gives on the committed rows (their
    kernels as compiled here), and each row's error is the one stated beside it."""
    rows = step_time.calibration_rows()
    assert len(rows) >= 2 and all(r["measured_s"] > 0 for r in rows)
    cases = [{"kernels": step_time.row_kernels(r), "gpu": r["gpu_facts"],
              "measured_s": r["measured_s"]} for r in rows]
    assert step_time.fit_gemm_efficiency(cases) == pytest.approx(step_time.GEMM_EFFICIENCY)
    for row, case in zip(rows, cases):
        predicted = step_time.predict(case["kernels"], case["gpu"])
        assert predicted / row["measured_s"] - 1 == pytest.approx(row["error"], abs=5e-4)
        assert abs(row["error"]) <= 0.2, row["name"]
