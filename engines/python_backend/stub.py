"""A Python model's worker process (Triton's "stub"): ``python -m ...stub WORK EVENTS PREFIX LEVEL``.

It serves one model instance: the same ``PythonModelEngine`` that thread mode runs on an
engine thread runs here on the main thread, so ``initialize``/``execute``/``finalize`` and
every ``pb_utils`` rule behave alike in both modes. The main thread reads its work
(init, execute, finalize) from the WORK socket and answers there; what the model needs of
the server crosses the EVENTS socket (tensors in shared memory under PREFIX): BLS calls, a
decoupled request's responses, ``is_cancelled``, custom metrics, whose replies a reader
thread hands to their waiters. When the server goes away the process exits at once, so a
worker never outlives its server.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, cast

import numpy as np
from wattserve.engines.python_backend import custom_metrics, shm
from wattserve.engines.python_backend.channel import Calls, Channel, Closed
from wattserve.engines.python_backend.engine import PythonModelEngine, PythonModelFile
from wattserve.engines.python_backend.metrics_bridge import RemoteStore
from wattserve.engines.python_backend.protocol import (
    RequestMeta,
    WorkerContext,
    decode_error,
    encode_error,
    joined,
    split,
)

log = logging.getLogger("wattserve.python_backend.stub")
StreamEvent = tuple[dict[str, np.ndarray] | None, BaseException | None, bool]


class RemoteCaller:
    """BLS from the worker: a ``ModelCaller`` (and ``stream``) whose calls the server runs."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def __call__(
        self,
        name: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str] | None,
        version: str | None,
        request_id: str | None,
        timeout_us: int | None,
    ) -> Future[dict[str, np.ndarray]]:
        layout = shm.write(self._worker.names(), inputs)
        return self._worker.calls.start("bls", name, layout, outputs, version, request_id, timeout_us,
                                        convert=shm.read)  # fmt: skip

    def stream(
        self,
        name: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str] | None,
        version: str | None,
        request_id: str | None,
        timeout_us: int | None,
    ) -> Iterator[StreamEvent]:
        events: queue.SimpleQueue[StreamEvent] = queue.SimpleQueue()
        stream = self._worker.open_stream(events)
        layout = shm.write(self._worker.names(), inputs)
        self._worker.channel.send(
            ("bls_stream", stream, name, layout, outputs, version, request_id, timeout_us)
        )
        while True:
            event = events.get()
            yield event
            if event[2]:
                return


class Worker:
    def __init__(self, work: Channel, channel: Channel, prefix: str) -> None:
        self.work = work  # init/execute/finalize in, their answers out: the main thread's
        self.channel = channel  # everything else, both ways
        self.calls = Calls(channel)
        self.names = shm.Namer(prefix, "w")
        self.engine: PythonModelEngine | None = None
        self._streams: dict[int, queue.SimpleQueue[StreamEvent]] = {}
        self._stream_ids = iter(range(1 << 62))
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ threads
    def read(self) -> None:
        """Reader thread: replies to the model's calls and BLS stream events to their
        waiters."""
        try:
            while True:
                message = self.channel.recv()
                if message[0] == "reply":
                    self.calls.resolve(message[1], message[2], message[3], decode_error)
                elif message[0] == "bls_event":
                    self._stream_event(*message[1:])
        except Closed:
            os._exit(0)  # the server has gone: nobody is left to answer

    def serve(self) -> None:
        """Main thread: init, every execute, finalize, each read and answered here; then
        the process ends."""
        self.work.send(("hello", os.getpid()))
        while True:
            try:
                kind, *args = self.work.recv()
            except Closed:
                return
            work = self._work_of(kind)
            try:
                answer: tuple[Any, ...] = ("ok", work(*args))
            except Exception as exc:
                answer = ("error", encode_error(exc))
            try:
                self.work.send(answer)
            except Closed:
                return
            if kind == "finalize":
                return

    def _work_of(self, kind: str) -> Callable[..., Any]:
        if kind == "init":
            return self._init
        if kind == "execute":
            return self._execute
        return self._finalize

    # ------------------------------------------------------------------ lifecycle
    def _init(self, model: PythonModelFile, device: str, instance: int) -> None:
        store = cast(custom_metrics.CustomMetrics, RemoteStore(self.calls))  # the same calls, remotely
        build = custom_metrics.publishing_to(
            store, lambda _: PythonModelEngine(model, device=device, instance=instance)
        )
        self.engine = build(None)
        self.engine.bind_models(RemoteCaller(self))  # after initialize, as in thread mode

    def _finalize(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def _execute(self, layout: shm.Layout, metas: list[RequestMeta]) -> tuple[shm.Layout, list[Any]]:
        assert self.engine is not None
        per_request = split(shm.read(layout), len(metas))
        requests = [(inputs, self._context(meta), self._cancelled(meta.key, "request"))
                    for inputs, meta in zip(per_request, metas, strict=True)]  # fmt: skip
        answers = self.engine.run_requests(requests)
        outputs: list[dict[str, np.ndarray]] = []
        errors: list[Any] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                outputs.append({})
                errors.append(encode_error(answer))
            else:
                outputs.append(answer)
                errors.append(None)
        return shm.write(self.names(), joined(outputs)), errors

    # ------------------------------------------------------------------ per request
    def _context(self, meta: RequestMeta) -> WorkerContext:
        sink = None
        stream_gone = None
        if meta.streamed:
            sink = self._sink(meta.key)
            stream_gone = self._cancelled(meta.key, "stream")
        return WorkerContext(meta.id, meta.outputs, meta.parameters, sink, stream_gone, meta.sequence)

    def _cancelled(self, key: str, which: str) -> Any:
        def cancelled() -> bool:
            return bool(self.calls.call("cancelled", key, which))

        return cancelled

    def _sink(self, key: str) -> Any:
        def sink(outputs: dict[str, np.ndarray] | None, error: BaseException | None, final: bool) -> None:
            layout = None if outputs is None else shm.write(self.names(), outputs)
            payload = None if error is None else encode_error(error)
            try:
                self.channel.send(("response", key, layout, payload, final))
            except Closed:
                if layout is not None:
                    shm.discard(layout)

        return sink

    # ------------------------------------------------------------------ BLS streams
    def open_stream(self, events: queue.SimpleQueue[StreamEvent]) -> int:
        with self._lock:
            stream = next(self._stream_ids)
            self._streams[stream] = events
            return stream

    def _stream_event(self, stream: int, layout: shm.Layout | None, error: Any, final: bool) -> None:
        outputs = None if layout is None else shm.read(layout)
        with self._lock:
            events = self._streams.pop(stream) if final else self._streams.get(stream)
        if events is not None:
            events.put((outputs, None if error is None else decode_error(error), final))


def main(argv: list[str]) -> None:
    # The server's own process session and group: the scheduler counts the worker with the
    # server (as a thread of it was), and signals meant for the server (Ctrl-C, SIGTERM to
    # the group) are the server's to handle: it drains, then finalizes each worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    work_fd, events_fd, prefix, level = int(argv[1]), int(argv[2]), argv[3], int(argv[4])
    line = f"%(asctime)s %(levelname)s [python model {prefix}] %(name)s: %(message)s"
    logging.basicConfig(level=level, stream=sys.stderr, format=line)
    worker = Worker(Channel(socket.socket(fileno=work_fd)), Channel(socket.socket(fileno=events_fd)), prefix)
    threading.Thread(target=worker.read, name="stub-reader", daemon=True).start()
    worker.serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads a model left running do not hold the process after finalize


if __name__ == "__main__":
    main(sys.argv)
