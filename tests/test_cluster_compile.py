"""A GPU cluster compiled for on this CPU (`info --gpu --hosts`): compile-only H100s over
several hosts, the program's collectives read from its HLO (`tools/hlo/collectives`: kind,
bytes, launches, the mesh axes their groups span, within a host or across), and the
uncalibrated communication term (`tools/comm_time`). A tiny GPT of 8 layers on 2 hosts of 4
GPUs, with a pipeline (its stages across the hosts) and without (FSDP across them).

Both layouts scan their layers (the pipeline's stages do; FSDP's unrolled 8 layers took
twice as long to compile for the GPUs), and the vocabulary is cut to 512 (50,304 as
shipped): the tied embedding's traffic no longer outweighs the layers' in the bytes
compared across hosts, and the collectives' kinds, axes and launches do not depend on it."""
import json
import sys

import pytest

import train_helpers as th
from t5lite.tools import comm_time
from t5lite.tools.hlo import collectives

GPT8 = ["--gin_file=configs/models/gpt/tiny.gin", "--gin_file=configs/synthetic_pretrain.gin",
        "--gin.DecoderConfig.num_layers=8", "--gin.DecoderConfig.vocab_size=512",
        "--gin.BATCH_SIZE=16", "--seq_length=64",
        "--gpu=h100", "--hosts=2", "--gpus_per_host=4", "--json"]
LAYOUTS = {
    "pipeline": ["--gin.PIPELINE_MICROBATCHES=4", "--gin.SCAN_LAYERS=True",
                 "--gin.ICI_MESH_SHAPE=[1, 2, 1, 1, 2]", "--gin.DCN_MESH_SHAPE=[1, 1, 1, 1, 2]"],
    "fsdp": ["--gin.SCAN_LAYERS=True", "--gin.ICI_MESH_SHAPE=[1, 4, 1]",
             "--gin.DCN_MESH_SHAPE=[1, 2, 1]"],
}

_BOTH = r"""
import json, sys
from t5lite import info
for argv in json.loads(sys.argv[1]):
    status = info.main(argv)
    print("STATUS", status, flush=True)
"""


