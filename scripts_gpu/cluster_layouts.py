"""Compile the largest configs for whole GPU clusters on this machine (no GPU) as
`python -m t5lite.info --gpu=h100 --hosts=H --gpus_per_host=8 --json` does, each layout
in a process of its own, keep each report as JSON and print the markdown table of
docs/parallelism.md, "Layouts for the big configs".

    python scripts_gpu/cluster_layouts.py OUT_DIR [NAME_PATTERN ...]   # rows named, else all

Every number is predicted (a compile here, nothing run): memory a device from XLA's plan
for the compiled program, collectives from its HLO (`tools/hlo/collectives`), the step from
the one-GPU roofline (`tools/step_time`) plus the uncalibrated communication term
(`tools/comm_time`). Rows already in OUT_DIR are read, not compiled again.
"""
import fnmatch
import json
import os
import subprocess
import sys

GPT175B = ["configs/gpt175b_pile_pretrain.gin"]
LLAMA70B = ["configs/llama2_70b_pile_pretrain.gin"]
GLAM64B = ["configs/glam64b_64e_pile_pretrain.gin"]
T5XXL = ["configs/xxl_pile_pretrain.gin"]
NO_PIPELINE = ["PIPELINE_MICROBATCHES=None", "PIPELINE_REPEATS=1"]

ROWS = [  # name, gin files, hosts, bindings (each row states its whole layout), info flags
    # GPT-3 175B on 128 H100s, global batch 256 of 2048 tokens, unpacked in every row (cuDNN's
    # attention takes lengths; packed rows' masks do not run in a pipeline)
    ("gpt175b_fsdp128", GPT175B, 16, NO_PIPELINE + [
        "ICI_MESH_SHAPE=[1,8,1]", "DCN_MESH_SHAPE=[1,16,1]", "NUM_MICROBATCHES=1",
        "PACK=False"], []),
    ("gpt175b_tp8_fsdp16", GPT175B, 16, NO_PIPELINE + [  # the recipe's layout
        "ICI_MESH_SHAPE=[1,1,8]", "DCN_MESH_SHAPE=[1,16,1]", "NUM_MICROBATCHES=4",
        "PACK=False"], []),
    ("gpt175b_tp8_pp16", GPT175B, 16, [
        "PIPELINE_MICROBATCHES=64", "PIPELINE_REPEATS=1", "ICI_MESH_SHAPE=[1,1,8]",
        "DCN_MESH_SHAPE=[1,1,1,1,16]", "NUM_MICROBATCHES=1", "PACK=False"], []),
    ("gpt175b_tp8_pp16_circular", GPT175B, 16, [
        "PIPELINE_MICROBATCHES=32", "PIPELINE_REPEATS=2", "ICI_MESH_SHAPE=[1,1,8]",
        "DCN_MESH_SHAPE=[1,1,1,1,16]", "NUM_MICROBATCHES=1", "PACK=False"], []),
    # LLaMA-2 70B on 64 H100s, global batch 128 of 4096 tokens
    ("llama70b_fsdp64", LLAMA70B, 8, NO_PIPELINE + [
        "ICI_MESH_SHAPE=[1,8,1]", "DCN_MESH_SHAPE=[1,8,1]", "PACK=True"], []),
    ("llama70b_tp8_fsdp8", LLAMA70B, 8, NO_PIPELINE + [  # the recipe's layout
        "ICI_MESH_SHAPE=[1,1,8]", "DCN_MESH_SHAPE=[1,8,1]", "PACK=True"], []),
    ("llama70b_tp8_pp8", LLAMA70B, 8, [
        "PIPELINE_MICROBATCHES=32", "PIPELINE_REPEATS=1", "ICI_MESH_SHAPE=[1,1,8]",
        "DCN_MESH_SHAPE=[1,1,1,1,8]", "PACK=False"], []),
    # GLaM 64B/64E on 512 GPUs, global batch 1024 of 1024 tokens, packed
    ("glam64b_ep64_fsdp8", GLAM64B, 64, NO_PIPELINE + [  # the recipe's layout
        "ICI_MESH_SHAPE=[1,1,1,8]", "DCN_MESH_SHAPE=[1,8,1,8]", "PARTITION_RULES=[]"], []),
    # the default rules shard the dense layers' weights over the expert axis too (FSDP
    # over the experts): inside a pipeline that gathers them again for every microbatch
    ("glam64b_ep64_pp8_fsdp_experts", GLAM64B, 64, [
        "PIPELINE_MICROBATCHES=16", "ICI_MESH_SHAPE=[1,1,1,8]", "DCN_MESH_SHAPE=[1,1,1,8,8]",
        "PARTITION_RULES=[]"], []),
    ("glam64b_ep64_pp8", GLAM64B, 64, [  # the dense layers' weights whole in each stage
        "PIPELINE_MICROBATCHES=16", "ICI_MESH_SHAPE=[1,1,1,8]", "DCN_MESH_SHAPE=[1,1,1,8,8]",
        "PARTITION_RULES=[('embed', 'fsdp')]"], []),
    # T5 XXL on 512 GPUs, T5X's global batch 2304 (no pipeline: docs/parallelism.md)
    ("t5xxl_tp8_dp64", T5XXL, 64, ["BATCH_SIZE=2304", "ICI_MESH_SHAPE=[1,1,8]",
                                   "DCN_MESH_SHAPE=[64,1,1]"], []),
    ("t5xxl_tp8_fsdp64", T5XXL, 64, ["BATCH_SIZE=2304", "ICI_MESH_SHAPE=[1,1,8]",
                                     "DCN_MESH_SHAPE=[1,64,1]"], []),
]


def compile_row(out_dir: str, name, gin_files, hosts, bindings, flags) -> dict:
    path = os.path.join(out_dir, f"{name}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    cmd = [sys.executable, "-m", "t5lite.info", "--gpu=h100", f"--hosts={hosts}",
           "--gpus_per_host=8", "--json", *[f"--gin_file={g}" for g in gin_files],
           *[f"--gin.{b}" for b in bindings], *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    report["command"] = "python -m t5lite.info " + " ".join(cmd[3:])
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    return report


def row_line(name: str, report: dict) -> str:
    g = report["gpu_step"]
    mesh = " ".join(f"{a} {n}" for a, n in g["mesh"].items() if n > 1)
    pipe = g["pipeline"]
    bubble = (f"{pipe['bubble']:.0%} ({pipe['stages']} x {pipe['microbatches']} x "
              f"{pipe['repeats']})" if pipe["stages"] > 1 else "-")
    memory = g["memory"]["peak_bytes"] / 2 ** 30
    fits = "" if memory <= g["device_memory_size"] / 2 ** 30 else " (does not fit)"
    return (f"| {name} | {mesh} | {memory:,.1f} GiB{fits} | {bubble} | "
            f"{g['across_hosts_bytes'] / 1e9:,.1f} / {g['within_hosts_bytes'] / 1e9:,.1f} | "
            f"{g['predicted_step_s']:,.2f} | {g['predicted_comm_s']:,.2f} | "
            f"{g['predicted_step_overlapped_s']:,.2f} - {g['predicted_step_with_comm_s']:,.2f} |")


def main(argv) -> int:
    out_dir, patterns = argv[0], argv[1:] or ["*"]
    os.makedirs(out_dir, exist_ok=True)
    print("| layout | mesh | memory a device | bubble (S x M x R) | GB sent a device across / "
          "within hosts | compute s | communication s | step s (overlapped - not) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, *row in ROWS:
        if any(fnmatch.fnmatch(name, p) for p in patterns):
            print(row_line(name, compile_row(out_dir, name, *row)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
