"""A front end's shared-memory slab: where request and answer tensors cross to the core.

One anonymous memory file (``memfd_create``) per front end, mapped by the front end and by
the engine core (its descriptor passes over the channel's Unix socket, so no name exists
in /dev/shm to leak when a process is killed). Only the front end allocates: a ring, since
requests are answered roughly in arrival order, with out-of-order frees absorbed when the
tail reaches them. The core writes a request's answer into space the front end reserved
with the request. When the ring is full a tensor travels inline in the channel's frame
instead: the slab is never a reason to refuse a request.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Mapping, Sequence

import numpy as np

ALIGN = 64  # cache-line aligned tensors (numpy and the engines read them in place)

# One tensor crossing: (name, dtype code, shape, offset, nbytes). An offset >= 0 is into the
# slab; -1 - offset is into the frame's raw section (inline: it did not fit the slab).
TensorRef = tuple[str, "str | np.dtype", tuple[int, ...], int, int]


def dtype_code(dtype: np.dtype) -> str | np.dtype:
    """What crosses for a dtype: its string (a dtype object costs ~4 us to pickle), or the
    object itself where the string would lose it (ml_dtypes' bfloat16 reads as void)."""
    return dtype.str if dtype.kind != "V" else dtype


_DTYPES: dict[str | np.dtype, np.dtype] = {}


def dtype_of(code: str | np.dtype) -> np.dtype:
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code)
    return dtype


def aligned(n: int) -> int:
    """``n`` rounded up to the slab's alignment (where the next tensor may start)."""
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Slab:
    """The mapping of one slab (either side); the front end's side also allocates."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)
        self.buffer = memoryview(self.map)

    @classmethod
    def create(cls, size: int, name: str = "wattserve-slab") -> Slab:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return cls(fd, size)

    def array(self, code: str | np.dtype, shape: Sequence[int], offset: int) -> np.ndarray:
        """A view of a tensor in the slab (no copy)."""
        return np.ndarray(shape, dtype=dtype_of(code), buffer=self.map, offset=offset)

    def write(self, offset: int, array: np.ndarray) -> None:
        """Copy ``array`` (any layout) into the slab at ``offset``, C order."""
        if array.flags.c_contiguous:  # a byte copy: a third of what a numpy view + copyto costs
            try:
                data = array.data.cast("B")
            except (TypeError, ValueError):  # a dtype the buffer protocol cannot export (bfloat16)
                pass
            else:
                self.buffer[offset : offset + array.nbytes] = data
                return
        target = np.ndarray(array.shape, dtype=array.dtype, buffer=self.map, offset=offset)
        np.copyto(target, array, casting="no")

    def close(self) -> None:
        self.buffer.release()
        with contextlib.suppress(BufferError):  # a view still exported: unmapped with the process
            self.map.close()
        os.close(self.fd)


class RingAllocator:
    """Offsets in ``[0, size)`` handed out in order and freed in any order.

    ``head`` is where the next block goes; ``used`` the bytes from the oldest live block to
    ``head`` (circularly), so the free space is one run from ``head`` round to that block. A
    block that would cross the end starts over at 0 (the skipped end is freed with it). Used
    only on the front end's event loop, so no lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.head = 0
        self.used = 0  # bytes between tail and head, skipped ends included
        self._blocks: dict[int, int] = {}  # start -> length (the skip before it included)
        self._order: list[int] = []  # starts, oldest first (a deque's worth of appends)
        self._first = 0  # index of the oldest live start in _order
        self._freed: set[int] = set()

    def allocate(self, n: int) -> int | None:
        """The offset of ``n`` free bytes, or None when the ring has no room."""
        n = aligned(max(n, 1))
        skip = 0
        start = self.head
        if start + n > self.size:  # wrap: waste the end
            skip = self.size - start
            start = 0
        if self.used + skip + n > self.size:
            return None
        self.head = start + n
        self.used += skip + n
        self._blocks[start] = skip + n
        self._order.append(start)
        return start

    def free(self, start: int) -> None:
        """Give a block back; the tail advances over every freed block at the front."""
        order = self._order
        if not self._freed and self._first < len(order) and order[self._first] == start:  # the oldest
            self.used -= self._blocks.pop(start)  # (nothing freed ahead: answers mostly come in order)
            self._first += 1
        else:
            self._freed.add(start)
            while self._first < len(order) and order[self._first] in self._freed:
                oldest = order[self._first]
                self._freed.discard(oldest)
                self.used -= self._blocks.pop(oldest)
                self._first += 1
        if self._first > 1024 and self._first * 2 > len(order):  # compact now and then
            del order[: self._first]
            self._first = 0
        if self.used == 0:  # empty: start again at 0 (keeps the pages that are warm)
            self.head = 0

    @property
    def live(self) -> int:
        return len(self._blocks)


def pack(arrays: Mapping[str, np.ndarray], base: int) -> tuple[list[TensorRef], int]:
    """Where each array goes when written one after another from ``base``; and the end."""
    refs: list[TensorRef] = []
    offset = base
    mask = ALIGN - 1
    for name, array in arrays.items():  # dtype_code and aligned inlined: once per tensor, both ways
        nbytes = array.nbytes
        dtype = array.dtype
        refs.append((name, dtype.str if dtype.kind != "V" else dtype, array.shape, offset, nbytes))
        offset += (nbytes + mask) & ~mask
    return refs, offset


def inline(arrays: Mapping[str, np.ndarray]) -> tuple[list[TensorRef], list[memoryview]]:
    """Tensors that travel in a frame's raw section (no slab room): refs at ``-1 - offset``
    and the bytes to send after the header (views, not copies)."""
    refs: list[TensorRef] = []
    raw: list[memoryview] = []
    at = 0
    for name, value in arrays.items():
        refs.append((name, dtype_code(value.dtype), value.shape, -1 - at, value.nbytes))
        raw.append(value.reshape(-1).view(np.uint8).data)
        at += value.nbytes
    return refs, raw


def from_inline(
    raw: memoryview, code: str | np.dtype, shape: Sequence[int], offset: int, nbytes: int
) -> np.ndarray:
    """A tensor read from a frame's raw section (copied: the read buffer is reused)."""
    start = -1 - offset
    return np.frombuffer(raw[start : start + nbytes].tobytes(), dtype_of(code)).reshape(shape)
