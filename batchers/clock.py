"""The batchers' time: a clock they are given, so tests can run them on time they move.

Every time a batcher reads (a request's arrival and deadline, when a batch is taken and
computed, the queue's drain) and every timer it arms (a policy's ``Wait``, a request's
deadline) goes through one ``Clock``. Production uses ``REAL_CLOCK``: ``time.monotonic``
and the event loop's timers, exactly what the batchers called before there was a clock.
A test passes a clock that moves only when it says (``tests/fake_clock.py``), so a claim
such as "a dynamic batch goes when the oldest request has waited ``max_queue_delay``" is
checked at that instant, with no sleep and no wall-clock margin.

The hot path reads ``now`` through a bound reference taken once (``self._now =
clock.now``); on the real clock that reference is ``time.monotonic`` itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic
from typing import Any, Protocol


class Timer(Protocol):
    """A callback armed by ``Clock.call_later``; ``cancel`` keeps it from running."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Seconds on one monotonic scale, and timers on that scale."""

    def now(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Run ``callback(*args)`` on the event loop ``delay`` seconds from now."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and the running event loop's timers (whose own
    clock is ``time.monotonic`` too)."""

    now = staticmethod(monotonic)  # the builtin itself: reading it costs what monotonic() did

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback, *args)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


REAL_CLOCK: Clock = MonotonicClock()
