"""A request-level batching policy's one door: ``decide(view, now) -> Dispatch | Wait``.

The scheduler (``batchers.scheduler``) asks the policy whenever an engine instance is free
and requests are queued, wherever that happens: on the event loop, or on an engine thread
that has just finished a batch and would chain the next one (``batchers.executor``). The
answer is one of two values, as vLLM's scheduler or Ray Serve's batching queue have it:

- ``Dispatch(rows, complete)``: take the run of whole requests at the head now, up to
  ``rows`` rows; ``complete`` says whether the batch would not grow by waiting (full, a
  preferred size, the next request cannot join) or goes because waiting is over (a delay
  ran out, a drain, a trade-off). An engine thread chains only complete batches; the
  others it leaves to the loop, which takes them after the requests it has received but
  not yet queued (bodies being parsed) have joined, as they did before there was one door;
- ``Wait(timeout, wake_at_depth)``: ask again after ``timeout`` seconds (None: only when
  the queue changes), sleeping through arrivals until ``wake_at_depth`` rows are queued.

A decision only reads: the queue (``view.queue``, under its lock while deciding), whether
a drain has begun (``view.closing``; a policy then never waits), ``now`` and the policy's
own configuration and learned state. One policy does not keep this yet: the adaptive
batcher's ``decide`` records its decision and pending wait, and moves late requests to the
queue's late lane (``PriorityFifo.delay_oldest``); making it pure (its bookkeeping in a step
the scheduler calls under the queue's lock) is open work. It may raise: the scheduler then
fails the request at the head of the queue, which the decision was about, and asks again
(``Scheduler.next_batch``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from wattserve.batchers.queue import PriorityFifo


class Dispatch(NamedTuple):
    """Take the run of whole requests at the head, up to ``rows`` rows (the head request
    whatever its rows). ``complete``: waiting would not make this batch bigger (see the
    module docstring for why an engine thread chains only those)."""

    rows: int
    complete: bool = True


class Wait(NamedTuple):
    """Decide again after ``timeout`` seconds (None: at the next change of the queue);
    arrivals wake the policy only once the queue holds ``wake_at_depth`` rows (None: any)."""

    timeout: float | None = None
    wake_at_depth: int | None = None


Decision = Dispatch | Wait


class QueueView(Protocol):
    """What a decision reads: the queue (read only) and whether a drain has begun."""

    @property
    def queue(self) -> PriorityFifo: ...

    @property
    def closing(self) -> bool: ...


class Policy(Protocol):
    """A request-level batching policy: one decision, asked with a non-empty queue."""

    def decide(self, view: QueueView, now: float) -> Decision: ...
