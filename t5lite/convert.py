"""`python -m t5lite.convert`: convert a local Hugging Face model directory or a T5X
checkpoint into a t5lite checkpoint, or a t5lite checkpoint (a finetuned MODEL_DIR) into a
Hugging Face directory (wiring only; the library is `t5lite.interop.convert`).

    python -m t5lite.convert --from=hf --input=HF_DIR --output=CKPT_DIR \\
        [--fuse_qkv] [--scan_layers] [--dtype=bfloat16]

Writes CKPT_DIR/checkpoints/0/params and CKPT_DIR/model.gin, which binds MODEL to the
matching architecture. Use them as::

    --gin_file=CKPT_DIR/model.gin --gin.INITIAL_CHECKPOINT_PATH=\\"CKPT_DIR\\"

    python -m t5lite.convert --from=t5x --input=/ckpt/t5x/checkpoint_1000000 \\
        --output=CKPT_DIR --gin_file=configs/models/t5_1_1/base.gin [--fuse_qkv] ...

does the same for a T5X checkpoint read as the model the gin files bind (at its step).

    python -m t5lite.convert --to=hf --input=MODEL_DIR --output=HF_DIR \\
        --gin_file=CKPT_DIR/model.gin [--gin.NAME=VALUE ...]

Writes HF_DIR/config.json and model.safetensors from MODEL_DIR's latest complete step,
read as the model the gin files bind (transformers' `from_pretrained(HF_DIR)` loads it).

Bad input (missing directory, pickle-only weights, unsupported model, a non-empty
output directory, a checkpoint of another model or one not all there) prints one
`error: ...` line and exits with status 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from t5lite.config import flags
from t5lite.errors import ConfigError
from t5lite.interop import convert


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m t5lite.convert",
                                description=flags.summary(__doc__))
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from", dest="source", choices=["hf", "t5x"],
                     help="hf: a local Hugging Face directory (safetensors), t5x: a T5X "
                          "checkpoint_<step> directory (needs --gin_file for the model), "
                          "into a t5lite checkpoint")
    way.add_argument("--to", dest="target", choices=["hf"],
                     help="hf: a t5lite checkpoint (MODEL_DIR) into a Hugging Face directory")
    p.add_argument("--input", required=True, help="input model directory")
    p.add_argument("--output", required=True, help="new (or empty) output directory")
    p.add_argument("--fuse_qkv", action="store_true", help="store fused QKV kernels")
    p.add_argument("--scan_layers", action="store_true", help="store scanned layer stacks")
    p.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default=None,
                   help="activation dtype bound in model.gin (parameters stay float32)")
    p.add_argument("--step", type=int, default=None,
                   help="checkpoint step number (default: 0 from hf, the T5X step from t5x)")
    return flags.add_gin_flags(p)  # --to=hf: the model's gin file(s), e.g. CKPT_DIR/model.gin


def _gin_model(args, what: str):
    from t5lite.config import parsing
    if not args.gin_file:
        raise ValueError(f"{what} needs the model's gin file: --gin_file=CKPT_DIR/model.gin "
                         "(the one t5lite.convert wrote) or configs/models/...")
    parsing.parse_gin(args.gin_file, args.gin_bindings,
                      extra_search_paths=[d for ds in args.gin_search_paths
                                          for d in ds.split(",") if d])
    return parsing.resolve_macro("MODEL")


def _export(args) -> str:
    out = convert.export_hf(args.input, args.output, _gin_model(args, "--to=hf"))
    return f"wrote {out / 'config.json'} and {out / 'model.safetensors'}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = flags.parse_flags(_parser(), argv)
        if args.target:
            print(_export(args))
            return 0
        if args.source == "t5x":
            out, step = convert.convert_t5x(args.input, args.output,
                                            _gin_model(args, "--from=t5x"),
                                            fuse_qkv=args.fuse_qkv, scan_layers=args.scan_layers,
                                            dtype=args.dtype, step=args.step)
        else:
            step = args.step or 0
            out = convert.convert_hf(args.input, args.output, fuse_qkv=args.fuse_qkv,
                                     scan_layers=args.scan_layers, dtype=args.dtype, step=step)
    except (ValueError, OSError, ConfigError) as e:  # OSError: FileNotFound / FileExists
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'checkpoints' / str(step) / 'params'} and "
          f"{out / convert.GIN_NAME}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
