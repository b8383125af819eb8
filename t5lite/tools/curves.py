"""Training curves as a picture: TensorBoard scalars of one or more runs, one panel a tag
(loss per token, accuracy, sequences per second by default), the runs overlaid, drawn by
matplotlib (the `plot` extra) into a PNG, SVG or PDF (t5lite.plot).

    runs = {"demo": read_curves("t5lite_demo/pretrain")}     # {tag: ([step], [value])}
    draw(runs, ["loss_per_token", "accuracy"], "curves.png")  # what was drawn, per panel

A run that logged a step twice (it resumed from an earlier checkpoint and trained it
again) is drawn with the later value, as TensorBoard's last-writer view shows it.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, Sequence, Tuple

from t5lite.errors import ConfigError
from t5lite.runtime import event_files

Curve = Tuple[List[int], List[float]]
DEFAULT_TAGS = ("loss_per_token", "accuracy", "seq_per_s")
TITLES = {"loss_per_token": "loss per target token", "accuracy": "token accuracy",
          "seq_per_s": "sequences / s", "learning_rate": "learning rate"}
FORMATS = (".png", ".svg", ".pdf")
EXTRA = "pip install -e \".[plot]\" (matplotlib)"


def read_curves(logdir: str) -> Dict[str, Curve]:
    """{tag: (steps, values)} of the event files in `logdir`, steps ascending, a step
    logged twice keeping its later value. Raises ConfigError when `logdir` holds none."""
    if not os.path.isdir(logdir) or not any("tfevents" in n for n in os.listdir(logdir)):
        raise ConfigError(f"{logdir} holds no TensorBoard event files (a run's are in "
                          f"MODEL_DIR/train; --subdir names another, e.g. inference_eval)")
    curves = {}
    for tag, points in event_files.read_scalars(logdir).items():
        by_step = dict(points)  # later files and later events win
        steps = sorted(by_step)
        curves[tag] = (steps, [by_step[s] for s in steps])
    return curves


def draw(runs: Mapping[str, Mapping[str, Curve]], tags: Sequence[str], out_path: str,
         title: str = "") -> Dict[str, Dict[str, Curve]]:
    """One panel per tag, one line per run that logged it, saved to `out_path` (.png, .svg
    or .pdf). Returns {tag: {run: (steps, values)}}, what each panel shows. A tag no run
    logged is a ConfigError naming the tags there are."""
    check_out(out_path)
    shown = {tag: {name: curves[tag] for name, curves in runs.items() if tag in curves}
             for tag in tags}
    missing = [tag for tag, lines in shown.items() if not lines]
    if missing:
        there = sorted({tag for curves in runs.values() for tag in curves})
        raise ConfigError(f"no run logged {', '.join(missing)}; the runs logged: "
                          f"{', '.join(there)}")
    plt = pyplot("curves")
    fig, axes = plt.subplots(1, len(tags), figsize=(4.2 * len(tags), 3.4), squeeze=False)
    for ax, tag in zip(axes[0], tags):
        for name, (steps, values) in shown[tag].items():
            ax.plot(steps, values, label=name, linewidth=1.4)
        ax.set_title(TITLES.get(tag, tag))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    save(fig, out_path)
    return shown


def check_out(out_path: str) -> None:
    """ConfigError unless `out_path` names a picture format matplotlib writes."""
    if not out_path.endswith(FORMATS):
        raise ConfigError(f"--out {out_path}: the picture's name must end in "
                          f"{', '.join(FORMATS)}")


def pyplot(what: str):
    """matplotlib's pyplot drawing to files only; ConfigError naming the extra without it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(f"drawing {what} needs matplotlib: {EXTRA}") from None
    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt
    return plt


def save(fig, out_path: str) -> None:
    """`fig` laid out and written to `out_path`, then closed."""
    from matplotlib import pyplot as plt
    fig.tight_layout()
    try:
        fig.savefig(out_path, dpi=120)
    finally:
        plt.close(fig)
