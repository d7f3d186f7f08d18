"""The channel between a front end and the engine core: framed messages on a Unix socket.

A frame is ``!II`` (header length, raw length), a pickled header (a small tuple of names,
numbers and tensor offsets: both ends are this package's own processes, on a socket in a
0700 directory), then raw bytes (tensors that did not fit the slab, never pickled). Frames
written in one turn of the event loop leave in one ``writelines``, so a burst of requests
or answers costs one system call, not one each (vLLM's front end batches its ZMQ sends the
same way).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

PREFIX = struct.Struct("!II")
MAX_HEADER = 64 * 2**20  # a corrupt length fails the connection instead of allocating it

# Message kinds (the header's first element).
INFER = 1  # front end -> core: (INFER, id, token, name, version, slot, refs, meta)
CANCEL = 2  # front end -> core: (CANCEL, id)
COUNT = 3  # front end -> core: (COUNT, name, version, protocol, outcome): a refusal it answered
DESCRIBE = 4  # front end -> core: (DESCRIBE, id, name, version) -> (ANSWER, id, True, info)
ANSWER = 5  # core -> front end: (ANSWER, id, ok, payload)

OnFrame = Callable[[Any, memoryview], None]
EMPTY = memoryview(b"")


class FrameProtocol(asyncio.Protocol):
    """Reads frames into ``on_frame(header, raw)`` and writes them coalesced per loop turn."""

    def __init__(
        self,
        on_frame: OnFrame,
        on_lost: Callable[[BaseException | None], None],
        on_read: Callable[[], None] | None = None,
    ) -> None:
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.on_read = on_read  # after the frames of one read: a reader's per-burst books
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._needed = PREFIX.size  # bytes the pending partial frame needs before it parses
        self._pending: list[bytes | memoryview] = []
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        # Parse straight from ``data`` when no partial frame is pending (the common case); a
        # partial frame accumulates until whole (a large inline tensor arrives in many reads:
        # it is copied out once, when complete, not at every read). A frame's raw part is a
        # view of immutable bytes, so it outlives this call safely.
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._needed:
                return
            buf: bytes = bytes(self._buffer)
        else:
            buf = data
        at = 0
        end = len(buf)
        self._needed = PREFIX.size
        while end - at >= PREFIX.size:
            header_length, raw_length = PREFIX.unpack_from(buf, at)
            if header_length > MAX_HEADER:
                raise ValueError(f"frame header of {header_length} bytes")
            total = PREFIX.size + header_length + raw_length
            if end - at < total:
                self._needed = total
                break
            start = at + PREFIX.size
            header = pickle.loads(buf[start : start + header_length])
            raw = memoryview(buf)[start + header_length : at + total] if raw_length else EMPTY
            self.on_frame(header, raw)
            at += total
        self._buffer = bytearray(buf[at:]) if at < end else bytearray()
        if self.on_read is not None:
            self.on_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_lost(exc)

    # ------------------------------------------------------------------ writing
    def send(self, header: Any, raw: Sequence[bytes | memoryview] = ()) -> None:
        """Queue one frame; every frame queued in this loop turn leaves in one write."""
        if self.closed or self.transport is None:
            return
        encoded = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
        raw_length = sum(len(part) for part in raw) if raw else 0
        self._pending.append(PREFIX.pack(len(encoded), raw_length))
        self._pending.append(encoded)
        if raw:
            self._pending.extend(raw)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        if pending and not self.closed and self.transport is not None:
            self.transport.writelines(pending)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
