"""Invariant 1 under races: every accepted item is answered exactly once, whatever mix of
client cancels and deadlines hits it between queueing, batch formation, batch start and
scatter. Randomized, seeded, thousands of items per policy; nothing here measures time."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from wattserve.batchers import (
    BatcherConfig,
    ContinuousBatcher,
    DynamicBatcher,
    DynamicConfig,
    RequestError,
    StaticBatcher,
    WorkItem,
)
from wattserve.batchers.types import ItemState

from tests.fake_clock import until
from tests.gated_engine import GatedEngine, item_input


def make_batcher(kind: str, engines):
    if kind == "static":
        return StaticBatcher(engines, BatcherConfig(max_batch_size=4, max_queue_size=10_000))
    if kind == "continuous":
        return ContinuousBatcher(engines, BatcherConfig(max_batch_size=8, max_queue_size=10_000))
    return DynamicBatcher(engines, DynamicConfig(max_batch_size=8, max_queue_size=10_000,
                                                 max_queue_delay_s=0.001))  # fmt: skip


@pytest.mark.parametrize("kind", ["dynamic", "continuous", "static"])
@pytest.mark.parametrize("seed", [1, 2])
async def test_cancels_and_deadlines_racing_dispatch_answer_every_item_once(kind, seed):
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    loop_errors: list[dict] = []
    loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
    engines = [GatedEngine(max_batch_size=8, delay_s=0.0005) for _ in range(2)]
    batcher = make_batcher(kind, engines)
    runner = asyncio.create_task(batcher.run())
    await asyncio.sleep(0)

    n = 2000
    items: list[WorkItem] = []
    answers: list[tuple[str, float | None]] = [("pending", None)] * n
    resolutions = [0] * n

    async def one(i: int) -> None:
        value = float(i)
        deadline = None
        if rng.random() < 0.4:  # deadlines that land around batch formation and start
            deadline = loop.time() + rng.uniform(0.0, 0.004)
        item = WorkItem(item_input(value), deadline=deadline)
        items.append(item)
        try:
            result = await batcher.submit(item)
        except RequestError as exc:
            answers[i] = (type(exc).__name__, None)
        except asyncio.CancelledError:
            answers[i] = ("cancelled", None)
            raise
        else:
            answers[i] = ("ok", float(result.outputs["y"][0, 0]))  # its one row, first value
        finally:
            resolutions[i] += 1

    tasks: list[asyncio.Task[None]] = []
    for i in range(n):
        tasks.append(asyncio.create_task(one(i)))
        if rng.random() < 0.3:  # a client that leaves soon after sending
            victim = tasks[rng.randrange(len(tasks))]
            loop.call_later(rng.uniform(0.0, 0.003), victim.cancel)
        if i % 16 == 0:
            await asyncio.sleep(rng.uniform(0.0, 0.002))

    drained = asyncio.create_task(batcher.drain(10))  # static flushes its last partial batch
    _done, pending = await asyncio.wait(tasks, timeout=15)
    stuck = [i for i, t in enumerate(tasks) if t in pending]
    assert not stuck, f"{len(stuck)} accepted items never answered (first: {stuck[:5]})"
    assert not loop_errors, f"errors inside the batcher: {[c.get('message') for c in loop_errors[:3]]}"
    assert all(r == 1 for r in resolutions)
    for i, (kind_, value) in enumerate(answers):
        if kind_ == "ok":  # invariant 2: its own input, doubled
            assert value == 2.0 * i
    assert all(item.state is ItemState.DONE for item in items if item.future is not None)
    assert sum(1 for a in answers if a[0] == "ok") > 0
    await drained
    await runner


async def test_item_cancelled_between_batch_formation_and_start_does_not_strand_its_batch():
    """The exact race of the reliability finding: a batch is formed, one item's client
    leaves before the batch task starts; every other item of that batch is still answered."""
    engine = GatedEngine(max_batch_size=4)
    batcher = ContinuousBatcher([engine], BatcherConfig(max_batch_size=4))
    engine.gate.clear()
    runner = asyncio.create_task(batcher.run())
    await asyncio.sleep(0)
    blocker = asyncio.create_task(batcher.submit(WorkItem(item_input(100.0))))
    await asyncio.to_thread(engine.started.wait, 5)
    items = [WorkItem(item_input(float(i))) for i in range(4)]
    subs = [asyncio.create_task(batcher.submit(it)) for it in items]
    await until(lambda: len(batcher.queue) == 4)
    first = items[0]
    original_take = batcher.take
    loop = asyncio.get_running_loop()

    def take_then_cancel(n: int) -> list[WorkItem]:  # on the loop, or on the engine thread
        taken = original_take(n)
        if first in taken:  # the client leaves right after its batch was formed
            loop.call_soon_threadsafe(batcher.cancel, first)
        return taken

    batcher.take = take_then_cancel  # type: ignore[method-assign]
    engine.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*subs, return_exceptions=True), 10)
    assert isinstance(results[0], RequestError)
    for i, r in enumerate(results[1:], start=1):
        assert not isinstance(r, BaseException), r
        np.testing.assert_array_equal(r.outputs["y"], [[2.0 * i, -2.0 * i]])
    await blocker
    await batcher.drain(5)
    await runner
