"""The batcher contract, and the request-level batcher built from a scheduler and executors.

A batcher is a scheduler (``batchers.scheduler``: the bounded priority queue, and the
policy's one decision over it, ``batchers.policy``) over ``instances`` engine executors
(``batchers.executor``: one thread per engine instance, like Triton's instance groups,
where batches are stacked, run, retried and split). This module adds the request's life
around them: admission, deadlines, cancel, drain, and the loop that hands each batch the
policy dispatches to a free executor, so the next batch forms while this one computes.

A work item is one whole request and may carry several rows (its tensors have the batch
axis first); batch sizes count rows, and a batch is a run of whole items (``PriorityFifo.
pop_batch``), as Triton never splits a request.

Invariants kept here (docs/architecture.md, "How the invariants are kept"): every accepted
item is answered exactly once (its future is resolved by exactly one of: result, engine
error, deadline, drain, a failing policy or observer); each item's outputs are its own rows
of the batch it rode in (rows are concatenated in item order and sliced back by offset);
queues are bounded.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic

from wattserve.batchers.clock import REAL_CLOCK, Clock, Timer
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.engine_thread import EngineThread
from wattserve.batchers.executor import (
    AnyEngine,
    BatchExecutor,
    BatchOutcome,
    EngineInstance,
    answer,
    engine_thread,
    padded_size,
)
from wattserve.batchers.observers import NULL_OBSERVER, BatchObserver, BatchReport
from wattserve.batchers.policy import Decision, QueueView
from wattserve.batchers.rate_limiter import Claim, RateLimiter
from wattserve.batchers.scheduler import Scheduler, fail
from wattserve.batchers.types import (
    Answering,
    BatchFailed,
    ClientGone,
    DeadlineExceeded,
    Draining,
    QueueFull,
    Result,
    WorkItem,
)
from wattserve.engines.base import Engine, ReportsSteps

log = logging.getLogger("wattserve.batcher")

# Where they lived before the scheduler and the executor had modules of their own.
__all__ = ["BatchOutcome", "EngineInstance", "engine_thread", "padded_size"]


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


class Batcher(Scheduler, ABC, Generic[AnyEngine]):
    """Base of every policy: the scheduler's queue, submit, deadlines, cancel, drain, the
    engine instances.

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
        threads: Sequence[EngineThread] | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        """``threads``: each engine's own ``engine_thread``, the one it was built on (one
        is started per engine when not given). ``clock``: the time every arrival, deadline,
        wait and batch is on (``batchers.clock``; a test's fake clock)."""
        if not engines:
            raise ValueError("a batcher needs at least one engine instance")
        if threads is not None and len(threads) != len(engines):
            raise ValueError(f"{len(threads)} engine threads for {len(engines)} engines")
        super().__init__(config.priority_levels, observer if observer is not None else NULL_OBSERVER, clock)
        self.config = config
        self.engine = engines[0]  # metadata source; all instances serve the same model
        owned = list(threads) if threads is not None else [None] * len(engines)
        self.instances = [
            EngineInstance(e, i, t) for i, (e, t) in enumerate(zip(engines, owned, strict=True))
        ]
        if observer is not None:  # each model call of a step engine, whichever policy batches
            for engine in engines:
                if isinstance(engine, ReportsSteps):
                    engine.step_observer = observer.on_step
        self.service_rate = self.queue.drain  # the time bound's pace (batchers.service_rate)
        self.queue_wait_bound_s = config.max_queue_wait_s  # kept at admission and when a batch forms
        self.last_batch_at = clock.now()  # read by the idle memory trimmer
        self.inflight = 0
        self._stopped: asyncio.Event | None = None

    @classmethod
    def config_from(cls, spec: BatchingSpec, engine: Engine) -> BatcherConfig:
        """This policy's config from a model's batching spec and its engine."""
        return BatcherConfig(**common_config(spec))

    # ------------------------------------------------------------------ public contract
    async def submit(self, item: WorkItem) -> Result:
        """The only way in: queue ``item`` and wait for its one answer."""
        future: asyncio.Future[Result] = (self._loop or asyncio.get_running_loop()).create_future()
        timer = self.enqueue(item, future)
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(item)  # its waiter is gone: never computed if still queued
            raise
        finally:
            self.release(timer)

    def enqueue(self, item: WorkItem, answer: Answering) -> Timer | None:
        """Queue ``item``, owed one answer through ``answer`` (``submit``'s future, or an
        object that answers when told, for a caller with no task per request: the engine
        core behind front-end processes); its deadline timer, which the caller hands to
        ``release`` once the answer is in."""
        self.check_admission(item.rows, item.requests)  # a group: its rows and its requests
        if not 1 <= item.priority <= self.config.priority_levels:
            raise ValueError(f"priority level {item.priority} outside 1..{self.config.priority_levels}")
        deadline = item.deadline
        if deadline is not None and deadline <= self._now():
            raise DeadlineExceeded("deadline passed before the request was queued")
        item.enqueue(answer)
        self.queue.push(item)
        self._queue_changed()
        timer = None
        if deadline is not None:
            timer = self.clock.call_later(max(0.0, deadline - self._now()), self._expire, item)
        self.inflight += 1
        return timer

    def release(self, timer: Timer | None) -> None:
        """An enqueued item's answer is in: its deadline timer goes, it is in flight no more."""
        if timer is not None:
            timer.cancel()
        self.inflight -= 1

    def check_admission(self, rows: int = 1, requests: int = 1) -> None:
        """Raise the refusal ``submit`` would give now, so a route can refuse a request
        before reading its body: draining, queue full by count of requests (Triton's
        max_queue_size; a front end's group of ``requests`` is admitted whole or refused),
        or by time (the rows queued at the measured rate)."""
        if self.closing:
            raise Draining("server is draining; not accepting new requests")
        queue = self.queue
        if len(queue) + queue.grouped + requests > self.config.max_queue_size:  # queue.requests, inlined
            raise QueueFull(f"queue full ({self.config.max_queue_size} requests waiting)")
        bound = self.config.max_queue_wait_s
        if bound > 0 and len(queue):
            wait = self.service_rate.wait_s(queue.rows + rows, self._now())
            if wait > bound:
                raise QueueFull(f"queue holds about {wait:.1f} s of work (bound {bound:g} s)")

    async def prepare(self) -> None:
        """What the policy does before its model reports ready (the runtime awaits it before
        ``run``): the adaptive policy times its batch sizes here, so the first requests do
        not queue behind that timing. Nothing by default."""

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
        item.cancelled = True
        self._unqueue(item)
        item.finish(error=ClientGone("client disconnected"))

    def close(self) -> None:
        """Release engine threads and engines (after drain)."""
        for inst in self.instances:
            inst.close()

    @property
    def queue_depth(self) -> int:
        """Requests queued (a front end's group counts its members)."""
        return self.queue.requests

    @property
    def running_count(self) -> int:
        """Requests in an iteration-level running set now (0 for request-level policies)."""
        return 0

    def collector(self, model: str) -> Any:
        """A Prometheus collector of the policy's own state (read at scrape time) for the
        server to register beside its metrics, labelled ``model``; None if it has none."""
        return None

    # ------------------------------------------------------------------ internals
    def _expire(self, item: WorkItem) -> None:
        if item.delay_on_timeout:  # Triton's DELAY: it runs after the on-time requests;
            if self.queue.delay(item):  # once taken by a batch, it is answered as usual
                self._queue_changed()
            return
        if self._unqueue(item):
            item.finish(error=DeadlineExceeded("expired while queued; not computed"))
        else:
            item.finish(
                error=DeadlineExceeded("expired during compute (or after dispatch); result discarded")
            )

    def _abandon(self, item: WorkItem) -> None:
        """Its waiter is gone (cancelled): never compute it, never answer it."""
        item.cancelled = True
        self._unqueue(item)
        item.abandon()

    def _answer_error(self, item: WorkItem, exc: BaseException) -> None:
        item.finish(error=exc)


