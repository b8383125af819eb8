"""Logits of a model's switch variants on the same weights, against the model as
configured (`t5lite.tools.switch_check`): the proof, on a GPU, that cuDNN attention,
native FP8 and the layouts compute the function the CPU tests pin down.

    python scripts_gpu/check_switches.py --gin_file=configs/models/t5_1_1/large.gin \
      --variants=float32,cudnn,dot_product,fp8 --batch=8 --json_out=$OUT/switches.json
    python scripts_gpu/check_switches.py --gin_file=configs/models/gpt/126m.gin --packed \
      --variants=float32,cudnn_lengths --seq_length=2048   # the decoder-only recipes' attention

Prints a line as each variant is measured, then one row per variant (relative L2 error,
its tolerance, verdict), and writes the report as JSON. Exit status 1 when a variant is
outside its tolerance or fails.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from t5lite.config import command, flags, parsing  # noqa: E402
from t5lite.errors import ConfigError  # noqa: E402
from t5lite.tools import switch_check  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    flags.add_gin_flags(parser)
    parser.add_argument("--variants", default="float32,dot_product,cudnn,fp8",
                        help=f"comma-separated, from {','.join(switch_check.VARIANTS)}")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--inputs_length", type=int, default=512)
    parser.add_argument("--targets_length", type=int, default=128)
    parser.add_argument("--seq_length", type=int, default=2048, help="decoder-only length")
    parser.add_argument("--packed", action="store_true",
                        help="each row as two packed sequences (segment ids, positions)")
    parser.add_argument("--json_out", help="where to write the report")
    args = flags.parse_flags(parser, argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in switch_check.VARIANTS]
    if unknown or not names:
        raise ConfigError(f"--variants: unknown {unknown or 'none given'}; choose from "
                          f"{', '.join(switch_check.VARIANTS)}")
    if not args.gin_file:
        raise ConfigError("no --gin_file given (e.g. --gin_file=configs/models/t5_1_1/large.gin)")
    parsing.parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths,
                      placeholders=parsing.RUN_PLACEHOLDERS)
    model = parsing.resolve_macro("MODEL", origin=", ".join(args.gin_file))
    lengths = model.flops_report(inputs_length=args.inputs_length,
                                 targets_length=args.targets_length,
                                 seq_length=args.seq_length)["task_feature_lengths"]

    def measured(name, row):  # one line as each variant is measured, before the table
        print(f"measured {name}: " + (row["error"] if "error" in row else
              f"rel L2 {row['rel_l2']:.2e}, max |d| {row['max_abs']:.3f}, "
              f"argmax {row['argmax_agreement']:.3f}, loss {row['loss']:.4f}"), flush=True)

    report = switch_check.compare_variants(
        model, {n: switch_check.VARIANTS[n] for n in names}, lengths, args.batch,
        on_row=measured, packed=args.packed)
    import jax
    report.update(device_kind=jax.devices()[0].device_kind, jax_version=jax.__version__,
                  gin_files=args.gin_file, bindings=args.gin_bindings, batch=args.batch,
                  task_feature_lengths=lengths)
    print(switch_check.format_report(report))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    bad = [n for n, row in report["variants"].items() if "error" in row or not row.get("ok", True)]
    return 1 if bad else 0


if __name__ == "__main__":
    command.run_main(main)
