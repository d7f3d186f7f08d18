"""sequence: Triton's sequence batcher for stateful models, the ``direct`` strategy.

Each live sequence holds one batch slot (``max_batch_size`` slots per model instance;
sequences that start while all are taken wait for one, in start order) and has at most one
request queued or running: a request waits outside the queue until the one before it in
its sequence is answered (``batchers.sequence_slots``). So the queue holds exactly the slots' next requests,
and a batch is some of them: requests of one sequence never run together or out of order.

The decision is the same pure ``decide(view, now)`` as every policy's (``batchers.policy``):
a batch goes once ``minimum_slot_utilization`` of the slots have a request ready (at least
one), else when the oldest ready request has waited ``max_queue_delay`` (Triton's defaults,
0 and 0: at once). Triton's direct batcher also puts each sequence at its slot's row of the
batch with READY=0 rows in between; here the batch is the ready requests, in queue order
(docs/triton.md): a model that keys its state by the correlation ID or keeps implicit state
sees the same; one that keys it by batch row does not. A sequence is not pinned to an
instance: any instance may run its next request (its implicit state travels with it; a
Python model, which keeps state in its instance, is refused more than one at load).

A request without a sequence (``WorkItem.sequence`` None) is queued as it is: the runtime
refuses those for a sequence model before they get here, with Triton's message.
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
class SequenceBatchingSpec(BatchingSpec):
    """A model's batching spec with its ``sequence_batching`` settings (made by the repository
    plan from the config; the process settings have none of these)."""

    min_slot_utilization: float = 0.0
    sequence_idle_s: float = DEFAULT_IDLE_S
    slots: int = 0  # live sequences at once (oldest's max_candidate_sequences); 0: max_batch_size


@dataclass
class SequenceConfig(BatcherConfig):
    max_queue_delay_s: float = 0.0
    min_slot_utilization: float = 0.0
    idle_s: float = DEFAULT_IDLE_S
    slots: int = 0  # 0: max_batch_size


class SequenceBatcher(RequestBatcher):
    name = "sequence"
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
        self._waiting = 0  # requests waiting for their turn (outside the queue)

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
        )

    # ------------------------------------------------------------------ the policy
    def decide(self, view: QueueView, now: float) -> Decision:
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

    # ------------------------------------------------------------------ a request's turn
    async def submit(self, item: WorkItem) -> Result:
        """A request of a sequence waits for its turn (the request before it answered, a
        slot), then is queued as any request is."""
        tag = item.sequence
        if tag is None:
            return await super().submit(item)
        self.check_admission()
        loop = self._loop or asyncio.get_running_loop()
        seq = self.sequences.join(tag, loop)
        previous, mine = self.sequences.next_turn(seq, loop)
        self._waiting += 1
        try:
            if previous is not None and not previous.done():
                await asyncio.shield(previous)
            if not seq.slot.done():
                await asyncio.shield(seq.slot)
            if item.cancelled:  # the client left while it waited: never computed
                raise ClientGone("client disconnected")
        except BaseException:
            self._waiting -= 1
            self.sequences.answered(seq, mine, previous)
            raise
        self._waiting -= 1
        try:
            return await super().submit(item)
        finally:
            self.sequences.answered(seq, mine, None)

    def close(self) -> None:
        """The base's (engine threads, engines), and no idle timer outlives the model."""
        self.sequences.forget()
        super().close()

    def check_admission(self, rows: int = 1) -> None:
        """The base's checks; requests waiting for their turn count against the queue's bound."""
        super().check_admission(rows)
        if self._waiting and len(self.queue) + self._waiting + 1 > self.config.max_queue_size:
            raise QueueFull(f"queue full ({self.config.max_queue_size} requests waiting)")