class RequestBatcher(Batcher[Engine]):
    """Request-level policies: a batch is formed, computed whole, and answered whole.

    A subclass is a policy: it implements ``decide`` (``batchers.policy``), the one question
    the scheduler asks whenever an engine instance is free and requests are queued.

    Pipelining: when an engine thread finishes a batch it asks ``decide`` itself, at that
    moment, over what is queued then (``Scheduler.ready_batch``); if the policy dispatches,
    the thread takes that batch and starts it with no round trip through the event loop,
    while the loop answers the batch just finished. When the policy would wait (a timer, a
    partial static batch) the instance goes back to the loop, which waits as the policy
    says and asks again (``Scheduler.next_batch``). So every policy's semantics hold: the
    batch is formed at the moment the instance is free, from the queue as it is then,
    priorities first. ``pipeline = False`` keeps every decision on the loop.
    """

    def __init__(self, engines: Sequence[Engine], config: BatcherConfig, **hooks: Any) -> None:
        super().__init__(engines, config, **hooks)
        self._free: asyncio.Queue[BatchExecutor] | None = None  # idle engine executors
        self._busy = 0  # executors running a chain of batches
        self._all_idle: asyncio.Event | None = None
        self.pipeline = True  # engine threads take the next ready batch themselves
        # Triton's rate limiter (``use_rate_limiter``): each instance's claim, None where it is not limited
        self._limiter: RateLimiter | None = None
        self._claims: list[Claim | None] = []
        self._granting: set[asyncio.Task[None]] = set()  # batches waiting for their resources

    def use_rate_limiter(self, limiter: RateLimiter, claims: Sequence[Claim | None]) -> None:
        """Before ``run``: instance ``i`` runs a batch only once ``limiter`` grants ``claims[i]``
        (held while the batch runs, so such an instance never chains batches on its thread)."""
        if len(claims) != len(self.instances):
            raise ValueError(f"{len(claims)} rate limiter claims for {len(self.instances)} instances")
        if any(c is not None for c in claims):
            self._limiter, self._claims = limiter, list(claims)

    @abstractmethod
    def decide(self, view: QueueView, now: float) -> Decision:
        """The policy (``batchers.policy``): dispatch the head's requests up to so many
        rows now, or wait. Asked with a non-empty queue, on the event loop or an engine
        thread (under the queue's lock); must only read, and never wait once
        ``view.closing`` is set (a drain flushes what is queued)."""

    def observe(self, decision: Decision, now: float) -> None:
        """What the policy records of ``decision`` once applied (``batchers.policy``);
        nothing by default: most policies keep nothing of their decisions."""

    async def run(self) -> None:
        """The batching loop; started by the server's lifespan, ends after ``drain``."""
        loop = self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._all_idle = asyncio.Event()
        self._all_idle.set()
        self._free = asyncio.Queue()
        ready = self._next_ready if self.pipeline else None
        claims = self._claims or [None] * len(self.instances)
        for inst, claim in zip(self.instances, claims, strict=True):
            chain = ready if claim is None else None  # a limited batch is granted on the loop
            self._free.put_nowait(BatchExecutor(inst, self.observer, self._finished, chain, self._now))
        try:
            while True:
                executor = await self._free.get()
                batch = await self.next_batch(self)
                if batch is None:
                    self._free.put_nowait(executor)
                    break
                self._busy += 1
                self._all_idle.clear()
                claim = claims[executor.instance.index]
                if claim is None or self._try_acquire(claim):
                    executor.start(loop, batch)
                else:  # waits for its resources while the other instances go on
                    task = loop.create_task(self._start_when_granted(executor, batch, claim))
                    self._granting.add(task)
                    task.add_done_callback(self._granting.discard)
            await self._all_idle.wait()
        finally:
            self._stopped.set()

    def _try_acquire(self, claim: Claim) -> bool:
        assert self._limiter is not None
        return self._limiter.try_acquire(claim)

    async def _start_when_granted(self, executor: BatchExecutor, batch: list[WorkItem], claim: Claim) -> None:
        """Event loop: run ``batch`` once the limiter grants ``claim``; if the wait itself
        ends otherwise (the server stops), the batch fails, answered once."""
        assert self._limiter is not None
        try:
            await self._limiter.acquire(claim)
        except BaseException as exc:
            fail(batch, BatchFailed(f"batch failed waiting for rate limiter resources: {exc!r}"))
            self._release_executor(executor)
            raise
        assert self._loop is not None
        executor.start(self._loop, batch)

    def _next_ready(self) -> tuple[list[WorkItem], BaseException | None]:
        """Engine thread: the batch the policy dispatches right now, if any."""
        return self.ready_batch(self)

    def _finished(
        self, executor: BatchExecutor, batch: list[WorkItem], outcome: BatchOutcome | None,
        error: BaseException | None, continuing: bool,
    ) -> None:  # fmt: skip
        """Loop side of a finished batch: answer it; free the executor unless its thread
        already started the next batch."""
        try:
            if outcome is None:
                log.error("batch of %d failed outside the engine: %r", len(batch), error)
                fail(batch, BatchFailed(f"batch failed: {error}"))
            elif outcome.items:  # else every item was answered (deadline, client gone) before compute
                self._account(outcome)
                answer(outcome)
        finally:
            if self._claims:  # rate limited: a claimed batch never chains, give its resources back
                claim = self._claims[executor.instance.index]
                if claim is not None:
                    assert self._limiter is not None
                    self._limiter.release(claim)
            if not continuing:
                self._release_executor(executor)

    def _release_executor(self, executor: BatchExecutor) -> None:
        self._busy -= 1
        assert self._free is not None and self._all_idle is not None
        self._free.put_nowait(executor)
        if self._busy == 0:
            self._all_idle.set()

    def _account(self, outcome: BatchOutcome) -> None:
        """The books of one computed batch, before its items are answered: the observer's
        report, the policy's learning. Their trouble costs no request its answer (the
        results are computed already)."""
        self.last_batch_at = outcome.finished
        report = BatchReport(outcome.rows + outcome.null_rows, outcome.started, outcome.finished,
                             outcome.energy, outcome.padded, input_s=outcome.input_s,
                             output_s=outcome.output_s, null_rows=outcome.null_rows)  # fmt: skip
        try:
            self.observer.on_batch(report)
            self.batch_finished(outcome)
        except Exception:
            log.exception("batch observer failed; answering the batch anyway")

    # ------------------------------------------------------------------ policy hooks
    def batch_finished(self, outcome: BatchOutcome) -> None:
        """Called on the event loop once per executed batch (``outcome.items``), before its
        items are answered: policies that learn from what a batch cost (adaptive, aimd)
        override it."""
