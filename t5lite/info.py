"""Model facts from a gin config, without allocating the model.

    python -m t5lite.info --gin_file=configs/models/t5_1_1/large.gin \\
        [--gin.X=Y] [--inputs_length=512 --targets_length=128 | --seq_length=2048] \\
        [--optimizer=adafactor|adamw] [--json]

Prints the exact parameter count (from `jax.eval_shape` of the model's init), training
model FLOPs under the MFU convention of `t5lite.flops`, and the bytes of float32
parameters plus optimizer state. With --json the table goes to stderr and a JSON dict to
stdout.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Dict, Optional, Sequence

from t5lite import flops, gin_utils
from t5lite.models.configs import DecoderConfig, T5Config

FLOAT32_BYTES = 4
OPTIMIZERS = ("adafactor", "adamw")


def abstract_params(model, cfg, *, inputs_length: int = 8, targets_length: int = 8,
                    seq_length: int = 8):
    """The `params` collection as a tree of jax.ShapeDtypeStruct (nothing is allocated).

    Parameter shapes do not depend on the lengths, so short ones keep tracing cheap.
    """
    if isinstance(cfg, T5Config):
        lengths = {"inputs": inputs_length, "targets": targets_length}
    else:
        lengths = {"targets": seq_length}
    variables = model.abstract_variables(batch_size=1, lengths=lengths)
    return variables["params"]


def _shapes(tree):
    import jax
    return [tuple(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree)]


def param_count(params) -> int:
    return sum(math.prod(s) for s in _shapes(params))


def optimizer_state_count(params, optimizer: str) -> int:
    """Float32 values of optimizer state.

    adamw: two moments per parameter. adafactor: no first moment; a >=2-D parameter keeps
    a row and a column second-moment vector over its last two dims (leading dims, e.g. a
    scanned `layers` axis, kept); a 1-D parameter keeps a full vector.
    """
    if optimizer == "adamw":
        return 2 * param_count(params)
    if optimizer != "adafactor":
        raise gin_utils.ConfigError(f"--optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    total = 0
    for shape in _shapes(params):
        if len(shape) >= 2:
            lead = math.prod(shape[:-2])
            total += lead * shape[-2] + lead * shape[-1]
        else:
            total += math.prod(shape)
    return total


def model_report(model, *, inputs_length: int = 512, targets_length: int = 128,
                 seq_length: int = 2048, optimizer: str = "adafactor") -> Dict[str, Any]:
    """Everything `info` prints, as a dict."""
    cfg = getattr(model, "config", None)
    if not isinstance(cfg, (T5Config, DecoderConfig)):
        raise gin_utils.ConfigError(
            f"MODEL must be an EncoderDecoderModel or DecoderOnlyModel, got {type(model).__name__}")
    params = abstract_params(model, cfg)
    n = param_count(params)
    report: Dict[str, Any] = {"model": type(model).__name__, "config": type(cfg).__name__,
                              "params": n}
    if isinstance(cfg, T5Config):
        report.update(inputs_length=inputs_length, targets_length=targets_length,
                      train_flops_per_example=flops.encoder_decoder_train_flops_per_example(
                          cfg, inputs_length, targets_length))
    else:
        report.update(seq_length=seq_length,
                      train_flops_per_token=flops.decoder_only_train_flops_per_token(
                          cfg, seq_length),
                      train_flops_per_example=flops.decoder_only_train_flops_per_example(
                          cfg, seq_length))
    opt_bytes = FLOAT32_BYTES * optimizer_state_count(params, optimizer)
    report.update(param_bytes=FLOAT32_BYTES * n, optimizer=optimizer,
                  optimizer_state_bytes=opt_bytes, total_bytes=FLOAT32_BYTES * n + opt_bytes)
    return report


def _human_bytes(b: int) -> str:
    return f"{b:,} B ({b / 2**30:,.2f} GiB)"


def format_report(report: Dict[str, Any], source: str = "") -> str:
    rows = [("model", f"{report['model']}({report['config']})" + (f"  [{source}]" if source else "")),
            ("parameters", f"{report['params']:,}")]
    if "train_flops_per_token" in report:
        s = report["seq_length"]
        rows += [("train FLOPs / token", f"{report['train_flops_per_token'] / 1e9:,.3f} GFLOP"
                  f"  (seq {s}, fwd+bwd, matmuls only)"),
                 ("train FLOPs / sequence", f"{report['train_flops_per_example'] / 1e12:,.3f} TFLOP")]
    else:
        rows += [("train FLOPs / example", f"{report['train_flops_per_example'] / 1e9:,.1f} GFLOP"
                  f"  (inputs {report['inputs_length']}, targets {report['targets_length']},"
                  " fwd+bwd, matmuls only)")]
    rows += [("params (float32)", _human_bytes(report["param_bytes"])),
             (f"{report['optimizer']} state", _human_bytes(report["optimizer_state_bytes"])),
             ("total", _human_bytes(report["total_bytes"]))]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m t5lite.info", allow_abbrev=False,
                                     description=__doc__.split("\n")[0])
    gin_utils.add_gin_flags(parser)
    parser.add_argument("--inputs_length", type=int, default=512, help="enc-dec inputs length")
    parser.add_argument("--targets_length", type=int, default=128, help="enc-dec targets length")
    parser.add_argument("--seq_length", type=int, default=2048, help="decoder-only length")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adafactor")
    parser.add_argument("--json", action="store_true", help="JSON on stdout, table on stderr")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = gin_utils.parse_flags(_parser(), argv)
    if not args.gin_file:
        raise gin_utils.ConfigError("no --gin_file given (e.g. --gin_file=models/t5_1_1/base.gin)")
    # a run config (configs/*_pile_pretrain.gin) leaves its run macros REQUIRED; info
    # only needs the model, so they get placeholders (the user's bindings still win)
    args.gin_bindings = list(gin_utils.RUN_PLACEHOLDERS) + list(args.gin_bindings)
    gin_utils.configure(args)
    source = ", ".join(args.gin_file)
    model = gin_utils.resolve_macro("MODEL", origin=source)
    report = model_report(model, inputs_length=args.inputs_length,
                          targets_length=args.targets_length, seq_length=args.seq_length,
                          optimizer=args.optimizer)
    table = format_report(report, source)
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps(report))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    gin_utils.run_main(main)
