"""The sequences a stateful model is serving: one batch slot per live sequence, one request
of a sequence at a time, and the idle reaper (Triton's sequence batcher, its bookkeeping).

Event loop only. A sequence is *live* from its START request until its END request is
accepted or it has been idle ``idle_s`` (no request arrived for it): then a later request
of it (without START) is refused with Triton's words. A live sequence holds a slot from the
moment one is free until its last request is answered; sequences that start while every
slot is taken wait for one in start order (Triton's backlog).

As Triton's ``SequenceBatchScheduler``, each model instance has its own slots (numbered
from 0 in each), and a sequence keeps the instance and slot it got for its whole life: its
requests run only on that instance, at that slot's batch row. A starting sequence gets the
lowest free slot number of any instance (Triton's ready slots are a heap ordered by slot
number; wattserve breaks its ties by the lowest instance), so sequences spread across the
instances before any instance's batch grows; a slot that frees passes, with its instance,
to the backlog's first sequence.

Each request of a sequence waits for its turn: the answer of the request before it (its
``tail``), and the sequence's slot. So at most one request of a sequence is ever queued or
running, and they run in arrival order, whatever the batch policy does with the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections import deque
from dataclasses import dataclass, field

from wattserve.batchers.status import Status
from wattserve.batchers.types import RequestError, SequenceTag

log = logging.getLogger("wattserve.batcher")


class SequenceNotStarted(RequestError):
    """A request of a sequence that is not live (never started, ended, or reaped idle)."""

    status = Status.INVALID_ARG
    outcome = "bad_request"


@dataclass(eq=False)
class LiveSequence:
    """One live sequence: its slot (granted when ``slot`` is done), the answer of its latest
    request (``tail``), its idle timer, and its implicit state (``SequenceTag.state``)."""

    correlation_id: int | str
    slot: asyncio.Future[None]
    tail: asyncio.Future[None] | None = None
    timer: asyncio.TimerHandle | None = None
    state: dict = field(default_factory=dict)
    released: bool = False
    waiting: int = 0  # its requests waiting for their turn (outside the batcher's queue)
    index: int | None = None  # its slot's number in its instance once it has one (0 first): its batch row
    instance: int | None = None  # the model instance its slot belongs to: its requests run only there


class Sequences:
    """The live sequences of one model: ``slots`` batch slots in each of its ``instances``
    model instances, and the backlog for them."""

    def __init__(self, slots: int, idle_s: float, model: str = "", instances: int = 1) -> None:
        self.per_instance = max(1, slots)
        self.instances = max(1, instances)
        self.slots = self.per_instance * self.instances  # all instances' together
        self.idle_s = idle_s
        self.model = model
        self.free = self.slots
        # a heap of (slot number, instance): the lowest free slot number goes first (Triton's)
        self._free_slots = [
            (index, inst) for index in range(self.per_instance) for inst in range(self.instances)
        ]
        heapq.heapify(self._free_slots)
        self.live: dict[int | str, LiveSequence] = {}
        self.backlog: deque[LiveSequence] = deque()  # started, waiting for a slot, in start order
        self.reaped = 0  # sequences released for being idle (tests and logs)
        # requests waiting for their turn outside the batcher's queue, by whether their
        # sequence holds a slot (Triton: in the slot's queue) or waits for one (its backlog)
        self.waiting_in_slots = 0
        self.waiting_for_slot = 0
        # per instance, per slot number: its sequence's requests waiting their turn
        self.waiting_at = [[0] * self.per_instance for _ in range(self.instances)]

    def join(self, tag: SequenceTag, loop: asyncio.AbstractEventLoop) -> LiveSequence:
        """The live sequence ``tag`` belongs to (a new one for a START), or
        SequenceNotStarted with Triton's message; the idle clock restarts."""
        cid = tag.correlation_id
        seq = self.live.get(cid)
        if seq is None:
            if not tag.start:
                raise SequenceNotStarted(
                    f"inference request for sequence {cid} to model '{self.model}' must specify the START "
                    "flag on the first request of the sequence"
                )
            seq = LiveSequence(cid, loop.create_future())
            self.live[cid] = seq
            self._grant_or_wait(seq)
        elif tag.start:  # Triton continues in the same slot, with the new sequence's START
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end "
                        "before this sequence start. Previous sequence will be terminated early.",
                        cid, self.model)  # fmt: skip
        if tag.start:
            seq.state = {}  # a new sequence starts from its initial state
        tag.state = seq.state
        if seq.timer is not None:
            seq.timer.cancel()
            seq.timer = None
        if tag.end:  # Triton stops tracking the correlation ID once the END is accepted
            del self.live[cid]
        elif self.idle_s > 0:
            seq.timer = loop.call_later(self.idle_s, self._idle, seq)
        return seq

    def next_turn(
        self, seq: LiveSequence, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """(the answer to wait for before this request may be queued, this request's own
        answer for the next one to wait for)."""
        previous, mine = seq.tail, loop.create_future()
        seq.tail = mine
        return previous, mine

    def answered(
        self, seq: LiveSequence, mine: asyncio.Future[None], previous: asyncio.Future[None] | None
    ) -> None:
        """This request is answered (or gone): the next one may go once ``previous`` has;
        a sequence that is no longer live gives its slot back after its last request."""

        def done(_: object = None) -> None:
            if not mine.done():
                mine.set_result(None)
            if seq.tail is mine and self.live.get(seq.correlation_id) is not seq:
                self.release(seq)

        if previous is None or previous.done():
            done()
        else:
            previous.add_done_callback(done)

    def waits(self, seq: LiveSequence) -> None:
        """A request of ``seq`` begins to wait for its turn."""
        seq.waiting += 1
        if _holds_slot(seq):
            self.waiting_in_slots += 1
            self._at(seq, 1)
        else:
            self.waiting_for_slot += 1

    def waited(self, seq: LiveSequence) -> None:
        """A request of ``seq`` stops waiting (its turn came, or it is gone)."""
        seq.waiting -= 1
        if _holds_slot(seq):
            self.waiting_in_slots -= 1
            self._at(seq, -1)
        else:
            self.waiting_for_slot -= 1

    def highest_waiting(self, instance: int = 0) -> int:
        """The highest slot number of ``instance`` whose sequence has a request waiting its
        turn; -1: none. Read from any thread (lists of ints the loop updates)."""
        at = self.waiting_at[instance]
        for index in range(len(at) - 1, -1, -1):
            if at[index] > 0:
                return index
        return -1

    def _at(self, seq: LiveSequence, change: int) -> None:
        if seq.index is not None and seq.instance is not None:
            self.waiting_at[seq.instance][seq.index] += change

    def release(self, seq: LiveSequence) -> None:
        """Give ``seq``'s slot to the oldest waiting sequence, or back to the free ones."""
        if seq.released:
            return
        seq.released = True
        if seq.timer is not None:
            seq.timer.cancel()
            seq.timer = None
        if self.live.get(seq.correlation_id) is seq:
            del self.live[seq.correlation_id]
        if not seq.slot.done():  # never got one: leave the backlog
            seq.slot.cancel()
            with contextlib.suppress(ValueError):
                self.backlog.remove(seq)
            return
        while self.backlog:
            waiting = self.backlog.popleft()
            if not waiting.slot.done():
                # the slot passes on: its row and its instance
                waiting.index, waiting.instance = seq.index, seq.instance
                waiting.slot.set_result(None)
                self.waiting_for_slot -= waiting.waiting  # its requests now wait in the slot
                self.waiting_in_slots += waiting.waiting
                self._at(waiting, waiting.waiting)
                return
        self.free += 1
        if seq.index is not None and seq.instance is not None:
            heapq.heappush(self._free_slots, (seq.index, seq.instance))

    def forget(self) -> None:
        """The model is unloading: no sequence is live any more, no idle timer left armed."""
        for seq in self.live.values():
            if seq.timer is not None:
                seq.timer.cancel()
                seq.timer = None
        self.live.clear()

    def _grant_or_wait(self, seq: LiveSequence) -> None:
        if self.free:
            self.free -= 1
            seq.index, seq.instance = heapq.heappop(self._free_slots)
            seq.slot.set_result(None)
        else:
            self.backlog.append(seq)

    def _idle(self, seq: LiveSequence) -> None:
        """No request arrived for ``seq`` in ``idle_s``: it is no longer live (a later
        request of it is refused); its slot goes once its last request is answered."""
        seq.timer = None
        if self.live.get(seq.correlation_id) is not seq:
            return
        del self.live[seq.correlation_id]
        self.reaped += 1
        log.info(
            "sequence %s of model '%s' idle for %gs: released", seq.correlation_id, self.model, self.idle_s
        )
        if seq.tail is None or seq.tail.done():
            self.release(seq)


def _holds_slot(seq: LiveSequence) -> bool:
    return seq.slot.done() and not seq.slot.cancelled()
