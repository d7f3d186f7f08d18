"""A request-level batching policy's one door: ``decide(view, now) -> Dispatch | Wait | Delay``.

The scheduler (``batchers.scheduler``) asks the policy whenever an engine instance is free
and requests are queued, wherever that happens: on the event loop, or on an engine thread
that has just finished a batch and would chain the next one (``batchers.executor``). The
answer is one of three plain values, as vLLM's scheduler or Ray Serve's batching queue have it:

- ``Dispatch(rows, complete)``: take the run of whole requests at the head now, up to
  ``rows`` rows; ``complete`` says whether the batch would not grow by waiting (full, a
  preferred size, the next request cannot join) or goes because waiting is over (a delay
  ran out, a drain, a trade-off). An engine thread chains only complete batches; the
  others it leaves to the loop, which takes them after the requests it has received but
  not yet queued (bodies being parsed) have joined, as they did before there was one door;
- ``Wait(timeout, wake_at_depth)``: ask again after ``timeout`` seconds (None: only when
  the queue changes), sleeping through arrivals until ``wake_at_depth`` rows are queued;
- ``Delay(counts, then)``: first move the oldest ``counts[level]`` on-time requests of each
  priority level behind the rest of their level (the queue's late lanes), then act on
  ``then``: a queue move is part of the answer, applied by the scheduler, not done by the
  policy (the adaptive batcher's late-last rule).

A decision only reads: the queue (``view.queue``), whether a drain has begun
(``view.closing``; a policy then never waits), ``now`` and the policy's own configuration
and learned state, as last published. It writes nothing: asked twice with the same view and
time it gives the same answer. Whatever a policy keeps about its own decisions (when a
planned wait ends, the last decision for a metric) it records in ``observe(decision, now)``,
which the scheduler calls right after applying the decision, in the same hold of the
queue's lock (``scheduler.decide_once``). A decision's ``note`` is the policy's own record
of why, for ``observe``; it does not take part in comparisons (two decisions that act alike
are equal). A decision may raise: the scheduler then fails the request at the head of the
queue, which the decision was about, and asks again (``Scheduler.next_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from wattserve.batchers.queue import PriorityFifo


@dataclass(slots=True)
class Dispatch:
    """Take the run of whole requests at the head, up to ``rows`` rows (the head request
    whatever its rows). ``complete``: waiting would not make this batch bigger (see the
    module docstring for why an engine thread chains only those)."""

    rows: int
    complete: bool = True
    note: Any = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Wait:
    """Decide again after ``timeout`` seconds (None: at the next change of the queue);
    arrivals wake the policy only once the queue holds ``wake_at_depth`` rows (None: any)."""

    timeout: float | None = None
    wake_at_depth: int | None = None
    note: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Delay:
    """Move the oldest ``counts[level]`` on-time requests of each priority level (index 0
    is level 1) behind the rest of their level, then ``then``."""

    counts: tuple[int, ...]
    then: Dispatch | Wait


Decision = Dispatch | Wait | Delay
# Dispatch and Wait are plain values that nothing changes once made; they are not frozen
# only because a frozen dataclass costs twice as much to make, once per decision.


class QueueView(Protocol):
    """What a decision reads: the queue (read only) and whether a drain has begun."""

    @property
    def queue(self) -> PriorityFifo: ...

    @property
    def closing(self) -> bool: ...


class Policy(Protocol):
    """A request-level batching policy: one decision, asked with a non-empty queue, and
    what it records of the decision once applied."""

    def decide(self, view: QueueView, now: float) -> Decision: ...

    def observe(self, decision: Decision, now: float) -> None: ...
