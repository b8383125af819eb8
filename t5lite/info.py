"""`python -m t5lite.info`: model facts from a gin config, without allocating the model
(wiring only; the library is `t5lite.tools.footprint`).

    python -m t5lite.info --gin_file=configs/large_pile_pretrain.gin \\
        [--gin.X=Y] [--inputs_length=512 --targets_length=128 | --seq_length=2048] \\
        [--optimizer=adafactor|adamw] [--memory --devices=8 --per_device_batch=32]
        [--account [--devices=1 --per_device_batch=32]] [--json]
        [--gpu=h100|h200|TARGET.txtpb [--autotune_results=FILE]
         [--hosts=16 --gpus_per_host=8]] | --verify=MODEL_DIR

Prints the exact parameter count, training model FLOPs (matmuls, fwd + bwd) and the
bytes of float32 parameters plus the state of the optimizer the config binds (or
--optimizer). With --memory it also compiles the config's train step for --devices
simulated CPU devices (its mesh, NUM_MICROBATCHES, remat and switches) and prints the
per-device memory XLA plans for it, with a plain answer for a --device_memory_gib device.
With --account it lowers the train step for a GPU (CUDA; nothing compiled) and prints
its biggest tensors and the bytes its operations write and read before fusion
(`t5lite.tools.program_account`; --devices defaults to 1 there: shapes per device).
With --gpu (the gpu-aot extra) it compiles the step and initializer for that GPU on this
machine: compile times, memory, kernels by model part and kind, a predicted step time
(`tools.gpu_report`; --memory then reads that compiled step; --hosts: for a cluster, its
collectives and a communication term); with the extra, --memory alone compiles for an
H100 unless --cpu_compiler. --json: table to stderr, JSON to stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from t5lite.config import command, flags, parsing
from t5lite.errors import ConfigError
from t5lite.runtime.checkpointing import verify
from t5lite.tools import benchmarking, footprint, gpu_report, step_memory


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m t5lite.info", allow_abbrev=False,
                                     description=flags.summary(__doc__))
    flags.add_gin_flags(parser)
    parser.add_argument("--inputs_length", type=int, default=512, help="enc-dec inputs length")
    parser.add_argument("--targets_length", type=int, default=128, help="enc-dec targets length")
    parser.add_argument("--seq_length", type=int, default=2048, help="decoder-only length")
    parser.add_argument("--optimizer", choices=sorted(benchmarking.OPTIMIZERS),
                        help="count this optimizer's state instead of the config's")
    parser.add_argument("--memory", action="store_true", help="compile the train step and "
                        "report its memory per device")
    parser.add_argument("--account", action="store_true", help="lower the train step for "
                        "CUDA and account its tensors and bytes (before fusion)")
    parser.add_argument("--devices", type=int, help="with --memory: devices (default 8); "
                        "with --account alone: 1")
    parser.add_argument("--per_device_batch", type=int, help="with --memory: examples per "
                        "device (default: the config's BATCH_SIZE / --devices)")
    parser.add_argument("--device_memory_gib", type=float, help="with --memory: memory "
                        "of one device (default: the GPU's, or 80 as an H100's)")
    gpu_report.add_flags(parser)  # --gpu, --autotune_results, --hosts, --gpus_per_host
    parser.add_argument("--cpu_compiler", action="store_true", help="--memory on CPUs")
    parser.add_argument("--json", action="store_true", help="JSON on stdout, table on stderr")
    parser.add_argument("--verify", help="MODEL_DIR: check its checkpoints' fingerprints")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = flags.parse_flags(_parser(), argv)
    if args.verify:  # every checkpoint against its fingerprints, a line each
        return verify.verify(args.verify)
    if not args.gin_file:
        raise ConfigError("no --gin_file given (e.g. --gin_file=models/t5_1_1/base.gin)")
    if args.devices is None:
        args.devices = args.gpus_per_host or (8 if args.memory or args.hosts > 1 else 1)
    gpu = gpu_report.gpu_for(args.gpu, args.memory and not args.cpu_compiler, args.hosts)
    devices = (gpu_report.devices(gpu, args.devices, args.hosts) if gpu else step_memory.cpu_devices(
        args.devices) if args.memory or args.account else None)
    parsing.parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths,  # unset run
                      placeholders=parsing.RUN_PLACEHOLDERS)  # macros (REQUIRED) get these
    command.start_compilation_cache()  # --memory compiles the train step
    source = ", ".join(args.gin_file)
    model = parsing.resolve_macro("MODEL", origin=source)
    optimizer, origin = benchmarking.run_optimizer(args.optimizer)
    report = footprint.model_report(model, optimizer, inputs_length=args.inputs_length,
                                    targets_length=args.targets_length,
                                    seq_length=args.seq_length, optimizer_source=origin)
    memory_gib = (args.device_memory_gib or gpu_report.memory_gib(gpu)) if args.memory else None
    own_gib = None if args.gpu else memory_gib  # with --gpu: the GPU report's compiled step
    account = (footprint.step_reports(  # report["step_memory"], ["program_account"]; tables
        report, model, optimizer, devices, args.per_device_batch, memory_gib=own_gib,
        account=args.account) if own_gib is not None or args.account else "")
    if args.gpu:  # fills report["gpu_step"] (and, with --memory, report["step_memory"])
        account += gpu_report.info_section(report, model, optimizer, gpu, devices, memory_gib,
                                           args.per_device_batch, args.autotune_results)
    print(footprint.format_report(report, source) + account,
          file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    command.run_main(main)
