"""`python -m t5lite.convert`: convert a local Hugging Face model directory into a t5lite
checkpoint (wiring only; the library is `t5lite.interop.convert`).

    python -m t5lite.convert --from=hf --input=HF_DIR --output=CKPT_DIR \\
        [--fuse_qkv] [--scan_layers] [--dtype=bfloat16]

Writes CKPT_DIR/checkpoints/0/params and CKPT_DIR/model.gin, which binds MODEL to the
matching architecture. Use them as::

    --gin_file=CKPT_DIR/model.gin --gin.INITIAL_CHECKPOINT_PATH=\\"CKPT_DIR\\"

Bad input (missing directory, pickle-only weights, unsupported model, a non-empty
output directory) prints one `error: ...` line and exits with status 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from t5lite.interop import convert


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m t5lite.convert",
                                description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="source", required=True, choices=["hf"],
                   help="input format: hf = local Hugging Face directory (safetensors)")
    p.add_argument("--input", required=True, help="input model directory")
    p.add_argument("--output", required=True, help="new (or empty) checkpoint directory")
    p.add_argument("--fuse_qkv", action="store_true", help="store fused QKV kernels")
    p.add_argument("--scan_layers", action="store_true", help="store scanned layer stacks")
    p.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default=None,
                   help="activation dtype bound in model.gin (parameters stay float32)")
    p.add_argument("--step", type=int, default=0, help="checkpoint step number (default 0)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        out = convert.convert_hf(args.input, args.output, fuse_qkv=args.fuse_qkv,
                                 scan_layers=args.scan_layers, dtype=args.dtype,
                                 step=args.step)
    except (ValueError, OSError) as e:  # OSError covers FileNotFound / FileExists
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'checkpoints' / str(args.step) / 'params'} and "
          f"{out / convert.GIN_NAME}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
