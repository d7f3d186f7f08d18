"""Tensors between the server and a Python model's worker process, in POSIX shared memory.

One segment per message (a batch's inputs, a batch's outputs, one decoupled response, one
BLS call's tensors): the writer creates it under ``/dev/shm``, copies each tensor in (64-byte
aligned) and sends only the segment's name and a ``Layout`` (names, dtypes, shapes, offsets:
small metadata); the reader opens it and unlinks the name at once, so a segment outlives
neither side's interest in it. BYTES tensors travel as Triton's length-prefixed bytes. A
small segment is read by copy (``preadv``: fewer system calls than a mapping); a large one
is mapped, and its tensors are views of the mapping.

A bare ``mmap`` rather than ``multiprocessing.shared_memory``: a model may keep its input
arrays past ``execute`` (a decoupled model's thread does); an mmap lives exactly as long as
its views, while ``SharedMemory.close`` refuses to close under exported views, and Python
3.11's resource tracker would unlink segments the other process still owns. Names carry a
per-instance prefix, so ``sweep`` removes what a process that died mid-message left behind.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from wattserve.engines.base import DATATYPE_TO_NUMPY, NUMPY_TO_DATATYPE

SHM_DIR = Path("/dev/shm")
SHM_PATH = f"{SHM_DIR}/"
ALIGN = 64
COPY_BELOW = 1 << 20  # a segment up to this many bytes is read by copy, a larger one mapped


@dataclass(frozen=True)
class TensorLayout:
    name: str
    dtype: str  # the protocol's datatype name (FP32, BF16, BYTES: length-prefixed), else numpy's
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """What a message says about its tensors: the segment (None when every tensor is
    empty) and where each tensor lies in it."""

    segment: str | None
    tensors: tuple[TensorLayout, ...]


class Namer:
    """Unique segment names for one side of one model instance (``<prefix><side><n>``)."""

    def __init__(self, prefix: str, side: str) -> None:
        self.prefix = prefix
        self._side = side
        self._count = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{self._side}{next(self._count)}"


def new_prefix(tag: str) -> str:
    """A prefix no other instance (of this or another server process) uses."""
    safe = "".join(c if c.isalnum() else "_" for c in tag)[:32]
    return f"wsv-pb-{os.getpid()}-{safe}-{uuid.uuid4().hex[:8]}-"


def _serialize_bytes(array: np.ndarray) -> np.ndarray:
    out = bytearray()
    for value in array.flat:
        data = value if isinstance(value, bytes) else str(value).encode()
        out += len(data).to_bytes(4, "little") + data
    return np.frombuffer(bytes(out), dtype=np.uint8)


def _deserialize_bytes(raw: memoryview, count: int) -> np.ndarray:
    values = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        length = int.from_bytes(raw[offset : offset + 4], "little")
        values[i] = bytes(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return values


def write(name: str, tensors: Mapping[str, np.ndarray]) -> Layout:
    """Copy ``tensors`` into a new segment called ``name``; the reader unlinks it. Written
    with ``writev``: a full /dev/shm is an ENOSPC error here, never a SIGBUS on a mapping."""
    entries: list[TensorLayout] = []
    buffers: list[memoryview | bytes] = []
    size = 0
    for key, value in tensors.items():
        array = np.asarray(value)
        if array.dtype.kind in "OSU":
            data, dtype = _serialize_bytes(array), "BYTES"
        else:
            data = np.ascontiguousarray(array)
            dtype = NUMPY_TO_DATATYPE.get(array.dtype) or array.dtype.str
        if size % ALIGN and data.nbytes:
            pad = ALIGN - size % ALIGN
            buffers.append(bytes(pad))
            size += pad
        entries.append(TensorLayout(key, dtype, tuple(array.shape), size, data.nbytes))
        if data.nbytes:
            buffers.append(data.reshape(-1).view(np.uint8).data)
        size += data.nbytes
    if size == 0:
        return Layout(None, tuple(entries))
    path = SHM_PATH + name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        _write_all(fd, buffers)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return Layout(name, tuple(entries))


def _write_all(fd: int, buffers: list[memoryview | bytes]) -> None:
    while buffers:
        written = os.writev(fd, buffers)
        while buffers and written >= len(buffers[0]):
            written -= len(buffers[0])
            buffers.pop(0)
        if buffers and written:
            buffers[0] = memoryview(buffers[0])[written:]


def read(layout: Layout) -> dict[str, np.ndarray]:
    """The tensors of ``layout``, BYTES ones as object arrays of bytes. Unlinks the segment's
    name. A small segment is copied into ordinary arrays (one ``preadv``: cheaper than a
    mapping); a large one is mapped, its tensors writable views of the mapping (no copy)."""
    if layout.segment is None:
        return {t.name: _empty(t) for t in layout.tensors}
    path = SHM_PATH + layout.segment
    fd = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)
        size = max(t.offset + t.nbytes for t in layout.tensors)
        if size <= COPY_BELOW:
            return _copied(fd, layout)
        region = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    out: dict[str, np.ndarray] = {}
    for t in layout.tensors:
        count = int(np.prod(t.shape, dtype=np.int64))
        if t.dtype == "BYTES":
            raw = memoryview(region)[t.offset : t.offset + t.nbytes]
            out[t.name] = _deserialize_bytes(raw, count).reshape(t.shape)
            raw.release()
        elif t.nbytes == 0:
            out[t.name] = _empty(t)
        else:
            out[t.name] = np.frombuffer(region, _dtype(t), count, t.offset).reshape(t.shape)
    return out


def _copied(fd: int, layout: Layout) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for t in layout.tensors:
        if t.nbytes == 0:
            out[t.name] = _empty(t)
        elif t.dtype == "BYTES":
            raw = bytearray(t.nbytes)
            _read_into(fd, memoryview(raw), t.offset, layout)
            count = int(np.prod(t.shape, dtype=np.int64))
            out[t.name] = _deserialize_bytes(memoryview(raw), count).reshape(t.shape)
        else:
            array = np.empty(t.shape, _dtype(t))
            _read_into(fd, array.reshape(-1).view(np.uint8).data, t.offset, layout)
            out[t.name] = array
    return out


def _read_into(fd: int, target: memoryview, offset: int, layout: Layout) -> None:
    done = 0
    while done < len(target):
        got = os.preadv(fd, [target[done:]], offset + done)
        if got <= 0:
            raise OSError(f"shared-memory segment {layout.segment} is shorter than its layout")
        done += got


def _dtype(t: TensorLayout) -> np.dtype:
    """By the protocol's name where it has one: numpy's own string loses extension types
    (ml_dtypes' bfloat16 would read back as raw void)."""
    return DATATYPE_TO_NUMPY.get(t.dtype) or np.dtype(t.dtype)


def _empty(t: TensorLayout) -> np.ndarray:
    return np.empty(t.shape, dtype=object if t.dtype == "BYTES" else _dtype(t))


def discard(layout: Layout) -> None:
    """Unlink a segment no reader will map (its message was never delivered)."""
    if layout.segment is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SHM_PATH + layout.segment)


def sweep(prefix: str) -> int:
    """Unlink every segment named ``prefix...`` (a dead process's leftovers); how many."""
    removed = 0
    for path in SHM_DIR.glob(f"{prefix}*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
