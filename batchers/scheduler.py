"""The scheduler: the queue of whole requests and the one decision over it.

A batcher's queue side (``batchers.base.Batcher`` derives from ``Scheduler``): requests
wait in a ``PriorityFifo``; when an engine instance is free the scheduler asks the policy
(``batchers.policy``) and either takes the batch it names or waits as it says. The same
decision is asked from two places, never two different questions: ``next_batch`` on the
event loop (it may wait) and ``ready_batch`` on an engine thread that has just finished a
batch (it never waits, and chains only a complete batch: a ``Wait``, or a batch that goes
because waiting is over, sends the instance back to the loop).

Every decision is one step (``decide_once``): the policy's answer, the queue moves it names
and the policy's ``observe`` of it, in one hold of the queue's lock, so a decision on the
loop and one on an engine thread never see each other half done.

The queue's time bound (``queue_wait_bound_s``, the ``max_queue_wait_s`` setting) is kept
here as well as at admission: admission refuses a request when the queue already holds more
than the bound's worth of work at the measured drain, and a request that has waited the
bound anyway (the drain slowed after it was admitted: a starved CPU, an event loop parsing
later arrivals' bodies) is answered 503 + Retry-After when a batch is next formed, never
computed. So no request is computed after waiting longer than the bound; admission alone
let mobilenet_v2 requests wait 2.25x the bound on a loaded 2-core machine.

Taking a batch moves its items queued -> running (``WorkItem.start``) and reports them to
the observer's ``on_dispatch``. A decision or an ``on_dispatch`` that raises fails only the
requests it concerns (the head request; the items just taken) with its message, and the
scheduler goes on: nothing a policy or an observer does stops the batching loop.
"""

from __future__ import annotations

import asyncio
import logging

from wattserve.batchers.clock import REAL_CLOCK, Clock
from wattserve.batchers.observers import BatchObserver
from wattserve.batchers.policy import Delay, Dispatch, Policy, QueueView, Wait
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.types import BatchFailed, ItemState, QueueWaitExceeded, WorkItem

log = logging.getLogger("wattserve.batcher")


class DispatchFailed(Exception):
    """The observer's ``on_dispatch`` raised for ``items``, already taken (running): they
    are answered with ``error`` wherever an answer can be given (the event loop)."""

    def __init__(self, items: list[WorkItem], error: BaseException) -> None:
        super().__init__(str(error))
        self.items = items
        self.error = BatchFailed(f"batch observer failed: {error}")


