"""The channel between a front end and the engine core: framed messages on a Unix socket.

A frame is ``!II`` (header length, raw length), a pickled header (a small tuple of names,
numbers and tensor offsets: both ends are this package's own processes, on a socket in a
0700 directory), then raw bytes (tensors that did not fit the slab, never pickled). Frames
written in one turn of the event loop leave in one ``writelines``, so a burst of requests
or answers costs one system call, not one each (vLLM's front end batches its ZMQ sends the
same way); and the headers of a turn's frames without raw bytes travel as one ``MANY``
frame, one pickle for the lot (its memo writes a model's name once), so a request or an
answer costs neither side a frame of its own.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("wattserve.channel")

PREFIX = struct.Struct("!II")
MAX_HEADER = 64 * 2**20  # a corrupt length fails the connection instead of allocating it

# Message kinds (the header's first element).
INFER = 1  # front end -> core: (INFER, id, token, name, version, slot, refs, meta)
CANCEL = 2  # front end -> core: (CANCEL, id)
COUNT = 3  # front end -> core: (COUNT, name, version, protocol, outcome): a refusal it answered
DESCRIBE = 4  # front end -> core: (DESCRIBE, id, name, version) -> (ANSWER, id, True, info)
ANSWER = 5  # core -> front end: (ANSWER, id, ok, payload)
MANY = 6  # either way: (MANY, [header, ...]): consecutive frames without raw bytes, in order

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
        self._headers: list[Any] = []  # this turn's frames without raw bytes, not yet encoded
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        # called first thing in each flush: a writer's frames built at the last moment (a
        # front end's groups of the requests it decoded this turn)
        self.before_flush: Callable[[], None] | None = None

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
            if header[0] == MANY:
                on_frame = self.on_frame
                for one in header[1]:
                    on_frame(one, EMPTY)
            else:
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
        """Queue one frame; every frame queued in this loop turn leaves in one write, in the
        order queued."""
        if self.closed or self.transport is None:
            return
        if raw:
            self._encode_headers()  # the frames queued before this one go first
            encoded = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
            self._pending.append(PREFIX.pack(len(encoded), sum(len(part) for part in raw)))
            self._pending.append(encoded)
            self._pending.extend(raw)
        else:
            self._headers.append(header)
        self.wake()

    def wake(self) -> None:
        """Make sure a flush is scheduled (``before_flush`` has frames to send in it)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _encode_headers(self) -> None:
        """The queued headers as one frame (``MANY`` when more than one)."""
        headers = self._headers
        if not headers:
            return
        self._headers = []
        message = headers[0] if len(headers) == 1 else (MANY, headers)
        try:
            encoded = [pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)]
        except Exception:  # headers are plain data by construction; still, one bad header
            log.exception("a frame could not be encoded; sending the others one by one")
            encoded = []  # must not take the turn's other frames with it
            for header in headers:
                try:
                    encoded.append(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL))
                except Exception:
                    log.error("dropped an unencodable frame of kind %r", header[0])
        for one in encoded:
            self._pending.append(PREFIX.pack(len(one), 0))
            self._pending.append(one)

    def _flush(self) -> None:
        if self.before_flush is not None and not self.closed:
            self.before_flush()  # its sends land in this flush (still marked scheduled)
        self._flush_scheduled = False
        self._encode_headers()
        pending, self._pending = self._pending, []
        if pending and not self.closed and self.transport is not None:
            self.transport.writelines(pending)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
