"""What flows through a batcher: work items in, results (or one explicit error) out."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from time import monotonic

import numpy as np


class ItemState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
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


@dataclass(slots=True)
class Result:
    """One request's outputs and how it was served (made visible in response headers)."""

    outputs: dict[str, np.ndarray]
    queue_time_s: float
    compute_time_s: float
    batch_size: int
    energy_j: float | None = None  # this request's share of its batch's measured energy


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
