"""Where a train step's bytes go, as a bar chart: the bytes its kernels move per model
part, from a report of a step compiled for a GPU (`scripts_gpu/aot_table.py`, or
`python -m t5lite.info --gpu=h200 --json`: its `kernels_by_part`), drawn by matplotlib
into a PNG, SVG or PDF (`python -m t5lite.plot --bytes_of=REPORT.json`).

    parts = chart("large_b32_h200.json", "bytes.png")   # read, drawn; [(part, bytes)]
    parts = bytes_by_part(json.load(open(report)))      # [(part, bytes)], the most first
    draw_bytes(parts, "bytes.png", title="...")

A compile for a GPU on a machine without one predicts: nothing in the report was
measured on a GPU, and the chart says so in its title.
"""
from __future__ import annotations

import json
import os
from typing import Any, List, Mapping, Tuple

from t5lite.errors import ConfigError
from t5lite.tools import curves


def chart(report_path: str, out_path: str, title: str = "") -> List[Tuple[str, float]]:
    """The report at `report_path` drawn into `out_path`, titled with its name and GPU and
    labelled predicted (unless `title`); returns its parts. ConfigError for a report that
    cannot be read or has no kernels_by_part."""
    what = f"--bytes_of {report_path}"
    try:
        with open(report_path) as f:
            report = json.load(f)
    except OSError as e:
        raise ConfigError(f"{what}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise ConfigError(f"{what}: not JSON ({e})") from None
    parts = bytes_by_part(report, what)
    name = report.get("name") or os.path.basename(report_path)
    gpu = report.get("device_kind") or report.get("gpu") or "a GPU"
    draw_bytes(parts, out_path, title or (
        f"{name}: bytes a step per model part, {gpu}\n"
        "predicted (compiled for the GPU on a CPU), not measured"))
    return parts


def bytes_by_part(report: Mapping[str, Any], what: str = "the report") -> List[Tuple[str, float]]:
    """[(model part, bytes)] summed over each part's kernel kinds, the most bytes first
    (parts with none left out). ConfigError when `report` has no `kernels_by_part`."""
    rows = report.get("kernels_by_part") if isinstance(report, Mapping) else None
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{what} has no kernels_by_part: give the JSON of a step compiled "
                          f"for a GPU (python -m t5lite.info --gpu=h200 --json, or "
                          f"scripts_gpu/aot_table.py)")
    totals: dict = {}
    for row in rows:
        try:
            part, moved = str(row["group"][0]), float(row["bytes"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise ConfigError(f"{what}: a kernels_by_part row without a group and bytes: "
                              f"{row!r}") from None
        totals[part] = totals.get(part, 0.0) + moved
    return sorted(((p, b) for p, b in totals.items() if b > 0), key=lambda pb: -pb[1])


def draw_bytes(parts: List[Tuple[str, float]], out_path: str, title: str) -> None:
    """A horizontal bar a part, in GB, the most at the top, each bar's figure beside it."""
    curves.check_out(out_path)
    plt = curves.pyplot("a chart")
    names, gigabytes = [p for p, _ in parts], [b / 1e9 for _, b in parts]
    fig, ax = plt.subplots(figsize=(8.5, 0.45 * len(parts) + 1.4))
    bars = ax.barh(names[::-1], gigabytes[::-1], color="#4c72b0")
    for bar, value in zip(bars, gigabytes[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.1f}",
                va="center", fontsize=8)
    ax.set_xlabel(f"GB a step (total {sum(gigabytes):.1f})")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlim(0, max(gigabytes) * 1.15)
    curves.save(fig, out_path)
