"""Connection-level guards uvicorn's HTTP protocol lacks: a deadline for the request
header, a cap on header bytes, a cap on open connections, and word to the app when a
client leaves. And the inference route's answer written whole (``write_response_at_once``).

Without them a client that opens sockets and sends nothing (or a header byte a second)
holds a descriptor forever, and 1,100 such sockets exhausted a 1,024-descriptor limit so
that normal requests were reset with nothing logged; a single 100 MB header was read whole.
These guards act before the app sees anything, so each refusal costs a few bytes.

At the cap a new connection first makes room by closing the oldest *idle* one (sent
nothing yet, or waiting between keep-alive requests), as nginx reuses its idle
connections; only when every connection is busy is the new one refused with a 503. With
1,100 silent sockets open a normal request was otherwise answered only once the header
timeout had freed slots (5.2 s).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import sys
import termios
import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger("wattserve.http")

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def raise_open_file_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (every connection is a descriptor).

    Returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard


class _RateLimitedLog:
    """One warning per ``period_s`` per kind, with the count since the last one."""

    def __init__(self, period_s: float = 10.0) -> None:
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> None:
        self._count[kind] = self._count.get(kind, 0) + 1
        now = time.monotonic()
        if now - self._last.get(kind, -1e9) >= self.period_s:
            log.warning("%s (%d since the last report)", message, self._count[kind])
            self._last[kind] = now
            self._count[kind] = 0


class GuardLimits:
    """The guards' settings, shared by every connection of one server."""

    def __init__(
        self,
        header_timeout_s: float,
        max_header_bytes: int,
        max_connections: int,
        retry_after_s: int,
        counter: Any = None,  # prometheus Counter with an ``outcome``-like label, or None
    ) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.retry_after_s = retry_after_s
        self.counter = counter
        self.log = _RateLimitedLog()
        # Connections that may be closed to make room, oldest first (a dict keeps insertion
        # order): opened and silent, or between keep-alive requests.
        self.idle: dict[GuardedHttpToolsProtocol, None] = {}

    def evict_idle(self, keep: GuardedHttpToolsProtocol) -> bool:
        """Close the oldest idle connection other than ``keep``; False if there is none."""
        for conn in self.idle:
            if conn is not keep:
                conn.evict()
                return True
        return False

    def count(self, reason: str) -> None:
        if self.counter is not None:
            self.counter.labels(reason=reason).inc()


