"""Waiting for what another thread or process brings about (a server's queue depth, an
engine's state), with a deadline so a broken run fails instead of hanging. For what only
the event loop does, ``tests/fake_clock.until`` needs no polling."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import monotonic


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` every 5 ms until it holds; fail after ``timeout`` seconds."""
    end = monotonic() + timeout
    while not predicate():
        if monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)