class Scheduler:
    """A bounded priority queue of whole requests, and the decision loop over it."""

    def __init__(self, priority_levels: int, observer: BatchObserver, clock: Clock = REAL_CLOCK) -> None:
        self.clock = clock  # every time read and timer armed here and below (batchers.clock)
        self._now = clock.now
        self.queue = PriorityFifo(priority_levels, clock)
        self.observer = observer
        self.closing = False  # a drain has begun: accept no more, flush what is queued
        self._waiter: asyncio.Future[None] | None = None
        self._wake_depth: int | None = None  # the waiter sleeps through arrivals below this depth
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sheds = False  # True: ``shed`` runs on the loop before each decision there (not in a drain)
        self.queue_wait_bound_s = 0.0  # > 0: a request queued this long is answered 503, not computed

    # ------------------------------------------------------------------ the one decision
    async def next_batch(self, policy: Policy) -> list[WorkItem] | None:
        """Event loop: wait until ``policy`` dispatches, and take that batch; None once a
        drain has begun and the queue is empty."""
        queue = self.queue
        while True:
            if not len(queue):
                if self.closing:
                    return None
                await self.wait_for_change()
                continue
            now = self._now()
            bound = self.queue_wait_bound_s
            if bound and not self.closing and self.shed_overdue(now, bound):
                continue
            try:
                if self.sheds and not self.closing and self.shed(now):
                    continue
                decision = decide_once(policy, self, now)
                if isinstance(decision, Wait):
                    if self.closing:
                        raise RuntimeError("the policy waited while draining")
                    await self.wait_for_change(decision.timeout, decision.wake_at_depth)
                    continue
                batch = self.take(decision.rows)
            except DispatchFailed as failed:
                fail(failed.items, failed.error)
                continue
            except Exception as exc:
                self._policy_failed(exc)
                continue
            if batch:
                return batch
            # else every head item was answered meanwhile: decide again

    def ready_batch(self, policy: Policy) -> tuple[list[WorkItem], BaseException | None]:
        """Engine thread, between batches: the batch ``policy`` dispatches right now (empty
        if it would wait), and the error to answer it with when ``on_dispatch`` raised. A
        decision that raises here leaves the queue to the event loop, which asks again."""
        queue = self.queue
        with queue.lock:
            if not len(queue):
                return [], None
            now = self._now()
            bound = self.queue_wait_bound_s
            if bound and queue.arrived_before(now - bound):
                return [], None  # the loop answers the overdue ones (futures live on the loop)
            try:
                decision = decide_once(policy, self, now)
            except Exception:
                log.warning(
                    "batching policy failed on an engine thread; the event loop decides", exc_info=True
                )
                return [], None
            if isinstance(decision, Wait) or not decision.complete:
                return [], None  # the loop takes it, with what it has received meanwhile
            try:
                return self.take(decision.rows), None
            except DispatchFailed as failed:
                return failed.items, failed.error

    def shed(self, now: float) -> bool:
        """Event loop, before a decision (when ``sheds``): answer queued requests the policy
        refuses to serve; True if any left the queue."""
        return False

    def shed_overdue(self, now: float, bound: float) -> bool:
        """Event loop: answer every queued request that has waited ``bound`` seconds with
        503 + Retry-After (never computed); True if any left the queue."""
        overdue = self.queue.pop_arrived_before(now - bound)
        for item in overdue:
            item.finish(
                error=QueueWaitExceeded(
                    f"waited {now - item.arrival:.1f} s in the queue, over the bound of {bound:g} s "
                    "(max_queue_wait_s); not computed"
                )
            )
        return bool(overdue)

    def _policy_failed(self, exc: Exception) -> None:
        """The decision raised: fail the request it was about (the head), go on."""
        log.error(
            "batching policy failed: %r; failing the request at the head of the queue", exc, exc_info=exc
        )
        for item in self.queue.pop(1):
            item.finish(error=BatchFailed(f"batching policy failed: {exc}"))

    # ------------------------------------------------------------------ taking
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
        now = self._now()
        taken = [item for item in popped if item.start(now)]
        if taken:
            try:
                self.observer.on_dispatch(taken, now)
            except Exception as exc:
                raise DispatchFailed(taken, exc) from exc
        return taken

    def _unqueue(self, item: WorkItem) -> bool:
        """Take ``item`` out of the queue if it is still there (True if it was)."""
        if item.state is ItemState.QUEUED and self.queue.remove(item):
            self._queue_changed()
            return True
        return False

    # ------------------------------------------------------------------ waiting
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
            handle = self.clock.call_later(max(0.0, timeout), _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def _queue_changed(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            depth = self._wake_depth
            queue = self.queue
            if depth is None or self.closing or queue.rows >= depth or not queue.regular:
                waiter.set_result(None)


def decide_once(policy: Policy, view: QueueView, now: float) -> Dispatch | Wait:
    """The one decision step, in one hold of the queue's lock (the loop and the engine
    threads both decide): ask the policy, apply the queue moves its answer names (``Delay``),
    let it ``observe`` the answer; what to do next (take a batch, or wait)."""
    queue = view.queue
    with queue.lock:
        decision = policy.decide(view, now)
        policy_answer = decision
        if isinstance(decision, Delay):
            queue.delay_first(decision.counts)
            decision = decision.then
        policy.observe(policy_answer, now)
    return decision


def fail(items: list[WorkItem], error: BaseException) -> None:
    """Event loop: answer every item of ``items`` with ``error`` (those not answered yet)."""
    for item in items:
        item.finish(error=error)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
