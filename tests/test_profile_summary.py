"""The step profile's summary (`t5lite.tools.profile_summary`): a trace's XLA op events
read without TensorFlow (a GPU's device plane wins over the host's launches, only the
step's module and one device count), the compiled HLO naming what each op is and the
model code it came from, and the tiny T5's step traced on the CPU end to end."""
import json

from jax.profiler import ProfileData

import train_helpers as th
from t5lite.tools import profile_summary


def _event(metadata, microseconds, op, module="jit_step_fn"):
    return (f'events {{ metadata_id: {metadata} offset_ps: 0 '
            f'duration_ps: {int(microseconds * 1e6)} '
            f'stats {{ metadata_id: 1 str_value: "{op}" }} '
            f'stats {{ metadata_id: 2 str_value: "{module}" }} }}')


_STATS = ('stat_metadata { key: 1 value { id: 1 name: "hlo_op" } } '
          'stat_metadata { key: 2 value { id: 2 name: "hlo_module" } }')


def test_device_plane_wins_and_only_the_steps_own_ops_count():
    """A GPU trace's shape: kernels on the device plane's stream lines (an op may launch
    several), a derived "XLA Ops" line summarizing them, another module's kernels, and
    the host's thunk launches: only the step's kernels on the device count, once."""
    stream = " ".join([_event(1, 100, "fusion.1"), _event(2, 50, "custom-call.2"),
                       _event(1, 30, "fusion.1"), _event(1, 999, "fusion.9", "jit_init")])
    trace = ProfileData.from_text_proto(f"""
      planes {{ name: "/device:GPU:0"
        lines {{ name: "Stream #13(Compute)" {stream} }}
        lines {{ name: "XLA Ops" {_event(1, 130, "fusion.1")} }}
        event_metadata {{ key: 1 value {{ id: 1 name: "loop_fusion_kernel" }} }}
        event_metadata {{ key: 2 value {{ id: 2 name: "nvjet_gemm" }} }} {_STATS} }}
      planes {{ name: "/host:CPU"
        lines {{ name: "python" {_event(1, 5000, "fusion.1")} }}
        event_metadata {{ key: 1 value {{ id: 1 name: "Thunk" }} }} {_STATS} }}""")
    ops, where = profile_summary.op_events(trace, module="jit_step_fn")
    assert where == "/device:GPU:0, device 0"
    assert {n: (o.count, o.total_ns) for n, o in ops.items()} == {
        "fusion.1": (2, 130_000.0), "custom-call.2": (1, 50_000.0)}
    hlo = {"fusion.1": ("fusion kLoop", "fwd encoder/mlp/mul"),
           "custom-call.2": ("custom-call __cublas$gemm", "bwd encoder/mlp/dot_general")}
    report = profile_summary.summarize(ops, hlo, steps=2, wall_s=[0.0002, 0.0002])
    first = report["top"][0]
    assert (first["name"], first["count"], first["total_ms"]) == ("fusion.1", 1, 0.065)
    assert round(first["percent"], 1) == 72.2 and first["mean_us"] == 65.0
    assert report["op_ms"] == 0.09 and round(report["wall_ms"], 3) == 0.2
    assert [c["name"] for c in report["categories"]] == ["fusion kLoop",
                                                         "custom-call __cublas$gemm"]


HLO = """HloModule jit_step_fn, is_scheduled=true
ENTRY %main.341 (p: f32[64]) -> f32[4] {
  %ynn_fusion.271 = bf16[128,32128]{1,0} fusion(%a, %b), kind=kCustom, calls=%f.271, metadata={op_name="jit(step_fn)/jvp(T5)/T5.decode/decoder/logits_dense/dot_general" stack_frame_id=397}, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
  %iota_reduce_fusion = (f32[4,32]{1,0}, s32[4,32]{1,0}) fusion(%ynn_fusion.271), kind=kLoop, calls=%f.860, metadata={op_name="jit(step_fn)/jvp()/reduce"}
  %cublas-gemm.3 = (bf16[8,8]{1,0}, s8[0]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step_fn)/transpose(jvp(T5))/T5.encode/encoder/layers_3/mlp/wo/dot_general"}
  ROOT %multiply.5 = f32[4]{0} multiply(%c, %d), metadata={op_name="jit(step_fn)/mul"}
}"""


def test_hlo_text_says_what_each_op_is_and_where_it_came_from():
    ops = profile_summary.hlo_ops(HLO)
    assert ops == {
        "ynn_fusion.271": ("fusion __ynn_fusion", "fwd decoder/logits_dense/dot_general"),
        "iota_reduce_fusion": ("fusion kLoop", "fwd reduce"),
        "cublas-gemm.3": ("custom-call __cublas$lt$matmul",
                          "bwd encoder/layers_3/mlp/wo/dot_general"),
        "multiply.5": ("multiply", "step mul")}


def test_tiny_step_on_the_cpu(tmp_path, capsys):
    """The command on the tiny T5: its step's ops read from the host plane (one of the
    test's 8 CPU devices), each known to the compiled HLO, the table and JSON written."""
    out, report_json = tmp_path / "profile.txt", tmp_path / "profile.json"
    status = profile_summary.main([
        f"--gin_file={th.REPO}/configs/models/t5_1_1/tiny.gin",
        f"--gin_file={th.REPO}/{th.SYNTHETIC}", th.SMALL_FEATURES, "--gin.BATCH_SIZE=8",
        "--warmup=1", "--top=10", f"--out={out}", f"--json_out={report_json}"])
    assert status == 0
    report = json.loads(report_json.read_text())
    assert report["planes"] == "/host:CPU, device 0" and report["steps"] == 1
    assert len(report["top"]) == 10 and report["distinct_ops"] > 50
    assert all(row["what"] and row["total_ms"] > 0 for row in report["top"])
    assert sum(r["percent"] for r in report["categories"]) > 99.9
    assert {row["where"].split()[0] for row in report["top"] if row["where"]} <= {
        "fwd", "bwd", "step"}
    assert report["op_ms"] > 0 and report["wall_ms"] > 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    lines = text.splitlines()
    assert "traced step(s)" in lines[0] and "(the top 10: " in lines[1]
    assert lines[2].split()[:3] == ["#", "op", "what"] and lines[12].startswith("10  ")
    assert "by kind" in text and "fusion" in text
