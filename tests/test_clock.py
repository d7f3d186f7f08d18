"""The batchers' clock: the real one is ``time.monotonic`` and the loop's timers; the fake
one (tests/fake_clock.py) fires timers in order at their own times, and only when moved."""

from __future__ import annotations

import asyncio
import time

import pytest
from wattserve.batchers.clock import REAL_CLOCK

from tests.fake_clock import FakeClock


def test_the_real_clock_reads_monotonic_itself():
    assert REAL_CLOCK.now is time.monotonic  # no wrapper on the hot path


async def test_the_real_clock_arms_the_loops_timers():
    fired = asyncio.Event()
    timer = REAL_CLOCK.call_later(0.0, fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    timer.cancel()  # a fired timer cancels quietly
    await REAL_CLOCK.sleep(0)


async def test_fake_time_moves_only_when_advanced_and_fires_in_order():
    clock = FakeClock()
    t0 = clock.now()
    fired: list[tuple[str, float]] = []
    clock.call_later(0.3, lambda: fired.append(("b", clock.now() - t0)))
    clock.call_later(0.1, lambda: fired.append(("a", clock.now() - t0)))
    cancelled = clock.call_later(0.2, lambda: fired.append(("never", 0.0)))
    cancelled.cancel()
    assert clock.pending == pytest.approx([0.1, 0.3])
    await asyncio.sleep(0)
    assert clock.now() == t0 and fired == []
    await clock.advance(0.25)
    assert [name for name, _ in fired] == ["a"] and fired[0][1] == pytest.approx(0.1)
    assert clock.now() == t0 + 0.25
    await clock.advance(0.05)  # 0.25 + 0.05 lands within rounding of 0.3: fires
    assert [name for name, _ in fired] == ["a", "b"] and fired[1][1] == pytest.approx(0.3)


async def test_a_fake_sleep_wakes_at_its_time_and_what_it_arms_fires_in_the_same_step():
    clock = FakeClock()
    t0 = clock.now()
    woke: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(0.1)
        woke.append(clock.now() - t0)
        await clock.sleep(0.1)  # armed by the woken task, due inside the same advance
        woke.append(clock.now() - t0)

    task = asyncio.create_task(sleeper())
    await clock.advance(0.05)
    assert woke == []
    await clock.advance(0.5)
    await task
    assert woke == pytest.approx([0.1, 0.2])
    assert clock.now() == t0 + 0.55
