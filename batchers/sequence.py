"""sequence: Triton's sequence batcher for stateful models, the ``direct`` strategy.

Each live sequence holds one batch slot (``max_batch_size`` slots per model instance;
sequences that start while all are taken wait for one, in start order) and has at most one
request queued or running: a request waits outside the queue until the one before it in
its sequence is answered (``batchers.sequence_slots``). So the queue holds exactly the slots' next requests,
and a batch is some of them: requests of one sequence never run together or out of order.

The decision is the same pure ``decide(view, now)`` as every policy's (``batchers.policy``):
a batch goes once ``minimum_slot_utilization`` of the slots have a request ready (at least
one), else when the oldest ready request has waited ``max_queue_delay`` (Triton's defaults,
0 and 0: at once). With one model instance, as Triton's direct batcher does, each request
runs at its sequence's slot's row of the batch (``SequenceTag.slot``: the lowest free slot
when the sequence got one) and the engine fills the idle slots' rows below the highest one
with READY=0 rows (``engines/sequence_model.py``). With more instances a batch is the ready
requests in queue order (docs/triton.md): a sequence is not pinned to an instance, any
instance may run its next request (its implicit state travels with it; a Python model,
which keeps state in its instance, is refused more than one at load).

A request without a sequence (``WorkItem.sequence`` None) is queued as it is: the runtime
refuses those for a sequence model before they get here, with Triton's message.

Triton's debug hooks, which its QA (``qa/L0_sequence_batcher``) sets so that requests pile
up before the first batch forms (``DelayHook``): ``TRITONSERVER_DELAY_SCHEDULER=N`` holds
every batch until N requests wait in the slots (queued, or waiting for their turn behind
the one before them), and with it ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER=M`` until M more
wait in the backlog for a slot; once both are reached the hold is over for good (Triton's
``SequenceBatchScheduler::DelayScheduler``). The server reads the variables at load
(``server/models/repository/sequence_plan.py``); the policy gets the numbers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wattserve.batchers.base import BatcherConfig, RequestBatcher, common_config
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.policy import Decision, Dispatch, QueueView, Wait
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
    name = "sequence"
    # direct: a batch is every ready request of the head's shape, each at its slot's batch row (one
    # instance); oldest batches as its dynamic batcher does
    slot_rows = True
    summary = (
        "Triton's sequence batcher (direct): a slot per live sequence, its requests one at a time, in order"
    )
    config: SequenceConfig

    def __init__(self, engines: Sequence[Engine], config: SequenceConfig, **hooks: Any) -> None:
        super().__init__(engines, config, **hooks)
        # Triton's slots: max_batch_size (oldest: max_candidate_sequences) per model instance
        slots = (config.slots or config.max_batch_size) * len(self.instances)
        self.sequences = Sequences(slots, config.idle_s, self.engine.name)
        # a batch goes at once when this many slots have a request ready
        self._enough = max(1, math.ceil(config.min_slot_utilization * config.max_batch_size - 1e-9))
        self._holding = config.delay.active  # Triton's delay hook: until it lets go, once
        # the slots are one instance's batch rows: each request runs at its slot's row
        self._slot_rows = self.slot_rows and len(self.instances) == 1

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
        """Triton's delay hook holds every batch: requests in the slots (queued, or waiting
        for the one before them) and in the backlog below its counts (never in a drain)."""
        sequences = self.sequences
        queued = len(view.queue) + sequences.waiting_in_slots
        return not view.closing and self.config.delay.holds(queued, sequences.waiting_for_slot)

    def observe(self, decision: Decision, now: float) -> None:
        """The delay hook lets go for good once a decision is not its hold."""
        if self._holding and not (isinstance(decision, Wait) and decision.note is HELD):
            self._holding = False

    # ------------------------------------------------------------------ a request's turn
    async def submit(self, item: WorkItem) -> Result:
        """A request of a sequence waits for its turn (the request before it answered, a
        slot), then is queued as any request is."""
        tag = item.sequence
        if tag is None:
            return await super().submit(item)
        self.check_admission()
        loop = self._loop or asyncio.get_running_loop()
        sequences = self.sequences
        seq = sequences.join(tag, loop)
        previous, mine = sequences.next_turn(seq, loop)
        sequences.waits(seq)
        if self._holding:  # the delay hook counts requests waiting outside the queue too
            self._queue_changed()
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
        if self._slot_rows:
            tag.slot = seq.index
        try:
            return await super().submit(item)
        finally:
            self.sequences.answered(seq, mine, None)

    def take(self, rows: int) -> list[WorkItem]:
        """Triton's direct batch: the head request and every other ready one of its shape, in
        queue order, up to ``rows`` (a request of another shape waits for a later batch,
        whatever its place in the queue). With slot rows each request also learns the batch's
        width: up to the highest slot with a request pending, taken or not (queued, or waiting
        behind its sequence's running one: in Triton's slot queue either way; its batch holds
        a null request at the row of each that is not in it)."""
        queue = self.queue
        if not self.slot_rows:  # oldest: its dynamic batcher's run at the head
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
            if self._slot_rows:  # slots with a request queued, taken, or waiting its turn
                slots = [item.sequence.slot for item in [*queue, *queued] if item.sequence is not None]
                highest = max((s for s in slots if s is not None), default=-1)
                width = max(highest, self.sequences.highest_waiting()) + 1
                for item in batch:
                    if item.sequence is not None:
                        item.sequence.width = width
        return batch

    def close(self) -> None:
        """The base's (engine threads, engines), and no idle timer outlives the model."""
        self.sequences.forget()
        super().close()

    def check_admission(self, rows: int = 1) -> None:
        """The base's checks; requests waiting for their turn count against the queue's bound."""
        super().check_admission(rows)
        waiting = self.sequences.waiting_in_slots + self.sequences.waiting_for_slot
        if waiting and len(self.queue) + waiting + 1 > self.config.max_queue_size:
            raise QueueFull(f"queue full ({self.config.max_queue_size} requests waiting)")
