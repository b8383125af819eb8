"""Compile configurations for an H100 / H200 on this machine (no GPU) with
`python -m t5lite.info --gpu --json`, keep each report as JSON and print a markdown table:
the numbers of docs/performance.md, "Compiled for a GPU on this machine".

    python scripts_gpu/aot_table.py OUT_DIR [NAME_PATTERN ...]   # rows named, else all

Each row is a shipped recipe at one GPU's batch, as shipped or with the switches named;
"2026-11-26" rows pin the settings the recipes had when the first H200 numbers were
measured. The reports (compile times, memory, kernels by part and kind, the predicted
step) go to OUT_DIR/NAME.json; rows already there are read, not compiled again.
"""
import fnmatch
import json
import os
import subprocess
import sys

OLD = ["ATTENTION_IMPL='xla'", "ATTENTION_MASK='dense'", "FUSE_QKV=False",
       "ATTENTION_LOGITS_DTYPE='float32'"]
"""The Pile recipes' switches as measured on 2026-11-26 (before they became defaults)."""

RECIPES = {"small": ("configs/small_pile_pretrain.gin", 128),
           "base": ("configs/base_pile_pretrain.gin", 64),
           "large": ("configs/large_pile_pretrain.gin", 32)}

ROWS = []
for gpu in ("h200", "h100"):
    for model, (recipe, batch) in RECIPES.items():
        ROWS.append((f"{model}_b{batch}_{gpu}_2026-11-26", gpu, recipe, batch, OLD, True))
        ROWS.append((f"{model}_b{batch}_{gpu}", gpu, recipe, batch, [], True))
SWITCHES = {  # each on the 2026-11-26 settings of large, then together
    "bf16_scores": ["ATTENTION_LOGITS_DTYPE='bfloat16'"],
    "fused_qkv": ["FUSE_QKV=True"],
    "cudnn": ["ATTENTION_IMPL='cudnn'"],
    "cudnn_lengths": ["ATTENTION_IMPL='cudnn'", "ATTENTION_MASK='lengths'"],
    "cudnn_lengths_fused_qkv": ["ATTENTION_IMPL='cudnn'", "ATTENTION_MASK='lengths'",
                                "FUSE_QKV=True"],
    "cudnn_lengths_fused_qkv_transposed": ["ATTENTION_IMPL='cudnn'",
                                           "ATTENTION_MASK='lengths'", "FUSE_QKV=True",
                                           "TRANSPOSE_BS=True"],
    "cudnn_lengths_fused_qkv_fp8": ["ATTENTION_IMPL='cudnn'", "ATTENTION_MASK='lengths'",
                                    "FUSE_QKV=True", "FP8=True"],
}
for name, switches in SWITCHES.items():
    ROWS.append((f"large_b32_h200+{name}", "h200", RECIPES["large"][0], 32, OLD + switches,
                 False))
for name, switches in {"bf16_scores": ["ATTENTION_LOGITS_DTYPE='bfloat16'"],
                       "fused_qkv": ["FUSE_QKV=True"]}.items():
    ROWS.append((f"small_b128_h200+{name}", "h200", RECIPES["small"][0], 128, OLD + switches,
                 False))


def compile_row(out_dir, name, gpu, recipe, batch, bindings, init):
    path = os.path.join(out_dir, f"{name}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    cmd = [sys.executable, "-m", "t5lite.info", f"--gin_file={recipe}", f"--gpu={gpu}",
           f"--per_device_batch={batch}", "--json"] + [f"--gin.{b}" for b in bindings]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        print(f"{name}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    report = json.loads(proc.stdout)["gpu_step"]
    report.update(name=name, command=" ".join(cmd[1:]))
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{name}: {report['program_bytes'] / 1e9:.1f} GB, predicted "
          f"{1e3 * report['predicted_step_s']:.1f} ms", file=sys.stderr, flush=True)
    return report


def table(reports):
    lines = ["| configuration | GPU | kernels | TFLOP | GB moved | predicted step | "
             "pred. seq/s | memory | step compile | init compile |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in reports:
        init = r.get("init_compile_s")
        lines.append(
            f"| {r['name']} | {r['gpu'].upper()} | {r['program_launches']:,.0f} | "
            f"{r['program_flops'] / 1e12:.1f} | {r['program_bytes'] / 1e9:.1f} | "
            f"{1e3 * r['predicted_step_s']:.1f} ms | {r['predicted_seq_per_s']:,.0f} | "
            f"{r['memory']['peak_bytes'] / 2**30:.1f} GiB | {r['step_compile_s']:.1f} s | "
            + ("-" if init is None else f"{init:.1f} s ({100 * init / r['step_compile_s']:.0f}%)")
            + " |")
    return "\n".join(lines)


def main():
    out_dir, patterns = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    rows = [r for r in ROWS if not patterns or any(fnmatch.fnmatch(r[0], p) for p in patterns)]
    reports = [rep for rep in (compile_row(out_dir, *r) for r in rows) if rep]
    print(table(reports))


if __name__ == "__main__":
    main()
