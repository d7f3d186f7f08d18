"""A clock that moves only when the test moves it, for batchers (``batchers.clock``).

Give it to a batcher (``clock=``) and to the work items it takes (``arrival=clock.now()``),
and a timing claim becomes an exact statement: nothing has gone at ``+0.299 s``, the batch
went at ``+0.3 s``, its requests queued ``0.3 s``. No test sleeps, and no assertion
depends on how busy the machine is.

``advance`` fires each timer due on the way at its own time, in order, and lets the
event loop run what the timer woke before time moves on, as a real loop would: a batcher
that re-arms its wait when woken has the new timer fired too if it falls due within the
step. Work on other threads (an engine computing a batch) is not waited for: await its
answer, or an event the engine sets.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

# Timers this close past the target fire too: sums such as 0.299 + 0.001 land a rounding
# error short of a timer armed at +0.3.
_EPSILON = 1e-9
# Event-loop turns ``settle`` gives: far more than any chain of wake-ups in a batcher
# (submit -> the loop's waiter -> a decision -> the executor) takes.
_TURNS = 50


class FakeTimer:
    """One armed callback; ``cancel`` keeps it from running."""

    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """``batchers.clock.Clock`` on time the test moves by hand (``advance``)."""

    def __init__(self, start: float = 100.0) -> None:
        # not 0: code may read a time of 0.0 as "unset" (``dispatched_at or ...``)
        self._now = start
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._order = itertools.count()  # equal times fire in the order they were armed

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> FakeTimer:
        timer = FakeTimer(self._now + max(delay, 0.0), callback, args)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, _resolve, future)
        try:
            await future
        finally:
            timer.cancel()

    @property
    def pending(self) -> list[float]:
        """Seconds from now to each armed timer, soonest first."""
        return sorted(when - self._now for when, _, timer in self._timers if not timer.cancelled)

    async def advance(self, seconds: float) -> None:
        """Move time ``seconds`` forward, firing every timer due by then at its own time."""
        target = self._now + seconds
        await settle()
        while self._timers and self._timers[0][0] <= target + _EPSILON:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.callback(*timer.args)
            await settle()
        self._now = max(self._now, target)
        await settle()


async def settle() -> None:
    """Let the event loop run what is ready now, and what that makes ready, in turn."""
    for _ in range(_TURNS):
        await asyncio.sleep(0)


async def until(predicate: Callable[[], bool]) -> None:
    """Give the event loop turns until ``predicate()`` holds (tasks that only need the loop
    to run: a submit reaching the queue); fail if it never does."""
    for _ in range(_TURNS):
        if predicate():
            return
        await asyncio.sleep(0)
    assert predicate(), "not reached in the event loop's turns"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