@pytest.fixture(scope="module")
def reports():
    """Both layouts' `info --json` reports, compiled in one process (~10 s each)."""
    argvs = [GPT8 + flags for flags in LAYOUTS.values()]
    proc = th.run([sys.executable, "-c", _BOTH, json.dumps(argvs)], devices=1, cwd=th.REPO,
                  timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(found) == 2, proc.stdout[-2000:]
    return dict(zip(LAYOUTS, (r["gpu_step"] for r in found)))


def _rows(report, kind, axes):
    return [r for r in report["collectives"] if r["kind"] == kind and r["mesh_axes"] == axes]


def test_a_pipeline_over_two_hosts_moves_activations_between_them(reports):
    r = reports["pipeline"]
    assert r["devices"] == 8 and r["hosts"] == 2
    assert r["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1, "stage": 4, "context": 1}
    assert r["pipeline"] == {"stages": 4, "microbatches": 4, "repeats": 1,
                             "bubble": pytest.approx(3 / 7)}
    moves = _rows(r, "collective-permute", ["stage"])
    assert moves and all(m["across_hosts"] for m in moves)  # stage 1 -> 2 crosses hosts
    # each of the M + S - 1 iterations: the activations to the next stage and the io
    # buffer's rotation by one stage; forward and backward
    assert sum(m["launches"] for m in moves) == 2 * 2 * (4 + 4 - 1)
    # the layers' weights are gathered over fsdp (within a host); over stages, only the
    # activations of the pipeline's input, once a step
    assert any(not g["across_hosts"] for g in _rows(r, "all-gather", ["fsdp"]))
    assert all(g["launches"] <= 2 for g in r["collectives"] if g["kind"] == "all-gather"
               and "stage" in g["mesh_axes"])
    assert r["predicted_comm_s"] > 0 and r["across_hosts_bytes"] > 0
    assert r["predicted_step_with_comm_s"] == pytest.approx(
        r["predicted_step_s"] + r["predicted_comm_s"])
    assert r["memory"]["peak_bytes"] > 0


def test_fsdp_over_two_hosts_gathers_weights_across_them(reports):
    r = reports["fsdp"]
    assert r["mesh"]["fsdp"] == 8 and r["mesh"]["stage"] == 1 and r["hosts"] == 2
    assert r["pipeline"]["stages"] == 1 and r["pipeline"]["bubble"] == 0
    gathers = _rows(r, "all-gather", ["fsdp"])
    assert gathers and all(g["across_hosts"] for g in gathers)
    assert not [c for c in r["collectives"] if "stage" in c["mesh_axes"]]
    # the pipeline keeps each layer's weights on its stage's hosts: less crosses them
    assert r["across_hosts_bytes"] > reports["pipeline"]["across_hosts_bytes"]


def test_info_hosts_needs_a_gpu():
    proc = th.run([sys.executable, "-m", "t5lite.info", "--gin_file=configs/models/gpt/tiny.gin",
                   "--hosts=2"], devices=1, cwd=th.REPO, timeout=300)
    th.assert_one_error(proc, "--hosts compiles for a GPU cluster", "--gpu=h100")


# ----------------------------------------------------------------------------- the reader

HLO = """HloModule jit_step, num_partitions=8

%body (p: (s32[], f32[4,16])) -> (s32[], f32[4,16]) {
  %p = (s32[], f32[4,16]) parameter(0)
  %x = f32[4,16]{1,0} get-tuple-element(%p), index=1
  %cp = f32[4,16]{1,0} collective-permute(%x), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}, metadata={op_name="ppermute"}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[4,16]) tuple(%i, %cp)
}

ENTRY %main (a: f32[4,16]) -> f32[8,16] {
  %a = f32[4,16]{1,0} parameter(0)
  %ag = (f32[4,16]{1,0}, f32[8,16]{1,0}) all-gather-start(%a), channel_id=2, replica_groups=[4,2]<=[8], dimensions={0}, metadata={op_name="gather"}
  %agd = f32[8,16]{1,0} all-gather-done(%ag)
  %ar = f32[4,16]{1,0} all-reduce(%a), channel_id=3, replica_groups=mesh['fsdp'=2,'stage'=4] {'stage'}, to_apply=%add
  %rs = f32[1,16]{1,0} reduce-scatter(%a), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %w = (s32[], f32[4,16]) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"7"}}
  ROOT %r = f32[8,16]{1,0} copy(%agd)
}
"""


def test_collectives_are_read_from_the_hlo():
    found = {c.kind: c for c in collectives.program_collectives(HLO)}
    mesh = {"fsdp": 2, "stage": 4}  # partition id = fsdp * 4 + stage
    gather = found["all-gather"]
    assert gather.bytes == 8 * 16 * 4 and gather.groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert collectives.group_axes(gather.groups, mesh) == ("stage",)
    assert gather.link_bytes() == pytest.approx(0.5 * 8 * 16 * 4)
    reduce = found["all-reduce"]
    assert reduce.groups == [[0, 1, 2, 3], [4, 5, 6, 7]]  # stage varies within each
    assert collectives.group_axes(reduce.groups, mesh) == ("stage",)
    assert reduce.link_bytes() == pytest.approx(2 * 0.75 * 4 * 16 * 4)
    scatter = found["reduce-scatter"]
    assert scatter.bytes == 4 * 16 * 4  # its operand: the result times the group
    permute = found["collective-permute"]
    assert permute.count == 7 and permute.bytes == 4 * 16 * 4
    assert collectives.group_axes(permute.groups, mesh) == ("stage",)
    hosts = [0, 0, 0, 0, 1, 1, 1, 1]
    assert collectives.spans_hosts(permute.groups, [0, 0, 1, 1, 0, 0, 1, 1])
    assert not collectives.spans_hosts(reduce.groups, hosts)


def test_the_communication_term_uses_the_link_a_group_crosses():
    one_gb = collectives.Collective("x", "all-gather", 10 ** 9, [[0, 1, 2, 3, 4, 5, 6, 7]])
    kind = "NVIDIA H100 80GB HBM3"
    within = comm_time.collective_rows([one_gb], {"fsdp": 8}, [0] * 8, kind)[0]
    across = comm_time.collective_rows([one_gb], {"fsdp": 8}, [0] * 4 + [1] * 4, kind)[0]
    assert within["predicted_s"] == pytest.approx(7 / 8 * 1e9 / 450e9)
    assert across["predicted_s"] == pytest.approx(7 / 8 * 1e9 / 50e9) and across["across_hosts"]
    assert comm_time.bandwidths("NVIDIA A100-SXM4-80GB") == (300e9, 25e9)
    total = comm_time.summary([within, across])
    assert total["predicted_comm_s"] == pytest.approx(within["predicted_s"] + across["predicted_s"])
