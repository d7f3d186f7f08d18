"""Tensors between the server and a Python model's worker process, in POSIX shared memory.

One segment per message (a batch's inputs, a batch's outputs, one decoupled response, one
BLS call's tensors): the writer creates it under ``/dev/shm``, copies each tensor in (64-byte
aligned) and sends only the segment's name and a ``Layout`` (names, dtypes, shapes, offsets:
small metadata); the reader maps it and unlinks the name at once, so a segment outlives
neither side's interest in it. BYTES tensors travel as Triton's length-prefixed bytes.

A bare ``mmap`` rather than ``multiprocessing.shared_memory``: the reader's numpy arrays are
views of the mapping, and a model may keep them past ``execute`` (a decoupled model's thread
does); an mmap lives exactly as long as its views, while ``SharedMemory.close`` refuses to
close under exported views, and Python 3.11's resource tracker would unlink segments the
other process still owns. Names carry a per-instance prefix, so ``sweep`` removes what a
process that died mid-message left behind.
"""

from __future__ import annotations

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
ALIGN = 64


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
    """Copy ``tensors`` into a new segment called ``name``; the reader unlinks it."""
    entries: list[TensorLayout] = []
    payloads: list[np.ndarray] = []
    size = 0
    for key, value in tensors.items():
        array = np.asarray(value)
        if array.dtype.kind in "OSU":
            data, dtype = _serialize_bytes(array), "BYTES"
        else:
            data = np.ascontiguousarray(array)
            dtype = NUMPY_TO_DATATYPE.get(array.dtype) or array.dtype.str
        size = -(-size // ALIGN) * ALIGN
        entries.append(TensorLayout(key, dtype, tuple(array.shape), size, data.nbytes))
        payloads.append(data)
        size += data.nbytes
    if size == 0:
        return Layout(None, tuple(entries))
    fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)  # a full /dev/shm is ENOSPC here, not SIGBUS on write
        region = mmap.mmap(fd, size)
    except BaseException:
        os.unlink(SHM_DIR / name)
        raise
    finally:
        os.close(fd)
    with region:
        for entry, data in zip(entries, payloads, strict=True):
            if entry.nbytes:
                region[entry.offset : entry.offset + entry.nbytes] = data.reshape(-1).view(np.uint8).data
    return Layout(name, tuple(entries))


def read(layout: Layout) -> dict[str, np.ndarray]:
    """The tensors of ``layout``: numeric ones are writable views of the mapping (no copy),
    BYTES ones object arrays of bytes. Unlinks the segment's name."""
    if layout.segment is None:
        return {t.name: _empty(t) for t in layout.tensors}
    path = SHM_DIR / layout.segment
    fd = os.open(path, os.O_RDWR)
    try:
        region = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
        os.unlink(path)
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


def _dtype(t: TensorLayout) -> np.dtype:
    """By the protocol's name where it has one: numpy's own string loses extension types
    (ml_dtypes' bfloat16 would read back as raw void)."""
    return DATATYPE_TO_NUMPY.get(t.dtype) or np.dtype(t.dtype)


def _empty(t: TensorLayout) -> np.ndarray:
    return np.empty(t.shape, dtype=object if t.dtype == "BYTES" else _dtype(t))


def discard(layout: Layout) -> None:
    """Unlink a segment no reader will map (its message was never delivered)."""
    if layout.segment is not None:
        (SHM_DIR / layout.segment).unlink(missing_ok=True)


def sweep(prefix: str) -> int:
    """Unlink every segment named ``prefix...`` (a dead process's leftovers); how many."""
    removed = 0
    for path in SHM_DIR.glob(f"{prefix}*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
