"""The batcher contract and the machinery every policy shares.

A batcher owns a bounded priority queue and ``instances`` engine workers (one thread per
engine instance, like Triton's instance groups). Its loop waits for a free instance, asks
the policy for the next batch, and hands the batch to that instance's thread, so the next
batch forms while this one computes. Stacking, the model call and splitting all run on
the worker thread; the event loop only moves references.

A work item is one whole request and may carry several rows (its tensors have the batch
axis first); batch sizes count rows, and a batch is a run of whole items (``PriorityFifo.
pop_batch``), as Triton never splits a request.

Invariants kept here (docs/architecture.md, "How the invariants are kept"): every accepted
item is answered exactly once (its future is resolved by exactly one of: result, engine
error, deadline, drain); each item's outputs are its own rows of the batch it rode in
(rows are concatenated in item order and sliced back by offset); queues are bounded.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import monotonic
from typing import Any, ClassVar, Generic, TypeVar, cast

import numpy as np
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.observers import NULL_OBSERVER, BatchObserver, BatchReport
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.types import (
    BatchFailed,
    ClientGone,
    DeadlineExceeded,
    Draining,
    ItemState,
    QueueFull,
    RequestError,
    Result,
    WorkItem,
)
from wattserve.engines.base import Engine, ReportsSteps, StepEngine
from wattserve.engines.request_engines import RunsRequests

log = logging.getLogger("wattserve.batcher")


@dataclass(slots=True)
class BatchOutcome:
    """What a worker thread hands back: the items it computed, per-item outputs or
    exceptions (same order), and the window."""

    items: list[WorkItem]
    per_item: Sequence[dict[str, np.ndarray] | BaseException]
    started: float
    finished: float
    energy: Any  # what the observer's on_batch_end returned (telemetry: a BatchSpan), or None
    padded: int
    rows: int = 0  # rows of the computed items (the batch size)
    input_s: float = 0.0  # gathering the items' inputs into the batch
    output_s: float = 0.0  # slicing the batch's outputs back into items


@dataclass
class BatcherConfig:
    max_batch_size: int = 8
    max_queue_size: int = 256
    priority_levels: int = 1
    max_queue_wait_s: float = 0.0  # refuse when the queue holds more work than this; 0 = off


def common_config(spec: BatchingSpec) -> dict[str, Any]:
    """The ``BatcherConfig`` fields every policy reads from a model's batching spec."""
    return {
        "max_batch_size": spec.max_batch_size,
        "max_queue_size": spec.max_queue_size,
        "priority_levels": spec.priority_levels,
        "max_queue_wait_s": spec.max_queue_wait_s,
    }


def padded_size(n: int, batch_sizes: Sequence[int] | None) -> int:
    """The engine batch size a batch of ``n`` runs at (smallest bucket that holds it)."""
    if not batch_sizes:
        return n
    fitting = [b for b in batch_sizes if b >= n]
    return min(fitting) if fitting else n


