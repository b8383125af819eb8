"""TensorBoard event files without dependencies: scalar summaries in TFRecord framing of
`Event` protos, written by `EventFileWriter` and read back by `read_scalars` (which also
reads the scalar tensors that clu / tf.summary write).

The GPU image has no clu or TensorFlow, so the training loop's MetricWriter falls back to
this writer there (t5lite.runtime.metrics).
"""
from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from typing import Dict, List, Mapping, Optional, Tuple

_CRC_TABLE: List[int] = []


def _crc32c(data: bytes) -> int:
    if not _CRC_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC_TABLE.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    if wire == 2:
        payload = _varint(len(payload)) + payload
    return _varint(number << 3 | wire) + payload


def _event(step: int, wall_time: float, *, file_version: Optional[str] = None,
           scalars: Optional[Mapping[str, float]] = None) -> bytes:
    """Serialized tensorflow `Event` (wall_time=1, step=2, file_version=3, summary=5)."""
    out = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version is not None:
        out += _field(3, 2, file_version.encode())
    if scalars:
        summary = b"".join(  # Summary.value=1 -> Value(tag=1, simple_value=2)
            _field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", v)))
            for tag, v in scalars.items())
        out += _field(5, 2, summary)
    return out


class EventFileWriter:
    """Appends scalar summaries to one `events.out.tfevents.*` file that TensorBoard reads."""

    _ids = itertools.count()

    def __init__(self, logdir: str):
        os.makedirs(logdir, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
                f"{os.getpid()}.{next(self._ids)}.v2")
        self.path = os.path.join(logdir, name)
        self._file = open(self.path, "ab")
        self._record(_event(0, time.time(), file_version="brain.Event:2"))
        self.flush()

    def _record(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", _masked_crc(header)) + data
                         + struct.pack("<I", _masked_crc(data)))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._record(_event(step, time.time(), scalars=scalars))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _parse(buf: bytes):
    """Yield (field number, wire type, value) of a protobuf message (value: int or bytes)."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _read_varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _read_varint(buf: bytes, i: int) -> Tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def _tensor_scalar(buf: bytes) -> Optional[float]:
    """A float value from a TensorProto (dtype=1, tensor_content=4, float_val=5, double=6)."""
    dtype, content = 1, None
    for number, wire, value in _parse(buf):
        if number == 1:
            dtype = value
        elif number == 4:
            content = value
        elif number == 5:
            return struct.unpack("<f", value[:4])[0]  # packed (wire 2) or single (wire 5)
        elif number == 6:
            return struct.unpack("<d", value[:8])[0]
    if content:
        return struct.unpack("<d" if dtype == 2 else "<f", content[:8 if dtype == 2 else 4])[0]
    return None


def read_scalars(logdir: str) -> Dict[str, List[Tuple[int, float]]]:
    """{tag: [(step, value), ...]} from every event file in `logdir` (oldest file first).

    Reads both `simple_value` scalars (the built-in writer) and scalar tensors (clu /
    tf.summary). For tests and quick checks; TensorBoard itself reads the same files.
    """
    out: Dict[str, List[Tuple[int, float]]] = {}
    names = sorted(n for n in os.listdir(logdir) if "tfevents" in n) if os.path.isdir(logdir) \
        else []
    for name in names:
        with open(os.path.join(logdir, name), "rb") as f:
            data = f.read()
        i = 0
        while i + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            record = data[i + 12:i + 12 + n]
            if len(record) < n or struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] \
                    != _masked_crc(record):
                break  # a partly written last record
            i += 16 + n
            step = 0
            for number, _, value in _parse(record):
                if number == 2:
                    step = value
                elif number == 5:
                    for vnum, _, v in _parse(value):
                        if vnum != 1:
                            continue
                        tag, scalar = None, None
                        for f_num, _, f_val in _parse(v):
                            if f_num == 1:
                                tag = f_val.decode()
                            elif f_num == 2:
                                scalar = struct.unpack("<f", f_val)[0]
                            elif f_num == 8:
                                scalar = _tensor_scalar(f_val)
                        if tag is not None and scalar is not None:
                            out.setdefault(tag, []).append((step, scalar))
    return out
