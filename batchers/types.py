"""What flows through a batcher: work items in, results (or one explicit error) out."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from time import monotonic

import numpy as np


class ItemState(enum.Enum):
    """queued -> running -> done; cancel and expiry go to done from either earlier state.

    Only ``WorkItem.start`` and ``WorkItem.finish`` move an item, so no path can move a
    finished item back or answer it twice."""

    QUEUED = "queued"  # in the batcher's queue
    RUNNING = "running"  # taken into a batch (staged or computing)
    DONE = "done"  # answered (result or error); nothing may answer it again


@dataclass(eq=False, slots=True)
class WorkItem:
    """One request's inputs (no batch dimension) and its scheduling parameters."""

    inputs: dict[str, np.ndarray]
    priority: int = 1  # 1 is the highest level
    deadline: float | None = None  # time.monotonic() seconds; None = no deadline
    arrival: float = field(default_factory=monotonic)
    future: asyncio.Future[Result] | None = None
    state: ItemState = ItemState.QUEUED
    dispatched_at: float | None = None

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
        else:
            future.set_result(result)
        return True


@dataclass(slots=True)
class Result:
    """One request's outputs and how it was served (made visible in response headers)."""

    outputs: dict[str, np.ndarray]
    queue_time_s: float
    compute_time_s: float
    batch_size: int


class RequestError(Exception):
    """An explicit, per-request error answer; maps to one HTTP status."""

    status_code = 500
    outcome = "error"
    retry_after: bool = False


class QueueFull(RequestError):
    status_code = 503
    outcome = "queue_full"
    retry_after = True


class Draining(RequestError):
    status_code = 503
    outcome = "draining"
    retry_after = True


class DeadlineExceeded(RequestError):
    status_code = 504
    outcome = "timeout"


class ClientGone(RequestError):
    """The client disconnected; nobody reads this answer (499, nginx's convention)."""

    status_code = 499
    outcome = "cancelled"


class BatchFailed(RequestError):
    status_code = 500
    outcome = "error"
