"""What checkpoint fingerprints cost: a
run's whole train state (the gin config's model and optimizer; random values, made on
the host: no initializer is compiled) saved and restored with `Checkpointer` on this
machine's devices, and the fingerprints' share of each timed apart.

    fingerprint_s   array_fingerprints(state), compiled beforehand (median of 3)
    save_s          Checkpointer.save, synchronous (its fingerprints included)
    restore_s       Checkpointer.restore (its check included)

The state is read once more for the sums, where it lives: on a GPU that costs its bytes
at the memory's bandwidth, which the JSON gives as a prediction (labelled predicted).

    python -m t5lite.bench --gin_file=configs/models/t5_1_1/large.gin --fingerprint_cost \
      --json_out=docs/perf/checkpoints/fingerprints_t5_large_cpu.json
"""
from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any, Dict

import jax
import numpy as np

from t5lite.formats import fingerprints
from t5lite.optim.train_state import TrainState
from t5lite.runtime import train_step
from t5lite.runtime.checkpointing.checkpoints import Checkpointer

HBM_BYTES_PER_S = {"H100 SXM (predicted)": 3.35e12, "H200 (predicted)": 4.8e12}


def _random_state(model, optimizer, seed: int = 0) -> TrainState:
    tx = optimizer.transformation(model.split_trainable(model.logical_axes()["params"])[0])
    abstract = jax.eval_shape(lambda key: train_step.init_state(model, tx, key),
                              jax.ShapeDtypeStruct((2,), np.uint32))
    rng = np.random.default_rng(seed)

    def fill(a):
        if np.issubdtype(a.dtype, np.floating):
            return jax.device_put(rng.standard_normal(a.shape, np.float32).astype(a.dtype))
        return jax.device_put(np.zeros(a.shape, a.dtype))
    return jax.tree.map(fill, abstract)


def measure(model, optimizer, repeats: int = 3) -> Dict[str, Any]:
    state = _random_state(model, optimizer)
    tree = state.as_dict()
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))
    t = time.perf_counter()
    fingerprints.array_fingerprints(tree)
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fingerprints.array_fingerprints(tree)
        times.append(time.perf_counter() - t)
    fp_s = statistics.median(times)
    with tempfile.TemporaryDirectory() as tmp:
        with Checkpointer(tmp, keep=None, async_save=False) as ckpt:
            t = time.perf_counter()
            ckpt.save(1, state, {"step": 1}, force=True)
            save_s = time.perf_counter() - t
            abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                   sharding=x.sharding), state)
            t = time.perf_counter()
            ckpt.restore(1, abstract)
            restore_s = time.perf_counter() - t
    return {
        "state_bytes": nbytes, "arrays": len(fingerprints.leaves(tree)),
        "device": jax.devices()[0].device_kind, "device_count": jax.device_count(),
        "fingerprint_first_call_s": first, "fingerprint_s": fp_s, "fingerprint_runs_s": times,
        "fingerprint_gb_per_s": nbytes / fp_s / 1e9,
        "save_s": save_s, "restore_s": restore_s,
        "fingerprint_share_of_save": fp_s / save_s,
        "fingerprint_share_of_restore": fp_s / restore_s,
        "gpu_fingerprint_ms_predicted": {name: 1e3 * nbytes / bw
                                         for name, bw in HBM_BYTES_PER_S.items()},
    }


def format_result(result: Dict[str, Any], source: str) -> str:
    predicted = ", ".join(f"{k} {v:.1f} ms" for k, v in
                          result["gpu_fingerprint_ms_predicted"].items())
    return (f"{source}: state {result['state_bytes'] / 1e9:.2f} GB in {result['arrays']} arrays "
            f"on {result['device_count']} x {result['device']}\n"
            f"  fingerprints {result['fingerprint_s']:.2f} s ({result['fingerprint_gb_per_s']:.1f} "
            f"GB/s; first call {result['fingerprint_first_call_s']:.2f} s, compile included)\n"
            f"  save {result['save_s']:.2f} s (fingerprints {100 * result['fingerprint_share_of_save']:.0f}% "
            f"of it), restore {result['restore_s']:.2f} s (check "
            f"{100 * result['fingerprint_share_of_restore']:.0f}%)\n"
            f"  on a GPU, at its memory's bandwidth: {predicted}")


def run(args, command_line: str) -> int:
    """bench --fingerprint_cost: the gin files' MODEL and optimizer, measured, printed and
    written to --json_out."""
    from t5lite.config import parsing
    from t5lite.tools import benchmarking
    parsing.parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths,
                      placeholders=parsing.RUN_PLACEHOLDERS)
    model = parsing.resolve_macro("MODEL", origin=", ".join(args.gin_file))
    result = measure(model, benchmarking.run_optimizer()[0])
    result["command"] = command_line
    print(format_result(result, ", ".join(args.gin_file)))
    return benchmarking.write_result(result, args.json_out)
