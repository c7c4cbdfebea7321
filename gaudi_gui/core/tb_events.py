"""TensorBoard event files, written without TensorFlow, TensorBoard or protobuf installed.

An event file is a sequence of TFRecords (``uint64 length``, ``uint32 masked crc32c(length)``,
``data``, ``uint32 masked crc32c(data)``, all little-endian) whose data are serialized ``Event``
protobuf messages. The first event carries ``file_version = "brain.Event:2"``; each next one a wall
time, a step and a ``Summary`` of ``Value {tag, simple_value}`` scalars, which TensorBoard's scalar
dashboard reads as it reads ``SummaryWriter.add_scalar``'s. Only the handful of protobuf fields those
need are encoded here (``tensorboard/compat/proto/event.proto``, ``summary.proto``):

- Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5 (Summary)
- Summary: value = 1 (repeated Value); Summary.Value: tag = 1 (string), simple_value = 2 (float)

A file is named ``events.out.tfevents.<seconds>.<host>.<pid>.<suffix>``: TensorBoard picks up only
names that hold "tfevents". The whole file is written to a temporary name and renamed, so a reader
never sees half an export. tests/unit/test_tb_events.py reads it back with TensorBoard's own reader.
Qt-free and torch-free.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Iterable
from pathlib import Path

FILE_VERSION = "brain.Event:2"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecords."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord around ``data``."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement, as protobuf encodes a negative step
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def scalar_value(tag: str, value: float) -> bytes:
    """A ``Summary.Value`` with ``tag`` and ``simple_value`` (a 32-bit float, as TensorBoard keeps it)."""
    return _field_bytes(1, tag.encode("utf-8")) + bytes([2 << 3 | 5]) + struct.pack("<f", value)


def event(wall_time: float, step: int = 0, *, file_version: str = "",
          scalars: Iterable[tuple[str, float]] = ()) -> bytes:
    """One serialized ``Event``."""
    out = bytes([1 << 3 | 1]) + struct.pack("<d", wall_time)
    if step:
        out += bytes([2 << 3]) + _varint(int(step))
    if file_version:
        out += _field_bytes(3, file_version.encode("utf-8"))
    summary = b"".join(_field_bytes(1, scalar_value(tag, value)) for tag, value in scalars)
    if summary:
        out += _field_bytes(5, summary)
    return out


class EventFileWriter:
    """Scalars into one event file in ``folder``; ``close()`` puts the file in place (atomically)."""

    SUFFIX = "gaudi-gui"

    def __init__(self, folder: str | Path, *, start_time: float | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        start = time.time() if start_time is None else start_time
        self.name = (f"events.out.tfevents.{int(start):010d}.{socket.gethostname()}.{os.getpid()}."
                     f"{self.SUFFIX}")
        self.path = self.folder / self.name
        # The temporary name holds no "tfevents": TensorBoard must not read a file still being written.
        self._tmp = self.folder / f".gaudi-gui-export.{os.getpid()}.tmp"
        self._fh = open(self._tmp, "wb")  # noqa: SIM115 - closed by close()
        self._fh.write(record(event(start, file_version=FILE_VERSION)))
        self.count = 0

    def add_scalars(self, step: int, wall_time: float, scalars: Iterable[tuple[str, float]]) -> None:
        """Scalars of one step (non-finite values are left out: TensorBoard would plot them as gaps
        anyway, and a missing reading is not a number)."""
        good = [(tag, float(v)) for tag, v in scalars
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))]
        if not good:
            return
        self._fh.write(record(event(wall_time, step, scalars=good)))
        self.count += len(good)

    def close(self) -> Path:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        self._tmp.unlink(missing_ok=True)


__all__ = ["FILE_VERSION", "EventFileWriter", "crc32c", "event", "masked_crc", "record", "scalar_value"]