def guarded_protocol(limits: GuardLimits) -> type[GuardedHttpToolsProtocol]:
    """A GuardedHttpToolsProtocol subclass bound to ``limits`` (uvicorn takes a class)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guards; ``guarded_protocol`` binds ``limits``."""

    limits: GuardLimits
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _in_header = True  # from connection start (and after each response) to headers complete
    _lingering = False
    _lingered = 0
    _linger_read_at = 0.0
    _linger_until = 0.0
    _idle = False  # in ``limits.idle``: may be closed to make room for a new connection
    # Called once if the connection is lost while a request is being answered (the app's
    # gone-client watch, ``server.http.routes.common.watching_submit``); cleared by the app.
    on_lost: Callable[[], object] | None = None

    # uvicorn's httptools protocol declares asyncio.Transport where asyncio's base declares
    # BaseTransport: the override repeats uvicorn's narrower signature (override).
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        if len(self.connections) > limits.max_connections and not limits.evict_idle(keep=self):
            limits.log.warn("connections", f"connection cap {limits.max_connections} reached; refusing")
            limits.count("connection_cap")
            self._refuse(503)
            return
        self._idle = True
        limits.idle[self] = None
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._idle:
            self._idle = False
            self.limits.idle.pop(self, None)
        super().connection_lost(exc)
        lost = self.on_lost
        if lost is not None:
            self.on_lost = None
            lost()

    def evict(self) -> None:
        """Close this idle connection to make room (no request of it is unanswered)."""
        self._idle = False
        self.limits.idle.pop(self, None)
        self.limits.count("idle_evicted")
        self._cancel_header_timer()
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._idle:  # a request begins: no longer a candidate for eviction
            self._idle = False
            del self.limits.idle[self]
        if self._lingering:  # the answer is sent: read and drop the rest of the body
            self._lingered += len(data)
            self._linger_read_at = time.monotonic()
            if self._lingered > LINGER_MAX_BYTES:
                self.transport.close()
            return
        if self._in_header:
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes + _BODY_SLACK:
                self.limits.log.warn(
                    "header", f"request header over {self.limits.max_header_bytes} bytes; 431"
                )
                self.limits.count("header_too_large")
                self._refuse(431)
                return
        super().data_received(data)
        # The header deadline starts only when a read ends inside a header: a request that
        # arrives whole (almost all of them) never arms and cancels a timer.
        if self._in_header and self._header_timer is None and not self.transport.is_closing():
            self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_header = True

    def on_headers_complete(self) -> None:
        self._in_header = False
        # Exact size only when the raw bytes (which may hold the body's start) say it
        # could be over: almost every request skips the sum.
        if self._header_bytes > self.limits.max_header_bytes and (
            len(self.url) + sum(len(n) + len(v) for n, v in self.headers) > self.limits.max_header_bytes
        ):
            self.limits.log.warn("header", f"request header over {self.limits.max_header_bytes} bytes; 431")
            self.limits.count("header_too_large")
            self._refuse(431)
        self._header_bytes = 0
        self._cancel_header_timer()
        if self.transport.is_closing():
            return
        super().on_headers_complete()
        # the app's gone-client watch finds this connection in the scope (an extra key the
        # ASGI scope's TypedDict does not declare: literal-required)
        self.scope[CONNECTION_KEY] = self  # type: ignore[literal-required]
        # its close() lingers when the body was not read; _LingeringClose wraps the transport
        # (duck-typed: uvicorn's cycle declares asyncio.Transport, hence the assignment ignore)
        if self.cycle is not None:
            self.cycle.transport = _LingeringClose(self.transport, self, self.cycle)  # type: ignore[assignment]

    def linger(self) -> None:
        """Closing with an unread body: a plain close makes the kernel answer the
        client's next bytes with a reset, which can destroy the answer (a 413 or a
        503 + Retry-After) before the client reads it. Like nginx's lingering close:
        send FIN, keep reading and dropping while the client still sends (until it is
        quiet for ``LINGER_QUIET_S``, ``LINGER_S`` in all, or ``LINGER_MAX_BYTES``), then
        close. A fixed 2 s (and uvicorn's keep-alive timer, still running) cut a client
        that took longer to send its body off with a reset that destroyed its answer."""
        if self._lingering or self.transport.is_closing():
            return
        self._lingering = True
        self._unset_keepalive_if_required()
        self.flow.resume_reading()  # reading may be paused on a full body buffer
        try:
            self.transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            self.transport.close()
            return
        now = time.monotonic()
        self._linger_read_at = now
        self._linger_until = now + LINGER_S
        self.loop.call_later(LINGER_QUIET_S, self._linger_check)

    def _linger_check(self) -> None:
        if self.transport.is_closing():
            return
        now = time.monotonic()
        quiet_until = self._linger_read_at + LINGER_QUIET_S
        if now >= quiet_until or now >= self._linger_until:
            self.transport.close()
        else:
            self.loop.call_later(min(quiet_until, self._linger_until) - now, self._linger_check)

    def on_body(self, body: bytes) -> None:
        if self.cycle is None or self.transport.is_closing():
            return  # refused above: nothing reads this body
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if cycle is None or self.transport.is_closing():
            return
        if cycle.response_complete:  # answered early: the next request's header starts now
            cycle.more_body = False
            self._in_header = True
            self._header_bytes = 0
            if not self.pipeline:
                self._idle = True
                self.limits.idle[self] = None
            return
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._lingering:  # the linger, not the keep-alive timer, ends this connection
            self._unset_keepalive_if_required()
            return
        cycle = self.cycle
        # The next request's header counts from here, or, when this answer went out before
        # its body was read, from the end of that body (``on_message_complete``): body
        # bytes counted as header bytes made a 431 and a close after a keep-alive answer.
        self._in_header = not cycle.more_body
        self._header_bytes = 0
        # ``cycle`` is the next pipelined request's if one started: then not idle
        if cycle.response_complete and not cycle.more_body and not self.transport.is_closing():
            self._idle = True  # idle until the next request (an unread body arriving is not)
            self.limits.idle[self] = None

    def timeout_keep_alive_handler(self) -> None:
        """The keep-alive idle close, unless a request has already arrived: with uvloop
        (libuv runs due timers before it polls sockets) an event loop busy past the
        deadline closed connections whose next request was waiting in the socket."""
        if _bytes_waiting(self.transport):
            return  # data_received follows in this loop turn
        super().timeout_keep_alive_handler()

    # -------------------------------------------------------------- helpers
    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._in_header:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered (pipelined next header may wait for it)
        self.limits.count("header_timeout")
        log.debug("no complete request header within %.1fs; closing", self.limits.header_timeout_s)
        # An idle keep-alive connection gets uvicorn's own keep-alive timeout; a
        # connection that began a header and stalled gets a 408.
        self._refuse(408 if self._header_bytes else None)

    def _refuse(self, status: int | None) -> None:
        self._cancel_header_timer()
        if status is not None and not self.transport.is_closing():
            body = b'{"error":"' + _REASONS[status].lower() + b'"}'
            head = [
                b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n",
            ]
            if status == 503:
                head.append(b"retry-after: %d\r\n" % self.limits.retry_after_s)
            self.transport.write(b"".join(head) + b"\r\n" + body)
        self.transport.close()


