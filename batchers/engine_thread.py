"""The one thread an engine instance is built, warmed and run on.

``concurrent.futures.ThreadPoolExecutor(max_workers=1)`` did this job, and every batch paid
for its generality: a Future with its own Condition and RLock, a work item, the pool's
idle semaphore and thread-count check, ~400 Python opcodes per batch in the engine core
(``benchmarks.core_cost``'s trace), where the whole batch costs ~6,800. A batch needs none of
it: the loop hands the thread a call and hears back through ``call_soon_threadsafe``.

``EngineThread`` is one thread reading a ``queue.SimpleQueue`` (C): ``post`` queues a call
with no future (a batch); ``submit`` is the ``Executor`` API (``run_in_executor``, warm-up,
the iteration and sequence batchers), so it stays a drop-in executor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any

log = logging.getLogger("wattserve.batcher")

_STOP = None  # what ``shutdown`` queues: the thread ends once every call before it has run


class EngineThread(Executor):
    """An executor of one thread, started with the first call and kept for its life."""

    def __init__(self, name: str, initializer: Callable[[], object] | None = None) -> None:
        self.name = name
        self._initializer = initializer
        self._calls: SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any] | None] | None] = (
            SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # start and shutdown, never per call
        self._shut = False

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the thread, with no future: what it raises is logged.

        Raises RuntimeError after ``shutdown``, as ``submit`` does."""
        if self._thread is None or self._shut:
            self._start()
        self._calls.put((fn, args, None))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """``Executor.submit``: ``fn(*args, **kwargs)`` on the thread, its outcome in the future."""
        future: Future[Any] = Future()
        if self._thread is None or self._shut:
            self._start()
        if kwargs:
            self._calls.put((lambda: fn(*args, **kwargs), (), future))
        else:
            self._calls.put((fn, args, future))
        return future

    def _start(self) -> None:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No call is taken after this; those queued before it run (``cancel_futures``:
        their futures are cancelled instead), then the thread ends."""
        with self._lock:
            if self._shut:
                thread = self._thread
            else:
                self._shut = True
                thread = self._thread
                if cancel_futures:
                    self._cancel_queued()
                if thread is not None:
                    self._calls.put(_STOP)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _cancel_queued(self) -> None:
        kept = []
        while not self._calls.empty():
            call = self._calls.get_nowait()
            if call is not None and call[2] is not None:
                call[2].cancel()
            elif call is not None:
                kept.append(call)  # a batch: it still gets its answer (run, or failed by its caller)
        for call in kept:
            self._calls.put(call)

    def _run(self) -> None:
        if self._initializer is not None:
            try:
                self._initializer()
            except BaseException:
                log.exception("engine thread %s: initializer failed", self.name)
        calls = self._calls
        while True:
            call = calls.get()
            if call is None:
                return
            fn, args, future = call
            if future is None:
                try:
                    fn(*args)
                except BaseException:
                    log.exception("engine thread %s: a call failed", self.name)
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn, args, call  # no reference kept while the thread waits
