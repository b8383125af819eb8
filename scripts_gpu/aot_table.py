"""Compile configurations for an H100 / H200 on this machine (no GPU) as
`python -m t5lite.info --gpu --json` does (`tools.gpu_report`), each in a process of its
own, keep each report as JSON and print a markdown table: the numbers of
docs/performance.md, "Compiled for a GPU on this machine".

    python scripts_gpu/aot_table.py OUT_DIR [NAME_PATTERN ...]   # rows named, else all

Each row is a shipped recipe at one GPU's batch, as shipped or with the switches named
(the decoder-only recipes: packed sequences of their length, LLaMA-2 7B over 8 GPUs with
its FSDP mesh and the batch global);
"2026-11-26" rows pin the settings the recipes had when the first H200 numbers were
measured, and the launchers' XLA flags of then (OLD_XLA). The reports (compile times, memory, kernels by part and kind, the predicted
step) go to OUT_DIR/NAME.json; rows already there are read, not compiled again.
"""
import fnmatch
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OLD = ["ATTENTION_IMPL='xla'", "ATTENTION_MASK='dense'", "FUSE_QKV=False",
       "ATTENTION_LOGITS_DTYPE='float32'"]
"""The Pile recipes' switches as measured on 2026-11-26 (before they became defaults)."""
OLD_XLA = {"xla_gpu_enable_latency_hiding_scheduler": True, "xla_gpu_enable_triton_gemm": False}
"""The launchers' XLA flags then (no dot-merger threshold: XLA's default merging)."""
SHIPPED_XLA = None  # the launchers' flags now (t5lite.tools.gpu_target.LAUNCHER_OPTIONS)

RECIPES = {"small": ("configs/small_pile_pretrain.gin", 128),
           "base": ("configs/base_pile_pretrain.gin", 64),
           "large": ("configs/large_pile_pretrain.gin", 32)}

ROWS = []  # (name, gpu, recipe, batch, bindings, environment)
for gpu in ("h200", "h100"):
    for model, (recipe, batch) in RECIPES.items():
        ROWS.append((f"{model}_b{batch}_{gpu}_2026-11-26", gpu, recipe, batch, OLD, OLD_XLA))
        ROWS.append((f"{model}_b{batch}_{gpu}", gpu, recipe, batch, [], SHIPPED_XLA))
CUDNN = ["ATTENTION_IMPL='cudnn'", "ATTENTION_MASK='lengths'"]
SWITCHES = {  # each on the 2026-11-26 settings of large, then together
    "bf16_scores": (["ATTENTION_LOGITS_DTYPE='bfloat16'"], OLD_XLA),
    "fused_qkv": (["FUSE_QKV=True"], OLD_XLA),
    "cudnn": (["ATTENTION_IMPL='cudnn'"], OLD_XLA),
    "cudnn_lengths": (CUDNN, OLD_XLA),
    "cudnn_lengths_fused_qkv": (CUDNN + ["FUSE_QKV=True"], OLD_XLA),
    "cudnn_lengths_no_gemm_merging": (CUDNN, SHIPPED_XLA),
    "cudnn_lengths_no_gemm_merging_transposed": (CUDNN + ["TRANSPOSE_BS=True"], SHIPPED_XLA),
    "cudnn_lengths_no_gemm_merging_fp8": (CUDNN + ["FP8=True"], SHIPPED_XLA),
}
for name, (switches, env) in SWITCHES.items():
    ROWS.append((f"large_b32_h200+{name}", "h200", RECIPES["large"][0], 32, OLD + switches,
                 env))
ROWS.append(("large_b32_h200+scan_layers", "h200", RECIPES["large"][0], 32,
             ["SCAN_LAYERS=True"], SHIPPED_XLA))  # the shipped settings, the stack scanned
for name, switches in {"bf16_scores": ["ATTENTION_LOGITS_DTYPE='bfloat16'"],
                       "fused_qkv": ["FUSE_QKV=True"]}.items():
    ROWS.append((f"small_b128_h200+{name}", "h200", RECIPES["small"][0], 128, OLD + switches,
                 OLD_XLA))

EINSUM = ["ATTENTION_IMPL='xla'", "ATTENTION_MASK='dense'"]
"""The decoder-only recipes' attention before they set cuDNN's (2026-11-28)."""
DECODER_ONLY = {  # name: (recipe, global batch, devices, sequence length); packed batches
    "gpt126m_b8": ("configs/gpt126m_pile_pretrain.gin", 8, 1, 2048),
    "llama2_7b_b8_fsdp8": ("configs/llama2_7b_pile_pretrain.gin", 8, 8, 4096),
    "glam126m_64e_b8": ("configs/glam126m_64e_pile_pretrain.gin", 8, 1, 2048),
}
SHAPES = {}  # name -> (task feature lengths, packed, devices) where not T5's one-GPU rows
for model, (recipe, batch, devices, length) in DECODER_ONLY.items():
    for gpu in ("h200", "h100"):
        for suffix, bindings in (("", []), ("+einsum", EINSUM)):
            if suffix and gpu == "h100":
                continue
            name = f"{model}_{gpu}{suffix}"
            ROWS.append((name, gpu, recipe, batch, bindings, SHIPPED_XLA))
            SHAPES[name] = ({"targets": length}, True, devices)


def compile_row(out_dir, name, gpu, recipe, batch, bindings, options):
    path = os.path.join(out_dir, f"{name}.json")
    if not os.path.exists(path):
        proc = subprocess.run([sys.executable, __file__, "--row", out_dir, name],
                              capture_output=True, text=True)
        if proc.returncode:
            print(f"{name}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return None
    with open(path) as f:
        report = json.load(f)
    print(f"{name}: {report['program_bytes'] / 1e9:.1f} GB, predicted "
          f"{1e3 * report['predicted_step_s']:.1f} ms", file=sys.stderr, flush=True)
    return report


def _row(out_dir, name):
    """One row compiled in this process (the child of compile_row)."""
    _, gpu, recipe, batch, bindings, options = next(r for r in ROWS if r[0] == name)
    from t5lite.tools import gpu_target
    gpu_target.use_cpu_platform()
    from t5lite.config import parsing
    from t5lite.tools import benchmarking, gpu_report
    if options is not None:
        gpu_target.LAUNCHER_OPTIONS.clear()
        gpu_target.LAUNCHER_OPTIONS.update(options)
    parsing.parse_gin([recipe], [b.replace("=", " = ", 1) for b in bindings],
                      placeholders=parsing.RUN_PLACEHOLDERS)
    model = parsing.resolve_macro("MODEL", origin=recipe)
    optimizer, _ = benchmarking.run_optimizer()
    lengths, pack, devices = SHAPES.get(name, ({"inputs": 512, "targets": 128}, False, 1))
    report = gpu_report.gpu_step_report(model, optimizer, gpu, batch, lengths, pack=pack,
                                        devices=gpu_target.gpu_devices(gpu, devices))
    report.pop("kernels")
    report.update(name=name, gin_file=recipe, bindings=bindings,
                  xla_options=dict(gpu_target.LAUNCHER_OPTIONS),
                  command=f"python scripts_gpu/aot_table.py OUT_DIR {name}")
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(report, f, indent=1)


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
    if sys.argv[1] == "--row":
        return _row(sys.argv[2], sys.argv[3])
    out_dir, patterns = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    rows = [r for r in ROWS if not patterns or any(fnmatch.fnmatch(r[0], p) for p in patterns)]
    reports = [rep for rep in (compile_row(out_dir, *r) for r in rows) if rep]
    print(table(reports))


if __name__ == "__main__":
    main()