def _bytes_waiting(transport: asyncio.BaseTransport) -> int:
    """Bytes received on the connection's socket and not yet read (0 when unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        buf = bytearray(4)
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
        return int.from_bytes(buf, sys.byteorder)
    except (OSError, ValueError):
        return 0


# The scope key under which a request finds its connection (``on_lost``).
CONNECTION_KEY = "wattserve.connection"

# Bytes a client may send past the header in the same packets (the start of its body) before
# the header's own size is known to be too large: the parsed check in on_header is exact; this
# raw one only stops a header that never ends.
_BODY_SLACK = 512 * 1024

# Lingering close: how long in all, how long without a byte, and how many body bytes a
# connection closed with an unread body keeps reading (and dropping) so the client can read
# its answer (nginx: lingering_time 30 s, lingering_timeout 5 s).
LINGER_S = 30.0
LINGER_QUIET_S = 2.0
LINGER_MAX_BYTES = 64 * 1024 * 1024


class _LingeringClose:
    """The transport as a request cycle sees it: the response head goes out with the first
    body bytes in one write, and ``close()`` lingers while the request body is still
    arriving; everything else is the real transport.

    uvicorn writes a response's status line and headers, then its body, as two writes: two
    ``send`` calls and, with TCP_NODELAY, two packets the client wakes for. The head is held
    until the body's first write (at once for a plain Response, which sends both without
    yielding), or until the loop's next turn, so a streamed response's head never waits
    for its first chunk."""

    def __init__(self, transport: asyncio.Transport, protocol: Any, cycle: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self._cycle = cycle
        self._head: bytes | None = None  # the response head, held for the first body write
        self._head_seen = False
        self.is_closing = transport.is_closing

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))
        elif not self._head_seen and self._cycle.response_started:  # this write is the head
            self._head_seen = True
            self._head = data
            self._protocol.loop.call_soon(self._flush)
        else:  # "100 Continue" before the response, or the body after the head went out
            self._transport.write(data)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head)

    def close(self) -> None:
        self._flush()
        cycle = self._protocol.cycle
        if cycle is not None and cycle.more_body and not self._transport.is_closing():
            self._protocol.linger()
        else:
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


# A body up to this size goes out joined to its head (one buffer); a larger one beside it
# (``writelines``), so its bytes are not copied once more.
_JOIN_BODY_BYTES = 64 * 1024


# The last default headers written: (uvicorn's list, its bytes, whether it closes). One tuple,
# replaced whole, so servers on other threads of one process never read a mix of two.
_last_default_head: tuple[list[tuple[bytes, bytes]], bytes, bool] | None = None


def _default_head(defaults: list[tuple[bytes, bytes]]) -> tuple[bytes, bool]:
    """The server's default headers as uvicorn writes them, and whether they close the
    connection; kept while uvicorn keeps the list (it makes a new one each second, for the
    date, and when a drain adds ``connection: close``)."""
    global _last_default_head
    last = _last_default_head
    if last is not None and last[0] is defaults:
        return last[1], last[2]
    parts: list[bytes] = []
    closing = False
    for name, value in defaults:
        name = name.lower()
        if name == b"connection" and b"close" in [token.strip() for token in value.lower().split(b",")]:
            closing = True
        parts += (name, b": ", value, b"\r\n")
    head = b"".join(parts)
    _last_default_head = (defaults, head, closing)
    return head, closing


def write_response_at_once(
    send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes | memoryview
) -> bool:
    """Write a whole response of our own making (``headers`` lower-case, valid, with its
    content-length) straight to the connection, as uvicorn's ``send`` would for its two
    ASGI messages; False, with nothing done, where this cannot stand in for it (not
    uvicorn's httptools cycle, a response begun, writing paused, access logging on, a HEAD).

    uvicorn's ``send`` checks every header against two regular expressions and scans the
    head for framing headers on each answer: ~530 of a front end's ~3,850 Python opcodes per
    identity request, for headers the inference route built itself. The server's default
    headers (date, the keep-alive hint, ``connection: close`` once draining) are written as
    uvicorn writes them, and ``connection: close`` ends keep-alive as it does."""
    cycle = getattr(send, "__self__", None)
    if (
        type(cycle) is not RequestResponseCycle
        or cycle.response_started
        or cycle.disconnected
        or cycle.flow.write_paused
        or cycle.access_log
        or cycle.scope["method"] == "HEAD"
    ):
        return False
    defaults, closing = _default_head(cycle.default_headers)
    content: list[bytes | memoryview] = [STATUS_LINE[status], defaults]
    for name, value in headers:
        content += (name, b": ", value, b"\r\n")
    if closing:
        cycle.keep_alive = False
    elif not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    content.append(b"\r\n")
    transport = cycle.transport
    if len(body) <= _JOIN_BODY_BYTES:
        content.append(body)
        transport.write(b"".join(content))  # before response_started: _LingeringClose passes it on
    else:
        transport.writelines((b"".join(content), body))
    cycle.response_started = cycle.response_complete = True
    cycle.waiting_for_100_continue = False
    cycle.message_event.set()
    if not cycle.keep_alive:
        transport.close()
    cycle.on_response()
    return True