def engine_thread(index: int) -> ThreadPoolExecutor:
    """The one thread that builds, warms and runs engine instance ``index``.

    One thread per engine for its whole life, not just for its batches: GNU OpenMP (torch's
    CPU thread pool) keeps a worker team per calling thread, and once the process holds more
    OpenMP threads than CPUs its workers stop spinning between parallel regions and sleep
    on a futex instead. An engine built on one thread and run on another left two teams on
    a 2-CPU machine: mobilenet_v2 at batch 1 took ~250 context switches per call instead of
    ~0.5 (see docs/architecture.md)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{index}")


# What a policy drives: request-level policies an Engine (whole batches), the iteration-level
# one a StepEngine (one step of every state); both are closed by their EngineInstance.
AnyEngine = TypeVar("AnyEngine", bound=Engine | StepEngine)


class EngineInstance(Generic[AnyEngine]):
    """One engine and the single thread that may call it (``engine_thread``; the one it
    was built on, when the caller passes it)."""

    def __init__(self, engine: AnyEngine, index: int, executor: ThreadPoolExecutor | None = None) -> None:
        self.engine = engine
        self.index = index
        self.executor = executor if executor is not None else engine_thread(index)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.engine.close()


class Batcher(ABC, Generic[AnyEngine]):
    """Base of every policy: the queue, submit, deadlines, cancel, drain, engine threads.

    Request-level policies derive from ``RequestBatcher``; the iteration-level one
    (``batchers.iteration``) implements ``run`` itself. ``batchers.registry`` finds each
    policy by its ``name`` and builds its config with ``config_from``."""

    name: ClassVar[str]  # what WATTSERVE_BATCHER says to pick this policy
    summary: ClassVar[str]  # one line for the settings' help
    step_engines_only: ClassVar[bool] = False  # True: needs an engines.base.StepEngine

    def __init__(
        self,
        engines: Sequence[AnyEngine],
        config: BatcherConfig,
        *,
        observer: BatchObserver | None = None,
        threads: Sequence[ThreadPoolExecutor] | None = None,
    ) -> None:
        """``threads``: each engine's own ``engine_thread``, the one it was built on (one
        is started per engine when not given)."""
        if not engines:
            raise ValueError("a batcher needs at least one engine instance")
        if threads is not None and len(threads) != len(engines):
            raise ValueError(f"{len(threads)} engine threads for {len(engines)} engines")
        self.config = config
        self.engine = engines[0]  # metadata source; all instances serve the same model
        owned = list(threads) if threads is not None else [None] * len(engines)
        self.instances = [
            EngineInstance(e, i, t) for i, (e, t) in enumerate(zip(engines, owned, strict=True))
        ]
        self.observer: BatchObserver = observer if observer is not None else NULL_OBSERVER
        if observer is not None:  # each model call of a step engine, whichever policy batches
            for engine in engines:
                if isinstance(engine, ReportsSteps):
                    engine.step_observer = observer.on_step
        # an engine that takes a batch as its requests (Triton's Python backend), not stacked rows
        self._runs_requests = isinstance(self.engine, RunsRequests)
        self.queue = PriorityFifo(config.priority_levels)
        self.service_rate = self.queue.drain  # the time bound's pace (batchers.service_rate)
        self.last_batch_at = monotonic()  # read by the idle memory trimmer
        self.closing = False
        self.inflight = 0
        self._waiter: asyncio.Future[None] | None = None
        self._wake_depth: int | None = None  # the waiter sleeps through arrivals below this depth
        self._stopped: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def config_from(cls, spec: BatchingSpec, engine: Engine) -> BatcherConfig:
        """This policy's config from a model's batching spec and its engine."""
        return BatcherConfig(**common_config(spec))

    # ------------------------------------------------------------------ public contract
    async def submit(self, item: WorkItem) -> Result:
        """The only way in: queue ``item`` and wait for its one answer."""
        self.check_admission()
        if not 1 <= item.priority <= self.config.priority_levels:
            raise ValueError(f"priority level {item.priority} outside 1..{self.config.priority_levels}")
        if item.deadline is not None and item.deadline <= monotonic():
            raise DeadlineExceeded("deadline passed before the request was queued")
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        item.future = future
        item.state = ItemState.QUEUED
        self.queue.push(item)
        self._queue_changed()
        timer = None
        if item.deadline is not None:
            timer = loop.call_later(max(0.0, item.deadline - monotonic()), self._expire, item)
        self.inflight += 1
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(item)  # its waiter is gone: never computed if still queued
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self.inflight -= 1

    def check_admission(self, rows: int = 1) -> None:
        """Raise the refusal ``submit`` would give now, so a route can refuse a request
        before reading its body: draining, queue full by count of requests (Triton's
        max_queue_size), or by time (the rows queued at the measured rate)."""
        if self.closing:
            raise Draining("server is draining; not accepting new requests")
        queue = self.queue
        if len(queue) + 1 > self.config.max_queue_size:
            raise QueueFull(f"queue full ({self.config.max_queue_size} requests waiting)")
        bound = self.config.max_queue_wait_s
        if bound > 0 and len(queue):
            wait = self.service_rate.wait_s(queue.rows + rows)
            if wait > bound:
                raise QueueFull(f"queue holds about {wait:.1f} s of work (bound {bound:g} s)")

    @abstractmethod
    async def run(self) -> None:
        """The batching loop; started by the server's lifespan, ends after ``drain``.

        Must set ``self._loop`` and ``self._stopped`` first and set ``_stopped`` when done.
        """

    async def drain(self, timeout: float | None = None) -> None:
        """Accept no more; finish everything accepted (static flushes its partial batch)."""
        self.closing = True
        self._queue_changed()
        if self._stopped is None:
            return
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout)
        except TimeoutError:
            log.error("drain timed out after %ss; failing what is left", timeout)
            for item in list(self.queue):
                self.queue.remove(item)
                item.finish(error=Draining("server stopped before this request ran"))

    def cancel(self, item: WorkItem) -> None:
        """The client went away: answer ``item`` now; never computed if still queued."""
        self._unqueue(item)
        item.finish(error=ClientGone("client disconnected"))

    def close(self) -> None:
        """Release engine threads and engines (after drain)."""
        for inst in self.instances:
            inst.close()

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def running_count(self) -> int:
        """Requests in an iteration-level running set now (0 for request-level policies)."""
        return 0

    def collector(self, model: str) -> Any:
        """A Prometheus collector of the policy's own state (read at scrape time) for the
        server to register beside its metrics, labelled ``model``; None if it has none."""
        return None

    # ------------------------------------------------------------------ helpers for policies
    async def wait_for_change(self, timeout: float | None = None, wake_at_depth: int | None = None) -> None:
        """Sleep until an item arrives, drain starts, or ``timeout`` seconds pass.

        ``wake_at_depth``: sleep through arrivals until the queue holds this many rows (a
        policy whose decision changes only at that depth; drain still wakes it, and so does
        any arrival while the queue holds multi-row or mixed-shape requests, whose batches
        a row count alone does not decide). A dynamic batch
        waiting out its delay at 16 connections otherwise woke, re-decided and re-armed its
        timer on every arrival."""
        loop = self._loop or asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        self._wake_depth = wake_at_depth
        handle = None
        if timeout is not None:
            handle = loop.call_later(max(0.0, timeout), _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def take(self, rows: int) -> list[WorkItem]:
        """The batch of whole requests at the head, up to ``rows`` rows (the head request
        always, whatever its rows), moved to running at once: from here on a cancel or a
        deadline answers them without ever sending them back to the queue."""
        return self._started(self.queue.pop_batch(rows))

    def take_items(self, n: int) -> list[WorkItem]:
        """Up to ``n`` queued requests (not rows), as ``take`` moves them: for schedulers
        that keep a set of requests rather than form a batch of rows."""
        return self._started(self.queue.pop(n))

    def _started(self, popped: list[WorkItem]) -> list[WorkItem]:
        now = monotonic()
        taken = [item for item in popped if item.start(now)]
        if taken:
            self.observer.on_dispatch(taken, now)
        return taken

    # ------------------------------------------------------------------ internals
    def _queue_changed(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            depth = self._wake_depth
            queue = self.queue
            if depth is None or self.closing or queue.rows >= depth or not queue.regular:
                waiter.set_result(None)

    def _expire(self, item: WorkItem) -> None:
        if self._unqueue(item):
            item.finish(error=DeadlineExceeded("expired while queued; not computed"))
        else:
            item.finish(
                error=DeadlineExceeded("expired during compute (or after dispatch); result discarded")
            )

    def _unqueue(self, item: WorkItem) -> bool:
        """Take ``item`` out of the queue if it is still there (True if it was)."""
        if item.state is ItemState.QUEUED and self.queue.remove(item):
            self._queue_changed()
            return True
        return False

    def _abandon(self, item: WorkItem) -> None:
        """Its waiter is gone (cancelled): never compute it, never answer it."""
        self._unqueue(item)
        item.state = ItemState.DONE

    def _answer_error(self, item: WorkItem, exc: BaseException) -> None:
        item.finish(error=exc)

    def run_batch(self, engine: Engine, items: Sequence[WorkItem]) -> BatchOutcome:
        """Worker thread: stack, run, split. On failure retry items one by one, so one
        bad request fails alone rather than taking its neighbours with it."""
        # Items answered after the batch was formed (deadline, client gone) are not computed.
        items = [item for item in items if item.state is ItemState.RUNNING]
        if not items:
            now = monotonic()
            return BatchOutcome([], [], now, now, None, 0)
        observer = self.observer
        started = monotonic()
        mark = observer.on_batch_start()
        per_item: Sequence[dict[str, np.ndarray] | BaseException]
        energy = None
        input_s = output_s = 0.0
        try:
            try:
                if self._runs_requests:  # each request whole; its own answer or error, no retry
                    runner = cast(RunsRequests, engine)
                    per_item = runner.run_requests([(it.inputs, it.context) for it in items])
                else:
                    batch = _stack(engine, items)
                    gathered = monotonic()
                    outputs = engine.infer(batch)
                    computed = monotonic()
                    per_item = _split(outputs, items)
                    input_s, output_s = gathered - started, monotonic() - computed
            except Exception as exc:
                if len(items) == 1:
                    per_item = [exc]
                else:
                    log.warning("batch of %d failed (%s); retrying items one by one", len(items), exc)
                    per_item = [self._run_alone(engine, item) for item in items]
        finally:  # keep the meter's busy/idle books balanced whatever happened
            energy = observer.on_batch_end(mark)
        finished = monotonic()
        rows = sum(item.rows for item in items)
        padded = padded_size(rows, engine.batch_sizes) - rows
        return BatchOutcome(list(items), per_item, started, finished, energy, padded, rows, input_s, output_s)

    @staticmethod
    def _run_alone(engine: Engine, item: WorkItem) -> dict[str, np.ndarray] | BaseException:
        try:
            return _split(engine.infer(_stack(engine, [item])), [item])[0]
        except Exception as exc:
            return exc


class RequestBatcher(Batcher[Engine]):
    """Request-level policies: a batch is formed, computed whole, and answered whole.

    Subclasses implement ``form_batch`` (wait until the policy wants to dispatch) and may
    implement ``ready_size`` (what the policy dispatches at once, without waiting).

    Pipelining: when an engine thread finishes a batch it asks ``ready_size`` itself, at
    that moment, over what is queued then; if the policy would dispatch at once, the
    thread takes that batch and starts it with no round trip through the event loop,
    while the loop scatters the answers of the batch just finished. Only when the policy
    would wait (a timer, a partial static batch) does the instance go back to the loop,
    which runs ``form_batch``. So every policy's semantics hold: the batch is formed at the
    moment the instance is free, from the queue as it is then, priorities first.
    """

    def __init__(self, engines: Sequence[Engine], config: BatcherConfig, **hooks: Any) -> None:
        super().__init__(engines, config, **hooks)
        self._free: asyncio.Queue[EngineInstance[Engine]] | None = None  # idle engine instances
        self._busy = 0  # instances running a chain of batches
        self._all_idle: asyncio.Event | None = None
        self.pipeline = True  # engine threads take the next ready batch themselves

    async def run(self) -> None:
        """The batching loop; started by the server's lifespan, ends after ``drain``."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._all_idle = asyncio.Event()
        self._all_idle.set()
        self._free = asyncio.Queue()
        for inst in self.instances:
            self._free.put_nowait(inst)
        try:
            while True:
                instance = await self._free.get()
                batch = await self.form_batch()
                if batch is None:
                    self._free.put_nowait(instance)
                    break
                self._dispatch(instance, batch)
            await self._all_idle.wait()
        finally:
            self._stopped.set()

    def ready_size(self) -> int | None:
        """The batch size (rows) the policy dispatches at once from the queue as it is, or
        None if it would wait. Called on an engine thread under the queue's lock; must
        only read. The default never dispatches from the thread (no pipelining)."""
        return None

    def _dispatch(self, instance: EngineInstance[Engine], batch: list[WorkItem]) -> None:
        """Start ``batch`` on the instance's thread; the thread chains ready batches."""
        self._busy += 1
        assert self._all_idle is not None
        self._all_idle.clear()
        try:
            instance.executor.submit(self._work, instance, batch)
        except RuntimeError as exc:  # executor shut down: fail this batch only
            self._finished(instance, batch, None, exc, False)

    def _work(self, instance: EngineInstance[Engine], batch: list[WorkItem]) -> None:
        """Engine thread: run ``batch``, then every batch the policy would dispatch at once,
        posting each outcome to the loop as it finishes."""
        loop = self._loop
        assert loop is not None
        while batch:
            outcome: BatchOutcome | None = None
            error: BaseException | None = None
            try:
                outcome = self.run_batch(instance.engine, batch)
            except BaseException as exc:  # the worker itself broke: fail this batch only
                error = exc
            following = self._take_ready() if self.pipeline and error is None else []
            try:
                loop.call_soon_threadsafe(self._finished, instance, batch, outcome, error, bool(following))
            except RuntimeError:  # the loop is closed: the server stopped, nobody waits
                log.debug("batch of %d finished after the event loop closed", len(batch))
                return
            batch = following

    def _take_ready(self) -> list[WorkItem]:
        """Engine thread: the batch the policy dispatches right now, if any."""
        with self.queue.lock:
            size = self.ready_size()
            return self.take(size) if size else []

    def _finished(
        self, instance: EngineInstance[Engine], batch: list[WorkItem], outcome: BatchOutcome | None,
        error: BaseException | None, continuing: bool,
    ) -> None:  # fmt: skip
        """Loop side of a finished batch: answer it; free the instance unless its thread
        already started the next batch."""
        try:
            if outcome is None:
                log.error("batch of %d failed outside the engine: %r", len(batch), error)
                for item in batch:
                    item.finish(error=BatchFailed(f"batch failed: {error}"))
            else:
                self._scatter(outcome)
        finally:
            if not continuing:
                self._busy -= 1
                assert self._free is not None and self._all_idle is not None
                self._free.put_nowait(instance)
                if self._busy == 0:
                    self._all_idle.set()

    def _scatter(self, outcome: BatchOutcome) -> None:
        """Answer every computed item from its own row. One item's trouble (answered
        meanwhile, a failing callback) never keeps the rest of the batch from answers."""
        if not outcome.items:
            return  # every item was answered (deadline, client gone) before compute began
        n = outcome.rows
        compute_s = outcome.finished - outcome.started
        self.last_batch_at = outcome.finished
        report = BatchReport(n, outcome.started, outcome.finished, outcome.energy, outcome.padded,
                             input_s=outcome.input_s, output_s=outcome.output_s)  # fmt: skip
        try:
            self.observer.on_batch(report)
            self.batch_finished(outcome)
        except Exception:
            log.exception("batch observer failed; answering the batch anyway")
        for item, out in zip(outcome.items, outcome.per_item, strict=True):
            if isinstance(out, BaseException):  # a model's own error keeps its message and kind
                item.finish(
                    error=out if isinstance(out, RequestError) else BatchFailed(f"inference failed: {out}")
                )
                continue
            item.finish(
                Result(
                    outputs=out,
                    queue_time_s=outcome.started - item.arrival,
                    compute_time_s=compute_s,
                    batch_size=n,
                    input_s=outcome.input_s,
                    output_s=outcome.output_s,
                )
            )

    # ------------------------------------------------------------------ policy hooks
    def batch_finished(self, outcome: BatchOutcome) -> None:
        """Called on the event loop once per executed batch (``outcome.items``), before its
        items are answered: policies that learn from what a batch cost (adaptive, aimd)
        override it."""

    @abstractmethod
    async def form_batch(self) -> list[WorkItem] | None:
        """Wait until the policy wants to dispatch; return the batch, or None to stop.

        Called only when an engine instance is free. Must return None only when
        ``self.closing`` is set and the queue is empty.
        """


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _stack(engine: Engine, items: Sequence[WorkItem]) -> dict[str, np.ndarray]:
    """The batch: each input's rows, item after item (a lone item's arrays as they are)."""
    if len(items) == 1:
        inputs = items[0].inputs
        return {spec.name: inputs[spec.name] for spec in engine.inputs}
    return {spec.name: np.concatenate([it.inputs[spec.name] for it in items]) for spec in engine.inputs}


def _split(outputs: dict[str, np.ndarray], items: Sequence[WorkItem]) -> list[dict[str, np.ndarray]]:
    """Each item's own rows of every output, by offset (views, no copy)."""
    rows = sum(item.rows for item in items)
    for name, value in outputs.items():
        if len(value) != rows:
            raise BatchFailed(f"engine returned {len(value)} rows of {name!r} for {rows} rows")
    if len(items) == 1:
        return [outputs]
    per_item = []
    start = 0
    for item in items:
        end = start + item.rows
        per_item.append({name: value[start:end] for name, value in outputs.items()})
        start = end
    return per_item
