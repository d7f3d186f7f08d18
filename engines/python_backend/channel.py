"""The control channel between the server and a Python model's worker process.

Small messages only (tuples of names, ids, shapes, ``shm.Layout``s), pickled and framed by
length over a Unix socket pair: tensor bytes never travel here (engines/python_backend/
shm.py). Both sides send from several threads (the engine thread, a decoupled model's own
threads, BLS answers), so ``send`` is locked; one reader thread per side receives.

``Calls`` is request/reply on top: ``start`` sends ``(kind, id, *args)`` and returns a future
that the reader resolves when ``("reply", id, ok, value)`` arrives. A failed reply carries
``(what, message, status)``: ``"metric"`` for a custom-metrics misuse, anything else a
request error with its status kind (Triton's code names).
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_HEADER = 8


class Closed(EOFError):
    """The other side has gone (its process exited, or the socket was shut)."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._reader = sock.makefile("rb")

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self.sock.sendall(len(data).to_bytes(_HEADER, "little") + data)
        except OSError as exc:
            raise Closed(str(exc)) from None

    def recv(self) -> tuple[Any, ...]:
        """The next message; ``Closed`` once the other side is gone, ``TimeoutError`` past
        the socket's timeout (the channel is not to be read again after one)."""
        try:
            header = self._reader.read(_HEADER)
            if len(header) < _HEADER:
                raise Closed("the channel was closed")
            size = int.from_bytes(header, "little")
            body = self._reader.read(size)
        except TimeoutError:  # the socket's timeout: the caller's to handle
            raise
        except (OSError, ValueError) as exc:
            raise Closed(str(exc)) from None
        if len(body) < size:
            raise Closed("the channel was closed mid-message")
        message: tuple[Any, ...] = pickle.loads(body)
        return message

    def shut(self) -> None:
        """Wake the reader (it gets ``Closed``) and refuse further sends."""
        with contextlib.suppress(OSError):  # already shut, or never connected
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shut()
        self._reader.close()
        self.sock.close()


class Calls:
    """Requests awaiting their replies over one channel."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Future[Any], Callable[[Any], Any] | None]] = {}
        self._failed: BaseException | None = None

    def start(self, kind: str, *args: Any, convert: Callable[[Any], Any] | None = None) -> Future[Any]:
        """Send ``(kind, id, *args)``; the future gets the reply's value (``convert`` applied
        on the reader thread) or its error."""
        future: Future[Any] = Future()
        with self._lock:
            if self._failed is not None:
                future.set_exception(self._failed)
                return future
            call_id = next(self._ids)
            self._pending[call_id] = (future, convert)
        try:
            self._channel.send((kind, call_id, *args))
        except Closed as exc:
            self._take(call_id)
            future.set_exception(exc)
        return future

    def call(self, kind: str, *args: Any) -> Any:
        """``start`` and wait for the reply (raises its error)."""
        return self.start(kind, *args).result()

    def resolve(self, call_id: int, ok: bool, value: Any, error: Callable[[Any], BaseException]) -> None:
        """Reader thread: a reply arrived; ``error`` makes a failed reply's exception."""
        entry = self._take(call_id)
        if entry is None:
            return
        future, convert = entry
        if not ok:
            future.set_exception(error(value))
            return
        try:
            future.set_result(convert(value) if convert is not None else value)
        except Exception as exc:
            future.set_exception(exc)

    def fail_all(self, exc: BaseException) -> None:
        """Every waiting call (and every later one) fails with ``exc``."""
        with self._lock:
            self._failed = exc
            pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(exc)

    def _take(self, call_id: int) -> tuple[Future[Any], Callable[[Any], Any] | None] | None:
        with self._lock:
            return self._pending.pop(call_id, None)


def reply(
    channel: Channel, call_id: int, work: Callable[[], Any], failure: Callable[[Exception], Any]
) -> None:
    """Run ``work`` and send its value as the reply to ``call_id`` (or ``failure(exc)``)."""
    try:
        message: tuple[Any, ...] = ("reply", call_id, True, work())
    except Exception as exc:
        message = ("reply", call_id, False, failure(exc))
    channel.send(message)
