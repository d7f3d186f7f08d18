"""The batcher contract and the machinery every policy shares.

A batcher owns a bounded priority queue and ``instances`` engine workers (one thread per
engine instance, like Triton's instance groups). Its loop waits for a free instance, asks
the policy for the next batch, and hands the batch to that instance's thread, so the next
batch forms while this one computes. Stacking, the model call and splitting all run on
the worker thread; the event loop only moves references.

Invariants kept here (DESIGN.md): every accepted item is answered exactly once (its
future is resolved by exactly one of: result, engine error, deadline, drain); each item's
outputs are row ``i`` of the batch it rode in; queues are bounded.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import monotonic
from typing import Any

import numpy as np

from batchers.queue import PriorityFifo
from batchers.types import (
    BatchFailed,
    ClientGone,
    DeadlineExceeded,
    Draining,
    ItemState,
    QueueFull,
    Result,
    WorkItem,
)
from engines.base import Engine

log = logging.getLogger("wattserve.batcher")


class EnergyMeter:
    """What the batcher needs of telemetry: energy over one batch's execution window.

    ``begin``/``end`` run on the engine thread right around the model call. ``end`` returns
    an object with ``.joules`` or None when nothing is measurable (never a made-up figure).
    """

    def begin(self) -> Any: ...

    def end(self, mark: Any) -> Any: ...


@dataclass(slots=True)
class BatchOutcome:
    """What a worker thread hands back: per-item outputs or exceptions, and the window."""

    per_item: list[dict[str, np.ndarray] | BaseException]
    started: float
    finished: float
    energy: Any  # BatchEnergy-like (has .joules) or None
    padded: int


@dataclass
class BatcherConfig:
    max_batch_size: int = 8
    max_queue_size: int = 256
    priority_levels: int = 1


def padded_size(n: int, batch_sizes: Sequence[int] | None) -> int:
    """The engine batch size a batch of ``n`` runs at (smallest bucket that holds it)."""
    if not batch_sizes:
        return n
    fitting = [b for b in batch_sizes if b >= n]
    return min(fitting) if fitting else n


class EngineInstance:
    """One engine and the single thread that may call it."""

    def __init__(self, engine: Engine, index: int) -> None:
        self.engine = engine
        self.index = index
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{index}")

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()


class Batcher(ABC):
    """Base of every policy: the queue, submit, deadlines, cancel, drain, engine threads.

    Request-level policies derive from ``RequestBatcher``; the iteration-level one
    (``batchers.iteration``) implements ``run`` itself."""

    name: str = "base"

    def __init__(
        self,
        engines: Sequence[Engine],
        config: BatcherConfig,
        *,
        metrics: Any = None,  # server.metrics.ServingMetrics, or None in unit tests
        energy_meter: EnergyMeter | None = None,
        on_batch: Callable[[int, Any], None] | None = None,  # (batch size, energy) -> None
    ) -> None:
        if not engines:
            raise ValueError("a batcher needs at least one engine instance")
        self.config = config
        self.engine = engines[0]  # metadata source; all instances serve the same model
        self.instances = [EngineInstance(e, i) for i, e in enumerate(engines)]
        self.metrics = metrics
        self.energy_meter = energy_meter
        self.on_batch = on_batch
        self.queue = PriorityFifo(config.priority_levels)
        self.closing = False
        self.inflight = 0
        self._waiter: asyncio.Future[None] | None = None
        self._stopped: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ public contract
    async def submit(self, item: WorkItem) -> Result:
        """The only way in: queue ``item`` and wait for its one answer."""
        if self.closing:
            raise Draining("server is draining; not accepting new requests")
        if len(self.queue) >= self.config.max_queue_size:
            raise QueueFull(f"queue full ({self.config.max_queue_size} requests waiting)")
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
            self._abandon(item)  # client went away: never computed if still queued
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self.inflight -= 1

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
                self._answer_error(item, Draining("server stopped before this request ran"))

    def cancel(self, item: WorkItem) -> None:
        """The client went away: answer ``item`` now; never computed if still queued."""
        if item.state is not ItemState.DONE:
            self._abandon(item)
            if item.future is not None and not item.future.done():
                item.future.set_exception(ClientGone("client disconnected"))

    def close(self) -> None:
        """Release engine threads and engines (after drain)."""
        for inst in self.instances:
            inst.close()

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    # ------------------------------------------------------------------ helpers for policies
    async def wait_for_change(self, timeout: float | None = None) -> None:
        """Sleep until an item arrives, drain starts, or ``timeout`` seconds pass."""
        loop = self._loop or asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        handle = None
        if timeout is not None:
            handle = loop.call_later(max(0.0, timeout), _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def take(self, n: int) -> list[WorkItem]:
        return self.queue.pop(n)

    # ------------------------------------------------------------------ internals
    def _queue_changed(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _expire(self, item: WorkItem) -> None:
        if item.state is ItemState.QUEUED:
            self.queue.remove(item)
            self._queue_changed()
            self._answer_error(item, DeadlineExceeded("deadline passed while queued; not computed"))
        elif item.state is ItemState.RUNNING:
            self._answer_error(item, DeadlineExceeded("deadline passed during compute"))

    def _abandon(self, item: WorkItem) -> None:
        if item.state is ItemState.QUEUED and self.queue.remove(item):
            self._queue_changed()
        item.state = ItemState.DONE

    def _answer_error(self, item: WorkItem, exc: BaseException) -> None:
        item.state = ItemState.DONE
        if item.future is not None and not item.future.done():
            item.future.set_exception(exc)

    def run_batch(self, engine: Engine, items: Sequence[WorkItem]) -> BatchOutcome:
        """Worker thread: stack, run, split. On failure retry items one by one, so one
        bad request fails alone rather than taking its neighbours with it."""
        meter = self.energy_meter
        started = monotonic()
        mark = meter.begin() if meter is not None else None
        per_item: list[dict[str, np.ndarray] | BaseException]
        energy = None
        try:
            try:
                per_item = list(_split(engine.infer(_stack(engine, items)), len(items)))
            except Exception as exc:
                if len(items) == 1:
                    per_item = [exc]
                else:
                    log.warning("batch of %d failed (%s); retrying items one by one", len(items), exc)
                    per_item = [self._run_alone(engine, item) for item in items]
        finally:  # keep the meter's busy/idle books balanced whatever happened
            if meter is not None:
                energy = meter.end(mark)
        finished = monotonic()
        padded = padded_size(len(items), getattr(engine, "batch_sizes", None)) - len(items)
        return BatchOutcome(per_item, started, finished, energy, padded)

    @staticmethod
    def _run_alone(engine: Engine, item: WorkItem) -> dict[str, np.ndarray] | BaseException:
        try:
            return next(_split(engine.infer(_stack(engine, [item])), 1))
        except Exception as exc:
            return exc


class RequestBatcher(Batcher):
    """Request-level policies: a batch is formed, computed whole, and answered whole.

    Subclasses implement only ``form_batch``; the loop waits for a free engine instance,
    asks the policy for a batch and hands it to that instance's thread.
    """

    def __init__(self, engines: Sequence[Engine], config: BatcherConfig, **hooks: Any) -> None:
        super().__init__(engines, config, **hooks)
        self._free: asyncio.Queue[EngineInstance] | None = None  # idle engine instances
        self._tasks: set[asyncio.Task[None]] = set()  # batches in flight

    async def run(self) -> None:
        """The batching loop; started by the server's lifespan, ends after ``drain``."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
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
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self._stopped.set()

    def _dispatch(self, instance: EngineInstance, batch: list[WorkItem]) -> None:
        task = asyncio.create_task(self._execute(instance, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, instance: EngineInstance, batch: list[WorkItem]) -> None:
        loop = self._loop or asyncio.get_running_loop()
        now = monotonic()
        for item in batch:
            item.state = ItemState.RUNNING
            item.dispatched_at = now
            if self.metrics is not None:
                self.metrics.queue_time.observe(now - item.arrival)
        try:
            outcome = await loop.run_in_executor(instance.executor, self.run_batch, instance.engine, batch)
        except BaseException as exc:  # the worker itself broke: fail this batch only
            log.exception("batch of %d failed outside the engine", len(batch))
            for item in batch:
                self._answer_error(item, BatchFailed(f"batch failed: {exc}"))
            return
        finally:
            assert self._free is not None
            self._free.put_nowait(instance)
        self._scatter(batch, outcome)

    def _scatter(self, batch: list[WorkItem], outcome: BatchOutcome) -> None:
        n = len(batch)
        compute_s = outcome.finished - outcome.started
        if self.metrics is not None:
            self.metrics.observe_batch(n, compute_s, outcome.padded)
        if self.on_batch is not None:
            self.on_batch(n, outcome.energy)
        self.batch_finished(batch, outcome)
        share = outcome.energy.joules / n if outcome.energy is not None else None
        for item, out in zip(batch, outcome.per_item, strict=True):
            if item.state is not ItemState.RUNNING:
                continue  # answered already (deadline) or abandoned; result discarded
            if isinstance(out, BaseException):
                self._answer_error(item, BatchFailed(f"inference failed: {out}"))
                continue
            item.state = ItemState.DONE
            assert item.future is not None and item.dispatched_at is not None
            item.future.set_result(
                Result(
                    outputs=out,
                    queue_time_s=item.dispatched_at - item.arrival,
                    compute_time_s=compute_s,
                    batch_size=n,
                    energy_j=share,
                )
            )

    # ------------------------------------------------------------------ policy hooks
    def batch_finished(self, batch: list[WorkItem], outcome: BatchOutcome) -> None:
        """Called on the event loop once per executed batch, before its items are answered:
        policies that learn from what a batch cost (adaptive, aimd) override it."""

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
    return {spec.name: np.stack([it.inputs[spec.name] for it in items]) for spec in engine.inputs}


def _split(outputs: dict[str, np.ndarray], n: int):
    for name, value in outputs.items():
        if len(value) != n:
            raise BatchFailed(f"engine returned {len(value)} rows of {name!r} for {n} requests")
    for i in range(n):
        yield {name: value[i] for name, value in outputs.items()}
