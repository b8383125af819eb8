"""`python -m t5lite.plot`: training curves of one or more runs in one picture, read from
their TensorBoard event files (wiring only, the library is `t5lite.tools.curves`; needs
the `plot` extra, matplotlib).

    python -m t5lite.plot t5lite_demo/pretrain --out demo.png
    python -m t5lite.plot runs/dense runs/moe --out dense_vs_moe.png \
        --tags=loss_per_token,seq_per_s
    python -m t5lite.plot t5lite_demo/mnli --subdir=inference_eval --tags=mnli/accuracy \
        --out mnli.png
    python -m t5lite.plot --bytes_of=docs/perf/gpu/aot/large_b32_h200.json \
        --out large_h200_bytes.png   # where a step compiled for a GPU moves its bytes
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

from t5lite.config import flags
from t5lite.errors import ConfigError
from t5lite.tools import bytes_chart, curves


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m t5lite.plot", description=flags.summary(__doc__, lines=True),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR",
                        help="a MODEL_DIR (or OUTPUT_DIR); each is one line a panel")
    parser.add_argument("--bytes_of", default="", metavar="REPORT.json",
                        help="instead of runs: a bar chart of the bytes a step compiled for "
                             "a GPU moves per model part (info --gpu --json's report), "
                             "labelled predicted")
    parser.add_argument("--out", required=True, help="the picture: .png, .svg or .pdf")
    parser.add_argument("--tags", default=",".join(curves.DEFAULT_TAGS),
                        help="the scalars to draw, a panel each (default: %(default)s)")
    parser.add_argument("--subdir", default="train",
                        help="where under each RUN_DIR the event files are (default: train)")
    parser.add_argument("--title", default="", help="a title over the panels")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if bool(args.runs) == bool(args.bytes_of):
        print("error: give RUN_DIRs (training curves) or --bytes_of=REPORT.json (a step's "
              "bytes), one of the two", file=sys.stderr)
        return 2
    try:
        lines = _bytes(args) if args.bytes_of else _curves(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    print(f"wrote {args.out}")
    return 0


def _curves(args) -> List[str]:
    tags = [t.strip() for t in args.tags.split(",") if t.strip()]
    if not tags:
        raise ConfigError("--tags names no scalar")
    names = [os.path.basename(os.path.normpath(r)) or r for r in args.runs]
    if len(set(names)) < len(names):  # two runs of one name: their whole paths
        names = list(args.runs)
    runs = {name: curves.read_curves(os.path.join(run, args.subdir))
            for name, run in zip(names, args.runs)}
    shown = curves.draw(runs, tags, args.out, title=args.title)
    return [f"{tag}: " + "; ".join(f"{name} steps {s[0]}-{s[-1]} ({len(s)} points)"
                                   for name, (s, _) in lines.items())
            for tag, lines in shown.items()]


def _bytes(args) -> List[str]:
    parts = bytes_chart.chart(args.bytes_of, args.out, args.title)
    return [f"{part}: {moved / 1e9:.1f} GB" for part, moved in parts]


if __name__ == "__main__":
    sys.exit(main())
