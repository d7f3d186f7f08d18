"""sequence: Triton's sequence batcher for stateful models, the ``direct`` strategy.

As Triton's ``SequenceBatchScheduler``, the batcher is one batch per model instance (a
``SequenceLane``: its own queue, loop and engine thread, Triton's ``DirectSequenceBatch``)
under one bookkeeping of the sequences (``batchers.sequence_slots``): each instance has
``max_batch_size`` slots, a live sequence holds one slot of one instance for its whole life
(sequences that start while all are taken wait for one, in start order), and its requests
run only on that instance. Each sequence has at most one request queued or running: a
request waits outside the queues until the one before it in its sequence is answered, then
joins its instance's queue. So an instance's queue holds exactly its slots' next requests,
and a batch is some of them: requests of one sequence never run together or out of order.

The decision is the same pure ``decide(view, now)`` as every policy's (``batchers.policy``),
asked by each instance over its own queue: a batch goes once ``minimum_slot_utilization`` of
the instance's slots have a request ready (at least one), else when the oldest ready request
has waited ``max_queue_delay`` (Triton's defaults, 0 and 0: at once). As Triton's direct
batcher does, each request runs at its slot's row of its instance's batch
(``SequenceTag.slot``) and the engine fills the idle slots' rows below the highest one with
READY=0 rows (``engines/sequence_model.py``).

A request without a sequence (``WorkItem.sequence`` None) is queued as it is (on the first
instance): the runtime refuses those for a sequence model before they get here, with
Triton's message.

Triton's debug hooks, which its QA (``qa/L0_sequence_batcher``) sets so that requests pile
up before the first batch forms (``DelayHook``): ``TRITONSERVER_DELAY_SCHEDULER=N`` holds
every batch until N requests wait in the slots of all instances together (queued, or
waiting for their turn behind the one before them), and with it
``TRITONSERVER_BACKLOG_DELAY_SCHEDULER=M`` until M more wait in the backlog for a slot; once
both are reached the hold is over for good (Triton's ``SequenceBatchScheduler::
DelayScheduler``). The server reads the variables at load
(``server/models/repository/sequence_plan.py``); the policy gets the numbers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wattserve.batchers.base import BatcherConfig, RequestBatcher, common_config
from wattserve.batchers.clock import Clock
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.engine_thread import EngineThread
from wattserve.batchers.executor import BatchOutcome
from wattserve.batchers.observers import BatchObserver
from wattserve.batchers.policy import Decision, Dispatch, QueueView, Wait
from wattserve.batchers.rate_limiter import Claim, RateLimiter
from wattserve.batchers.sequence_slots import Sequences
from wattserve.batchers.types import ClientGone, QueueFull, Result, WorkItem
from wattserve.engines.base import Engine

DEFAULT_IDLE_S = 1.0  # Triton's max_sequence_idle_microseconds default


@dataclass(frozen=True)
class DelayHook:
    """Triton's ``TRITONSERVER_DELAY_SCHEDULER`` (``queued``) and
    ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER`` (``backlog``): no batch forms until ``queued``
    requests wait in the slots and, when ``backlog`` > 0, ``backlog`` more in the backlog.
    0 (the default): no hold; the backlog count alone holds nothing, as in Triton."""

    queued: int = 0
    backlog: int = 0

    @property
    def active(self) -> bool:
        return self.queued > 0

    def holds(self, queued: int, backlogged: int) -> bool:
        """Whether the batcher still holds, with these many requests waiting."""
        if not self.active:
            return False
        return queued < self.queued or (self.backlog > 0 and backlogged < self.backlog)


NO_DELAY = DelayHook()
HELD = "held by TRITONSERVER_DELAY_SCHEDULER"  # the note of a Wait the hook makes


@dataclass(frozen=True)
class SequenceBatchingSpec(BatchingSpec):
    """A model's batching spec with its ``sequence_batching`` settings (made by the repository
    plan from the config; the process settings have none of these)."""

    min_slot_utilization: float = 0.0
    sequence_idle_s: float = DEFAULT_IDLE_S
    slots: int = 0  # live sequences at once (oldest's max_candidate_sequences); 0: max_batch_size
    delay: DelayHook = NO_DELAY  # Triton's TRITONSERVER_*DELAY_SCHEDULER debug hooks


@dataclass
class SequenceConfig(BatcherConfig):
    max_queue_delay_s: float = 0.0
    min_slot_utilization: float = 0.0
    idle_s: float = DEFAULT_IDLE_S
    slots: int = 0  # 0: max_batch_size
    delay: DelayHook = NO_DELAY


class SequenceBatcher(RequestBatcher):
    """The sequences' slots over every instance, the policy each instance's batch is decided
    by, and the instances' batches (``lanes``, one per model instance). Requests queue in
    their instance's lane, not in this batcher's own queue (the base's, which stays empty):
    ``queue_depth`` sums the lanes'."""

    name = "sequence"
    # direct: a batch is every ready request of the head's shape, each at its slot's batch row;
    # oldest batches as its dynamic batcher does
    slot_rows = True
    summary = (
        "Triton's sequence batcher (direct): a slot per live sequence, its requests one at a time, in order"
    )
    config: SequenceConfig

    def __init__(self, engines: Sequence[Engine], config: SequenceConfig, **hooks: Any) -> None:
        super().__init__(engines, config, **hooks)
        # Triton's slots: max_batch_size (oldest: max_candidate_sequences) in each model instance
        self.sequences = Sequences(
            config.slots or config.max_batch_size, config.idle_s, self.engine.name, len(self.instances)
        )
        # a batch goes at once when this many of an instance's slots have a request ready
        self._enough = max(1, math.ceil(config.min_slot_utilization * config.max_batch_size - 1e-9))
        self._holding = config.delay.active  # Triton's delay hook: until it lets go, once
        observer = hooks.get("observer")
        self.lanes = [SequenceLane(self, i, inst.engine, inst.executor, observer, self.clock)
                      for i, inst in enumerate(self.instances)]  # fmt: skip

    @classmethod
    def config_from(cls, spec: BatchingSpec, engine: Engine) -> SequenceConfig:
        # no queue time bound (max_queue_wait_s): a request that waited for its turn (the one
        # before it in its sequence) is not late, and Triton's sequence batcher has none
        return SequenceConfig(
            **{**common_config(spec), "max_queue_wait_s": 0.0},
            max_queue_delay_s=spec.max_queue_delay_ms / 1000.0,
            min_slot_utilization=getattr(spec, "min_slot_utilization", 0.0),
            idle_s=getattr(spec, "sequence_idle_s", DEFAULT_IDLE_S),
            slots=getattr(spec, "slots", 0),
            delay=getattr(spec, "delay", NO_DELAY),
        )

    # ------------------------------------------------------------------ the policy
    def decide(self, view: QueueView, now: float) -> Decision:
        """One instance's decision over its queue (``view``: its lane)."""
        if self._holding and self.held(view):
            return Wait(None, note=HELD)
        queue = view.queue
        cap = self.config.max_batch_size
        if len(queue) >= self._enough or view.closing:
            return Dispatch(cap)
        oldest = queue.oldest_arrival()
        assert oldest is not None  # asked only with something queued
        left = oldest + self.config.max_queue_delay_s - now
        if left <= 0:
            return Dispatch(cap, complete=False)
        return Wait(left, self._enough)

    def held(self, view: QueueView) -> bool:
        """Triton's delay hook holds every batch: requests in all instances' slots (queued,
        or waiting for the one before them) and in the backlog below its counts (never in a
        drain)."""
        sequences = self.sequences
        queued = self.queue_depth + sequences.waiting_in_slots
        return not view.closing and self.config.delay.holds(queued, sequences.waiting_for_slot)

    def observe(self, decision: Decision, now: float) -> None:
        """The delay hook lets go for good once a decision is not its hold."""
        if self._holding and not (isinstance(decision, Wait) and decision.note is HELD):
            self._holding = False

    # ------------------------------------------------------------------ a request's turn
    async def submit(self, item: WorkItem) -> Result:
        """A request of a sequence waits for its turn (the request before it answered, a
        slot), then is queued on its slot's instance as any request is."""
        tag = item.sequence
        if tag is None:
            return await self._queued(self.lanes[0], item)
        self.check_admission()
        loop = self._loop or asyncio.get_running_loop()
        sequences = self.sequences
        seq = sequences.join(tag, loop)
        previous, mine = sequences.next_turn(seq, loop)
        sequences.waits(seq)
        if self._holding:  # the delay hook counts requests waiting outside the queues too
            self._wake_lanes()
        try:
            if previous is not None and not previous.done():
                await asyncio.shield(previous)
            if not seq.slot.done():
                await asyncio.shield(seq.slot)
            if item.cancelled:  # the client left while it waited: never computed
                raise ClientGone("client disconnected")
        except BaseException:
            sequences.waited(seq)
            sequences.answered(seq, mine, previous)
            raise
        sequences.waited(seq)
        assert seq.instance is not None  # it holds a slot
        tag.instance = seq.instance
        if self.slot_rows:
            tag.slot = seq.index
        try:
            return await self._queued(self.lanes[seq.instance], item)
        finally:
            self.sequences.answered(seq, mine, None)

    async def _queued(self, lane: SequenceLane, item: WorkItem) -> Result:
        """``item`` through ``lane``'s queue, counted in flight meanwhile."""
        self.inflight += 1
        try:
            return await lane.submit(item)
        finally:
            self.inflight -= 1

    def _wake_lanes(self) -> None:
        for lane in self.lanes:
            lane._queue_changed()

    # ------------------------------------------------------------------ the lanes together
    async def run(self) -> None:
        """Every instance's loop (each forms its own batches), until a drain ends them."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        try:
            await asyncio.gather(*(lane.run() for lane in self.lanes))
        finally:
            self._stopped.set()

    async def drain(self, timeout: float | None = None) -> None:
        """Accept no more; every instance finishes what it has accepted."""
        self.closing = True
        await asyncio.gather(*(lane.drain(timeout) for lane in self.lanes))

    def cancel(self, item: WorkItem) -> None:
        """The client went away: its instance answers it (never computed if still queued);
        one still waiting for its turn is answered now and never queued."""
        tag = item.sequence
        self.lanes[tag.instance if tag is not None and tag.instance is not None else 0].cancel(item)

    def use_rate_limiter(self, limiter: RateLimiter, claims: Sequence[Claim | None]) -> None:
        """Each instance's batches wait for that instance's claim."""
        if len(claims) != len(self.lanes):
            raise ValueError(f"{len(claims)} rate limiter claims for {len(self.lanes)} instances")
        for lane, claim in zip(self.lanes, claims, strict=True):
            lane.use_rate_limiter(limiter, [claim])

    @property
    def queue_depth(self) -> int:
        return sum(len(lane.queue) for lane in self.lanes)

    def close(self) -> None:
        """The lanes' (engine threads, engines), and no idle timer outlives the model."""
        self.sequences.forget()
        for lane in self.lanes:
            lane.close()

    def check_admission(self, rows: int = 1, requests: int = 1) -> None:
        """The base's checks; requests queued on any instance, and those waiting for their
        turn, count against the queue's bound."""
        super().check_admission(rows, requests)
        waiting = self.sequences.waiting_in_slots + self.sequences.waiting_for_slot
        if self.queue_depth + waiting + requests > self.config.max_queue_size:
            raise QueueFull(f"queue full ({self.config.max_queue_size} requests waiting)")


class SequenceLane(RequestBatcher):
    """One model instance's batches (Triton's ``DirectSequenceBatch``, or the dynamic batcher
    of its ``OldestSequenceBatch``): the requests of the sequences whose slots are this
    instance's, in its own queue, formed into batches for its one engine by its own loop, as
    its owner's policy decides."""

    def __init__(self, owner: SequenceBatcher, index: int, engine: Engine, thread: EngineThread,
                 observer: BatchObserver | None, clock: Clock) -> None:  # fmt: skip
        super().__init__([engine], owner.config, observer=observer, threads=[thread], clock=clock)
        self.owner = owner
        self.index = index  # the model instance: its slots are Sequences' slots of this instance

    def decide(self, view: QueueView, now: float) -> Decision:
        return self.owner.decide(view, now)

    def observe(self, decision: Decision, now: float) -> None:
        self.owner.observe(decision, now)

    def batch_finished(self, outcome: BatchOutcome) -> None:
        """The owner's books: when its last batch ended (the idle trimmer reads it)."""
        self.owner.last_batch_at = outcome.finished
        self.owner.batch_finished(outcome)

    def take(self, rows: int) -> list[WorkItem]:
        """Triton's direct batch: the head request and every other ready one of its shape, in
        queue order, up to ``rows`` (a request of another shape waits for a later batch,
        whatever its place in the queue). Each request also learns the batch's width: up to
        this instance's highest slot with a request pending, taken or not (queued, or waiting
        behind its sequence's running one: in Triton's slot queue either way; its batch holds
        a null request at the row of each that is not in it). The oldest strategy takes the
        run at the head, as its dynamic batcher does."""
        queue = self.queue
        if not self.owner.slot_rows:
            return super().take(rows)
        with queue.lock:
            if queue.regular:  # one shape, one row each: the head's run is the batch
                batch = super().take(rows)
                queued: list[WorkItem] = batch
            else:
                queued = list(queue)
                key = queued[0].shape_key if queued else None
                chosen = [item for item in queued if item.shape_key == key][: max(1, rows)]
                batch = self._started([item for item in chosen if queue.remove(item)])
            # this instance's slots with a request queued, taken, or waiting its turn
            slots = [item.sequence.slot for item in [*queue, *queued] if item.sequence is not None]
            highest = max((s for s in slots if s is not None), default=-1)
            width = max(highest, self.owner.sequences.highest_waiting(self.index)) + 1
            for item in batch:
                if item.sequence is not None:
                    item.sequence.width = width
        return batch
