"""What flows through a batcher: work items in, results (or one explicit error) out."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from wattserve.batchers.clock import REAL_CLOCK
from wattserve.batchers.status import Status


class ItemState(enum.Enum):
    """queued -> running -> done; cancel and expiry go to done from either earlier state.

    Only ``WorkItem``'s own methods move an item (``enqueue``, ``start``, ``finish``,
    ``abandon``), so no path can move a finished item back or answer it twice."""

    QUEUED = "queued"  # in the batcher's queue
    RUNNING = "running"  # taken into a batch (staged or computing)
    DONE = "done"  # answered (result or error); nothing may answer it again


class Answering(Protocol):
    """Where a work item's one answer goes: ``submit``'s asyncio future (its waiter wakes on
    the next loop turn), or an object that answers when told, for a caller with many
    requests and no task per request (``server.models.runtime.NowaitAnswer``)."""

    def done(self) -> bool: ...

    def set_result(self, result: Result, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


@dataclass(eq=False, slots=True)
class SequenceTag:
    """Which sequence a request of a stateful model belongs to (Triton's correlation ID and
    START/END flags, from the request's ``sequence_*`` parameters). ``state``: the
    sequence's implicit state, one dict shared by all its requests, set by the sequence
    batcher and read and written only by the engine (its requests never run at once).
    ``slot``: the row of the batch the request runs at, set by the direct sequence batcher
    (its slot's number in its instance: the slots are that instance's batch rows, as
    Triton's are); ``instance``: the model instance the sequence's slot belongs to."""

    correlation_id: int | str
    start: bool = False
    end: bool = False
    state: dict | None = None
    slot: int | None = None  # its batch row (Triton's direct: the sequence's slot); None: any row
    instance: int | None = None  # the model instance its sequence is pinned to (its slot's)
    width: int = 0  # rows of its batch at least (the highest slot with a request ready, + 1)

    @property
    def flags(self) -> int:
        """Triton's request flags: SEQUENCE_START 1, SEQUENCE_END 2."""
        return (1 if self.start else 0) | (2 if self.end else 0)


@dataclass(eq=False, slots=True)
class WorkItem:
    """One whole request: its inputs with the batch axis first (``rows`` rows each) and its
    scheduling parameters.

    A request is never split into rows (Triton batches whole requests): policies count
    rows, a batch is a run of whole items, and each item's outputs are its own rows of the
    batch's outputs. ``shape_key``: the item's per-row input shapes when the model has
    variable dimensions (only items with equal keys share a batch, Triton's default); None
    for fixed-shape models, where every item fits with every other."""

    inputs: dict[str, np.ndarray]
    priority: int = 1  # 1 is the highest level
    # deadline and arrival: seconds on the batcher's clock (batchers.clock; time.monotonic's
    # unless a test gives the batcher another clock, when it sets both itself)
    deadline: float | None = None  # None = no deadline
    arrival: float = field(default_factory=REAL_CLOCK.now)
    future: Answering | None = None  # where its one answer goes (set by ``enqueue``)
    state: ItemState = ItemState.QUEUED
    dispatched_at: float | None = None
    rows: int = 1
    # the client requests this item answers: more than 1 for a front end's group (several
    # one-row requests decoded in one turn, sent to the engine core as one multi-row item:
    # server/split/core_client.py), counted as that many by the queue's bound and the books
    requests: int = 1
    shape_key: tuple | None = None
    # Triton's ``timeout_action: DELAY``: when ``deadline`` passes while queued, the item
    # moves behind the on-time items of its level instead of being answered with an error
    delay_on_timeout: bool = False
    # what the front end knew of the request beyond its tensors (its id, requested outputs,
    # a stream's response sink): read only by engines that take requests (RunsRequests)
    context: object = None
    # the response cache's key for this request (server/models/response_cache.py); None: not cached
    cache_key: bytes | None = None
    # the client has gone (HTTP connection lost, gRPC call cancelled): set on the loop, read
    # by a running engine that takes requests (a Python model's ``request.is_cancelled()``)
    cancelled: bool = False
    # a stateful model's request: its sequence (batchers/sequence.py); None for every other model
    sequence: SequenceTag | None = None

    def is_cancelled(self) -> bool:
        return self.cancelled

    def enqueue(self, future: Answering) -> None:
        """-> queued, owed one answer through ``future`` (``Batcher.enqueue``)."""
        self.future = future
        self.state = ItemState.QUEUED

    def abandon(self) -> None:
        """-> done with no answer: its waiter is gone (the client left), so nothing may
        compute or answer it later."""
        self.state = ItemState.DONE

    def start(self, now: float) -> bool:
        """queued -> running, when a batch takes it. False if it was answered meanwhile."""
        if self.state is not ItemState.QUEUED:
            return False
        self.state = ItemState.RUNNING
        self.dispatched_at = now
        return True

    def finish(self, result: Result | None = None, error: BaseException | None = None) -> bool:
        """-> done, with exactly one answer. False (and nothing sent) if it was done already.

        The future may be gone already (its waiter cancelled: the client left); the item
        is still done, so nothing computes or answers it later."""
        if self.state is ItemState.DONE:
            return False
        self.state = ItemState.DONE
        future = self.future
        if future is None or future.done():
            return False
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)
        else:  # a caller's bug: the waiter would never wake
            raise TypeError("finish() takes a result or an error")
        return True


@dataclass(slots=True)
class Result:
    """One request's outputs (its own rows, batch axis first) and how it was served (made
    visible in response headers and Triton's statistics)."""

    outputs: dict[str, np.ndarray]
    queue_time_s: float
    compute_time_s: float
    batch_size: int  # rows in the batch it rode in
    input_s: float = 0.0  # the batch's input gathering (Triton's compute_input)
    output_s: float = 0.0  # the batch's output scatter (Triton's compute_output)


class RequestError(Exception):
    """An explicit, per-request error answer: a status kind each front end maps."""

    status = Status.INTERNAL
    outcome = "error"
    retry_after: bool = False


class QueueFull(RequestError):
    status = Status.UNAVAILABLE
    outcome = "queue_full"
    retry_after = True


class QueueWaitExceeded(QueueFull):
    """503 + Retry-After: the request waited ``max_queue_wait_s`` in the queue without a
    batch taking it, so it is answered now and never computed (the time bound kept when the
    admission estimate could not foresee the wait: Triton's queue policy with
    ``timeout_action: REJECT`` does the same)."""

    outcome = "queue_timeout"


class Draining(RequestError):
    status = Status.UNAVAILABLE
    outcome = "draining"
    retry_after = True


TIMEOUT_MESSAGE = "Request timeout expired"  # Triton's words; its clients match on them


class DeadlineExceeded(RequestError):
    """The request's queue timeout expired: Triton's UNAVAILABLE "Request timeout expired"."""

    status = Status.UNAVAILABLE
    outcome = "timeout"

    def __init__(self, detail: str = "") -> None:
        super().__init__(TIMEOUT_MESSAGE)
        self.detail = detail  # where it expired (queued, during compute), for logs and tests


class ClientGone(RequestError):
    """The client disconnected; nobody reads this answer (HTTP 499, nginx's convention)."""

    status = Status.CANCELLED
    outcome = "cancelled"


class BatchFailed(RequestError):
    status = Status.INTERNAL
    outcome = "error"
