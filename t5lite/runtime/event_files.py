"""TensorBoard scalars through TensorBoard's own event-file writer and loader (the
`tensorboard` package; neither imports TensorFlow, so the GPU image, which has
TensorBoard but no TensorFlow or clu, writes the same files).

    writer = ScalarWriter("/ckpt/run/train")
    writer.write_scalars(step, {"loss": 2.3, "mfu": 0.41})
    writer.flush()
    read_scalars("/ckpt/run/train")   # {"loss": [(step, 2.3)], "mfu": [(step, 0.41)]}
"""
from __future__ import annotations

import os
import sys
import time
import types
from typing import Dict, List, Mapping, Tuple

from t5lite.runtime.process import disk_space


def _tensorboard_without_tensorflow() -> None:
    """Make TensorBoard use its own file I/O stub, never TensorFlow: where TensorFlow is
    installed, `tensorboard.compat.tf` would import it (seconds of start-up, and its
    claim on the GPUs) just to open a file. The `tensorboard.compat.notf` module is
    TensorBoard's own switch for that (its no_tensorflow build target)."""
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class ScalarWriter:
    """Scalar summaries appended to one `events.out.tfevents.*` file in `logdir`."""

    def __init__(self, logdir: str):
        _tensorboard_without_tensorflow()
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.logdir = logdir
        disk_space.quiet_background_writers()  # a failed write is reported once, by _writing
        with self._writing():
            os.makedirs(logdir, exist_ok=True)
            self._writer = EventFileWriter(logdir)

    def _writing(self):
        """A full disk becomes one DiskFullError (TensorBoard writes in a thread of its
        own and raises its error at the next call)."""
        return disk_space.writing("the TensorBoard events", self.logdir)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in scalars.items()])
        with self._writing():
            self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                                   summary=summary))

    def flush(self) -> None:
        with self._writing():
            self._writer.flush()

    def close(self) -> None:
        with self._writing():
            self._writer.close()


def _file_order(name: str):
    """`events.out.tfevents.<seconds>.<host>.<pid>.<n>` in the order written: numbers
    compared as numbers (a process's 10th writer in one second after its 9th)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in name.split(".")]


def read_scalars(logdir: str) -> Dict[str, List[Tuple[int, float]]]:
    """{tag: [(step, value), ...]} from every event file in `logdir` (oldest first):
    `simple_value` scalars and scalar tensors (what tf.summary writes)."""
    _tensorboard_without_tensorflow()
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util
    out: Dict[str, List[Tuple[int, float]]] = {}
    names = sorted((n for n in os.listdir(logdir) if "tfevents" in n), key=_file_order) \
        if os.path.isdir(logdir) else []
    for name in names:
        for event in EventFileLoader(os.path.join(logdir, name)).Load():
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalar = value.simple_value
                elif value.HasField("tensor"):
                    scalar = float(tensor_util.make_ndarray(value.tensor).reshape(-1)[0])
                else:
                    continue
                out.setdefault(value.tag, []).append((event.step, scalar))
    return out
