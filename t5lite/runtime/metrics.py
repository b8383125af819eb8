"""Training metrics: throughput and MFU, TensorBoard writers, the log line, a progress bar.

    writer = MetricWriter(model_dir, jax.process_index(), log_every=100, total_steps=N)
    if writer.due(step):                          # the host syncs only on logging steps
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        m.update(throughput(step_time, batch, targets_len, flops_per_example,
                            jax.device_count(), jax.devices()[0].device_kind))
        writer.write_scalars(step, m)            # TensorBoard + one log line, process 0 only

`flops_per_example` comes from the model (`model.train_flops_per_example`: model FLOPs,
fwd + bwd); MFU is achieved model FLOP/s per device over the dense bf16 peak of the device
(None where unknown, e.g. CPU). TensorBoard events go to MODEL_DIR/train (and
MODEL_DIR/eval for an eval writer) through TensorBoard's own event-file writer
(`t5lite.runtime.event_files`); nothing here imports TensorFlow.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Dict, Mapping, Optional

from t5lite.runtime import periods
from t5lite.runtime.event_files import ScalarWriter

# Dense (no sparsity) peak TFLOP/s per device, matched in order as case-insensitive
# substrings of `jax.devices()[0].device_kind`, e.g. "NVIDIA H100 80GB HBM3".
PEAK_BF16_TFLOPS: Dict[str, float] = {
    "GH200": 989.4,
    "H200": 989.4,
    "H100 PCIe": 756.0,   # PCIe card: lower clocks and fewer SMs than SXM
    "H100": 989.4,        # SXM
    "A100": 312.0,
}
PEAK_FP8_TFLOPS: Dict[str, float] = {
    "GH200": 1978.9,
    "H200": 1978.9,
    "H100 PCIe": 1513.0,
    "H100": 1978.9,
}

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------
# Throughput and MFU
# ---------------------------------------------------------------------------------------
def _lookup(table: Mapping[str, float], device_kind: Optional[str]) -> Optional[float]:
    if device_kind is None:
        import jax  # lazily: the pure functions below need no backend
        device_kind = jax.devices()[0].device_kind
    kind = device_kind.lower()
    for name, tflops in table.items():
        if name.lower() in kind:
            return tflops
    return None


def peak_bf16_tflops(device_kind: Optional[str] = None) -> Optional[float]:
    """Dense bf16 peak TFLOP/s of `device_kind` (default: the first JAX device), or None."""
    return _lookup(PEAK_BF16_TFLOPS, device_kind)


def peak_fp8_tflops(device_kind: Optional[str] = None) -> Optional[float]:
    """Dense FP8 peak TFLOP/s of `device_kind` (default: the first JAX device), or None."""
    return _lookup(PEAK_FP8_TFLOPS, device_kind)


def throughput(step_time_s: float, batch_size: int, target_tokens_per_example: int,
               flops_per_example: Optional[float], num_devices: int,
               device_kind: Optional[str], *, fp8: bool = False) -> Dict[str, Any]:
    """Throughput of one training step of `batch_size` global examples.

    Returns step_time_s, seq_per_s, target_tokens_per_s, tflops_per_device (model FLOPs;
    None without `flops_per_example`) and mfu (fraction of the dense bf16 peak; None when
    the peak or the FLOPs are unknown). With fp8=True also mfu_fp8 against the FP8 peak.
    """
    if not step_time_s > 0:
        raise ValueError(f"step_time_s must be positive, got {step_time_s}")
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    seq_per_s = batch_size / step_time_s
    out: Dict[str, Any] = {
        "step_time_s": float(step_time_s),
        "seq_per_s": seq_per_s,
        "target_tokens_per_s": seq_per_s * target_tokens_per_example,
        "tflops_per_device": None,
        "mfu": None,
    }
    if flops_per_example is not None:
        tflops = flops_per_example * seq_per_s / num_devices / 1e12
        out["tflops_per_device"] = tflops
        peak = peak_bf16_tflops(device_kind) if device_kind is not None else None
        out["mfu"] = tflops / peak if peak else None
        if fp8:
            peak8 = peak_fp8_tflops(device_kind) if device_kind is not None else None
            out["mfu_fp8"] = tflops / peak8 if peak8 else None
    elif fp8:
        out["mfu_fp8"] = None
    return out


# ---------------------------------------------------------------------------------------
# The log line
# ---------------------------------------------------------------------------------------
def _num(v: Any) -> Optional[float]:
    if v is None:
        return None
    try:
        return float(v)  # python / numpy / 0-d jax values
    except (TypeError, ValueError):
        return None


# (metric key, accepted aliases, template, number format); None shows as "-".
_LOG_FIELDS = (
    ("loss", (), "loss {}", "small"),
    ("z_loss", (), "z_loss {}", "small"),
    ("accuracy", ("acc",), "acc {}", ".3f"),
    ("learning_rate", ("lr",), "lr {}", ".1e"),
    ("grad_norm", (), "grad_norm {}", ".2f"),
    ("step_time_s", (), "{} s/step", ".3f"),
    ("seq_per_s", (), "{} seq/s", ".1f"),
    ("target_tokens_per_s", ("tokens_per_s",), "{} tok/s", ".0f"),
    ("tflops_per_device", (), "{} TFLOP/s/dev", ".2f"),
    ("mfu", (), "MFU {}", "percent"),
    ("mfu_fp8", (), "MFU(fp8) {}", "percent"),
)


def _format_number(v: float, spec: str) -> str:
    if spec == "small":  # losses: 3 decimals, scientific when tiny
        return f"{v:.2e}" if v != 0 and abs(v) < 1e-3 else f"{v:.3f}"
    if spec == "percent":
        return f"{100 * v:.1f}%"
    return format(v, spec)


def format_log_line(step: int, total_steps: Optional[int], metrics: Mapping[str, Any]) -> str:
    """`step 120/1000 | loss 3.214 | ... | 1.23 TFLOP/s/dev | MFU -`.

    Known keys come first in a fixed order and format; a value of None shows as `-`
    (MFU on a device of unknown peak); any other key follows as `name value`.
    """
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    used = set()
    for key, aliases, template, spec in _LOG_FIELDS:
        name = next((k for k in (key, *aliases) if k in metrics), None)
        if name is None:
            continue
        used.add(name)
        v = _num(metrics[name])
        parts.append(template.format("-" if v is None else _format_number(v, spec)))
    for name, value in metrics.items():
        if name not in used:
            v = _num(value)
            parts.append(f"{name} {'-' if v is None else format(v, '.4g')}")
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------
class MetricWriter:
    """TensorBoard scalars under MODEL_DIR/<subdir> and a log line; process 0 only.

    backend: "tensorboard" (event files) or "none" (log lines only). `write_scalars`
    writes every call to
    TensorBoard and logs a line when `due(step)`: step % log_every == 0 or the last step.
    None values are logged as `-` and left out of TensorBoard.
    """

    def __init__(self, model_dir: str, process_index: Optional[int] = None, *,
                 log_every: int = 100, total_steps: Optional[int] = None,
                 subdir: str = "train", backend: str = "tensorboard"):
        if backend not in ("tensorboard", "none"):
            raise ValueError(f"backend must be tensorboard or none, got {backend!r}")
        if process_index is None:
            import jax
            process_index = jax.process_index()
        self.process_index = process_index
        self.log_every = max(1, int(log_every))
        self.total_steps = total_steps
        self.subdir = subdir
        self.logdir = os.path.join(model_dir, subdir)
        self.backend = "none"
        self._writer = None
        if process_index != 0 or backend == "none":
            return
        self._writer = ScalarWriter(self.logdir)
        self.backend = "tensorboard"

    def due(self, step: int) -> bool:
        """Whether `step` is a logging step (worth a host sync to fetch metrics)."""
        return periods.due(step, self.log_every, self.total_steps)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        if self.process_index != 0:
            return
        values = {k: _num(v) for k, v in scalars.items()}
        numeric = {k: v for k, v in values.items() if v is not None}  # NaN loss is kept
        if self._writer is not None and numeric:
            self._writer.write_scalars(int(step), numeric)
        if self.due(step):
            prefix = "" if self.subdir == "train" else f"[{self.subdir}] "
            log.info("%s%s", prefix, format_log_line(step, self.total_steps, scalars))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Progress bar
# ---------------------------------------------------------------------------------------
class Progress:
    """A tqdm bar on an interactive stderr (process 0: `process_index`, this process's
    in the run when not given), otherwise nothing at all."""

    def __init__(self, total: Optional[int], initial: int = 0, *, desc: str = "train",
                 process_index: Optional[int] = None, enable: Optional[bool] = None,
                 file=None):
        file = sys.stderr if file is None else file
        if enable is None:
            enable = hasattr(file, "isatty") and file.isatty() and (
                _process_index() if process_index is None else process_index) == 0
        self._bar = None
        if enable:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, initial=initial, desc=desc, file=file,
                             dynamic_ncols=True, leave=True)

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def update(self, step: int, postfix: Optional[Mapping[str, Any]] = None) -> None:
        if self._bar is None:
            return
        if postfix:
            shown = {}
            for k, v in postfix.items():
                x = _num(v)
                shown[k] = "-" if x is None else format(x, ".4g")
            self._bar.set_postfix(shown, refresh=False)
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _process_index() -> int:
    import jax  # only when a terminal would show the bar
    return jax.process_index()
