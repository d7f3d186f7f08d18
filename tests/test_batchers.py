"""Each batching policy's semantics, one by one, with an engine whose compute time the
test controls (no HTTP; the server tests cover the wire)."""

from __future__ import annotations

import asyncio
from time import monotonic

import numpy as np
import pytest
from wattserve.batchers import (
    BatcherConfig,
    ContinuousBatcher,
    DeadlineExceeded,
    Draining,
    DynamicBatcher,
    DynamicConfig,
    QueueFull,
    StaticBatcher,
    WorkItem,
)
from wattserve.batchers.base import padded_size
from wattserve.batchers.status import Status
from wattserve.batchers.types import BatchFailed

from tests.gated_engine import GatedEngine, item_input


async def started(batcher):
    task = asyncio.create_task(batcher.run())
    await asyncio.sleep(0)
    return task


async def submit(batcher, value: float, **kw):
    return await batcher.submit(WorkItem(item_input(value), **kw))


async def wait_until(predicate, timeout: float = 5.0) -> None:
    end = monotonic() + timeout
    while not predicate():
        if monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def check_result(result, value: float, rows: int = 1) -> None:
    """The request's own rows, batch axis kept: [[2v, -2v]] * rows."""
    np.testing.assert_array_equal(result.outputs["y"], [[2 * value, -2 * value]] * rows)


# ---------------------------------------------------------------- dynamic
async def test_dynamic_dispatches_preferred_size_at_once():
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=30.0,
                                               preferred_batch_sizes=(4,)))  # fmt: skip
    task = await started(b)
    t0 = monotonic()
    results = await asyncio.wait_for(asyncio.gather(*(submit(b, i) for i in range(4))), 10)
    assert monotonic() - t0 < 10  # far below the 30 s delay: it went at once
    assert engine.batches == [[0, 1, 2, 3]]
    assert [r.batch_size for r in results] == [4] * 4
    await b.drain()
    await task


async def test_dynamic_batches_whole_requests_by_their_rows():
    """Triton's rule with whole requests (preferred [2, 6], a long delay): a 7-row request
    goes at once as one batch of 7; a 3-row one cannot make a preferred size alone and goes
    whole when the delay has passed; two requests that add up to 6 go at once together."""
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.3,
                                               preferred_batch_sizes=(2, 6)))  # fmt: skip
    task = await started(b)
    t0 = monotonic()
    seven = await b.submit(WorkItem(item_input(7.0, rows=7), rows=7))
    assert monotonic() - t0 < 0.3 and seven.batch_size == 7
    check_result(seven, 7.0, rows=7)
    t0 = monotonic()
    three = await b.submit(WorkItem(item_input(3.0, rows=3), rows=3))
    assert monotonic() - t0 >= 0.29 and three.batch_size == 3  # held for the delay, then whole
    check_result(three, 3.0, rows=3)
    engine.gate.clear()
    engine.started.clear()
    blocker = asyncio.create_task(submit(b, 100))
    await asyncio.to_thread(engine.started.wait, 5)
    pair = [
        asyncio.create_task(b.submit(WorkItem(item_input(v, rows=r), rows=r)))
        for v, r in ((4.0, 4), (2.0, 2))
    ]
    await wait_until(lambda: b.queue.rows == 6)
    t0 = monotonic()
    engine.gate.set()
    results = await asyncio.gather(*pair)
    assert monotonic() - t0 < 0.3 and [r.batch_size for r in results] == [6, 6]
    check_result(results[0], 4.0, rows=4)
    check_result(results[1], 2.0, rows=2)
    await blocker
    await b.drain()
    await task


async def test_dynamic_sends_a_batch_that_the_next_request_would_overflow():
    """Triton's qa/L0_batcher test_multi_batch_sum_gt_max_preferred: preferred [2, 6]; a 3-row
    request waits; a 4-row one arrives (3 + 4 > 6): the 3 goes at once, alone, and the 4
    then waits out its own delay, counted from its own arrival."""
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.6,
                                               preferred_batch_sizes=(2, 6)))  # fmt: skip
    task = await started(b)
    start = monotonic()
    three = asyncio.create_task(b.submit(WorkItem(item_input(3.0, rows=3), rows=3)))
    await asyncio.sleep(0.2)
    four = asyncio.create_task(b.submit(WorkItem(item_input(4.0, rows=4), rows=4)))
    first = await three
    assert monotonic() - start < 0.5 and first.batch_size == 3  # sent when the 4 arrived
    second = await four
    assert monotonic() - start >= 0.2 + 0.59 and second.batch_size == 4  # its own full delay
    check_result(second, 4.0, rows=4)
    await b.drain()
    await task


async def test_requests_of_different_shapes_never_share_a_batch():
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=8))
    task = await started(b)
    blocker = asyncio.create_task(submit(b, 100))
    await asyncio.to_thread(engine.started.wait, 5)
    keys = [(1,), (1,), (2,), (1,)]  # what the runtime sets for a variable-shape model
    pending = [
        asyncio.create_task(b.submit(WorkItem(item_input(float(i)), shape_key=k))) for i, k in enumerate(keys)
    ]
    await wait_until(lambda: len(b.queue) == 4)
    assert b.queue.head(8).closed and b.queue.head(8).rows == 2  # the run stops at the other shape
    engine.gate.set()
    results = await asyncio.gather(*pending)
    for i, r in enumerate(results):
        check_result(r, float(i))
    assert engine.batches[1:] == [[0, 1], [2], [3]]  # FIFO kept, shapes apart
    await blocker
    await b.drain()
    await task


async def test_dynamic_largest_preferred_that_fits_goes_first():
    engine = GatedEngine()
    engine.gate.clear()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.05,
                                               preferred_batch_sizes=(2, 4)))  # fmt: skip
    task = await started(b)
    blocker = asyncio.create_task(submit(b, 100))  # occupies the only instance
    await asyncio.to_thread(engine.started.wait, 5)
    pending = [asyncio.create_task(submit(b, i)) for i in range(5)]
    await wait_until(lambda: len(b.queue) == 5)
    engine.gate.set()
    await asyncio.gather(blocker, *pending)
    # 5 queued, preferred sizes 2 and 4: the largest preferred size that fits (4) goes at
    # once, the last one waits for the delay and goes alone.
    assert engine.batches[1:] == [[0, 1, 2, 3], [4]]
    await b.drain()
    await task


async def test_dynamic_dispatches_after_max_queue_delay_otherwise():
    engine = GatedEngine()
    delay = 0.2
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=delay))
    task = await started(b)
    results = await asyncio.gather(submit(b, 1), submit(b, 2))
    assert engine.batches == [[1, 2]]
    for r in results:
        assert r.queue_time_s >= delay * 0.95
        assert r.batch_size == 2
    await b.drain()
    await task


async def test_dynamic_sleeps_through_arrivals_that_cannot_dispatch_a_batch():
    """Waiting out the delay, an arrival wakes the policy only at a size that goes at once."""
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.3,
                                               preferred_batch_sizes=(6,)))  # fmt: skip
    waits = []
    real_wait = b.wait_for_change

    async def counted(timeout=None, wake_at_depth=None):
        waits.append((len(b.queue), wake_at_depth))
        await real_wait(timeout, wake_at_depth)

    b.wait_for_change = counted
    task = await started(b)
    pending = []
    for i in range(5):  # five arrivals, 10 ms apart: below the preferred 6
        pending.append(asyncio.create_task(submit(b, i)))
        await asyncio.sleep(0.01)
    results = await asyncio.wait_for(asyncio.gather(*pending), 10)
    assert engine.batches == [[0, 1, 2, 3, 4]]
    assert all(r.queue_time_s >= 0.3 * 0.95 for r in results[:1]), "the oldest waited the delay"
    waited_with_work = [w for w in waits if w[0] > 0]
    assert waited_with_work == [(1, 6)], "woken by the first arrival, then only by the delay"
    await b.drain()
    await task


async def test_dynamic_max_batch_size_goes_at_once_and_splits():
    engine = GatedEngine(max_batch_size=3)
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=3, max_queue_delay_s=30.0))
    task = await started(b)
    first = [asyncio.create_task(submit(b, i)) for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*first), 10)
    assert engine.batches == [[0, 1, 2]]
    await b.drain()
    await task


async def test_dynamic_allowed_sizes_only():
    engine = GatedEngine(batch_sizes=[1, 2, 4])
    engine.gate.clear()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.01,
                                               allowed_sizes=(1, 2, 4)))  # fmt: skip
    task = await started(b)
    blocker = asyncio.create_task(submit(b, 100))
    await asyncio.to_thread(engine.started.wait, 5)
    pending = [asyncio.create_task(submit(b, i)) for i in range(7)]
    await wait_until(lambda: len(b.queue) == 7)
    engine.gate.set()
    await asyncio.gather(blocker, *pending)
    assert [len(x) for x in engine.batches[1:]] == [4, 2, 1]
    await b.drain()
    await task


def test_padded_size():
    assert padded_size(3, None) == 3
    assert padded_size(3, [1, 2, 4, 8]) == 4
    assert padded_size(8, [1, 2, 4, 8]) == 8


# ---------------------------------------------------------------- priorities and bounds
async def test_priorities_higher_level_first_fifo_within():
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=2, priority_levels=2))
    task = await started(b)
    blocker = asyncio.create_task(submit(b, 100, priority=2))
    await asyncio.to_thread(engine.started.wait, 5)
    low = [asyncio.create_task(submit(b, v, priority=2)) for v in (10, 11)]
    await wait_until(lambda: len(b.queue) == 2)
    high = [asyncio.create_task(submit(b, v, priority=1)) for v in (1, 2)]
    await wait_until(lambda: len(b.queue) == 4)
    engine.gate.set()
    await asyncio.gather(blocker, *low, *high)
    assert engine.batches == [[100], [1, 2], [10, 11]]
    await b.drain()
    await task


async def test_queue_full_rejects_immediately():
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=1, max_queue_size=2))
    task = await started(b)
    running = asyncio.create_task(submit(b, 0))
    await asyncio.to_thread(engine.started.wait, 5)
    queued = [asyncio.create_task(submit(b, v)) for v in (1, 2)]
    await wait_until(lambda: len(b.queue) == 2)
    with pytest.raises(QueueFull):
        await submit(b, 3)
    engine.gate.set()
    for value, t in zip((0, 1, 2), [running, *queued], strict=True):
        check_result(await t, value)
    assert 3 not in engine.seen
    await b.drain()
    await task


# ---------------------------------------------------------------- deadlines and cancellation
async def test_timeout_while_queued_is_never_computed_even_during_a_batch():
    engine = GatedEngine()
    engine.gate.clear()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=4, max_queue_delay_s=0.0))
    task = await started(b)
    running = asyncio.create_task(submit(b, 0))
    await asyncio.to_thread(engine.started.wait, 5)
    t0 = monotonic()
    with pytest.raises(DeadlineExceeded, match=r"^Request timeout expired$") as expired:
        await submit(b, 7, deadline=monotonic() + 0.1)
    assert "not computed" in expired.value.detail
    assert monotonic() - t0 < 5  # answered at its deadline, not when the batch finished
    engine.gate.set()
    check_result(await running, 0)
    await asyncio.sleep(0.05)
    assert 7 not in engine.seen
    assert len(b.queue) == 0
    await b.drain()
    await task


async def test_timeout_during_compute_discards_unless_the_action_is_delay():
    """REJECT (the default): answered UNAVAILABLE at its deadline, the result discarded.
    DELAY acts only while queued: once running, the request is answered as usual."""
    engine = GatedEngine(delay_s=0.3)
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=4))
    task = await started(b)
    with pytest.raises(DeadlineExceeded, match=r"^Request timeout expired$") as expired:
        await submit(b, 5, deadline=monotonic() + 0.1)
    assert expired.value.status is Status.UNAVAILABLE  # Triton's code, not a 504
    assert "during compute" in expired.value.detail
    check_result(await submit(b, 6, deadline=monotonic() + 0.1, delay_on_timeout=True), 6)
    await b.drain()
    await task


async def test_delay_on_timeout_runs_after_the_on_time_requests_of_its_level():
    """Triton's ``timeout_action: DELAY``: the expired request is not answered with an
    error; it runs after every request of its level that has not timed out, and before
    the next level's."""
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=1, priority_levels=2))
    task = await started(b)
    blocker = asyncio.create_task(submit(b, 100))
    await asyncio.to_thread(engine.started.wait, 5)
    late = asyncio.create_task(submit(b, 1, deadline=monotonic() + 0.05, delay_on_timeout=True))
    await wait_until(lambda: len(b.queue) == 1)
    on_time = [asyncio.create_task(submit(b, v)) for v in (2, 3)]
    low = asyncio.create_task(submit(b, 4, priority=2))
    await wait_until(lambda: b.queue.delayed == 1)  # its deadline passed: moved, not answered
    assert not late.done() and len(b.queue) == 4
    engine.gate.set()
    for value, t in zip((100, 1, 2, 3, 4), [blocker, late, *on_time, low], strict=True):
        check_result(await t, value)  # every one answered with its own rows
    assert engine.batches == [[100], [2], [3], [1], [4]]
    assert b.queue.delayed == 0
    await b.drain()
    await task


async def test_past_deadline_is_rejected_before_queueing():
    engine = GatedEngine()
    b = ContinuousBatcher([engine], BatcherConfig())
    task = await started(b)
    with pytest.raises(DeadlineExceeded):
        await submit(b, 1, deadline=monotonic() - 1)
    assert engine.batches == []
    await b.drain()
    await task


async def test_cancelled_request_is_never_computed():
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=4))
    task = await started(b)
    running = asyncio.create_task(submit(b, 0))
    await asyncio.to_thread(engine.started.wait, 5)
    gone = asyncio.create_task(submit(b, 9))
    await wait_until(lambda: len(b.queue) == 1)
    gone.cancel()
    await asyncio.sleep(0.01)
    assert len(b.queue) == 0
    engine.gate.set()
    await running
    await b.drain()
    await task
    assert 9 not in engine.seen


# ---------------------------------------------------------------- static
async def test_static_waits_for_n():
    engine = GatedEngine()
    b = StaticBatcher([engine], BatcherConfig(max_batch_size=3))
    task = await started(b)
    first = [asyncio.create_task(submit(b, v)) for v in (1, 2)]
    await asyncio.sleep(0.3)
    assert engine.batches == []  # two of three: still waiting
    third = asyncio.create_task(submit(b, 3))
    results = await asyncio.gather(*first, third)
    assert engine.batches == [[1, 2, 3]]
    assert [r.batch_size for r in results] == [3, 3, 3]
    await b.drain()
    await task


async def test_static_lone_request_deadline_still_applies():
    engine = GatedEngine()
    b = StaticBatcher([engine], BatcherConfig(max_batch_size=4))
    task = await started(b)
    with pytest.raises(DeadlineExceeded):
        await submit(b, 1, deadline=monotonic() + 0.1)
    assert engine.batches == []
    await b.drain()
    await task


async def test_static_flushes_partial_batch_on_drain_and_refuses_new_work():
    engine = GatedEngine()
    b = StaticBatcher([engine], BatcherConfig(max_batch_size=4))
    task = await started(b)
    waiting = [asyncio.create_task(submit(b, v)) for v in (1, 2)]
    await wait_until(lambda: len(b.queue) == 2)
    drain = asyncio.create_task(b.drain())
    await asyncio.sleep(0)
    with pytest.raises(Draining):
        await submit(b, 3)
    for value, t in zip((1, 2), waiting, strict=True):
        check_result(await t, value)
    await drain
    await task
    assert engine.batches == [[1, 2]]


# ---------------------------------------------------------------- continuous, instances
async def test_continuous_takes_whatever_queued_when_instance_frees():
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=8))
    task = await started(b)
    first = asyncio.create_task(submit(b, 0))
    await asyncio.to_thread(engine.started.wait, 5)
    rest = [asyncio.create_task(submit(b, v)) for v in range(1, 6)]
    await wait_until(lambda: len(b.queue) == 5)
    engine.gate.set()
    await asyncio.gather(first, *rest)
    assert engine.batches == [[0], [1, 2, 3, 4, 5]]
    await b.drain()
    await task


async def test_two_instances_compute_two_batches_at_once():
    engines = [GatedEngine(), GatedEngine()]
    for e in engines:
        e.gate.clear()
    b = ContinuousBatcher(engines, BatcherConfig(max_batch_size=1))
    task = await started(b)
    pending = [asyncio.create_task(submit(b, v)) for v in (1, 2)]
    await asyncio.to_thread(engines[0].started.wait, 5)
    await asyncio.to_thread(engines[1].started.wait, 5)  # both busy at the same time
    for e in engines:
        e.gate.set()
    await asyncio.gather(*pending)
    assert sorted(engines[0].seen + engines[1].seen) == [1, 2]
    await b.drain()
    await task


# ---------------------------------------------------------------- failures
async def test_poisoned_request_fails_alone_and_batcher_keeps_serving():
    engine = GatedEngine(poison=13.0)
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=8))
    task = await started(b)
    first = asyncio.create_task(submit(b, 0))
    await asyncio.to_thread(engine.started.wait, 5)
    batch = [asyncio.create_task(submit(b, v)) for v in (11, 12, 13, 14)]
    await wait_until(lambda: len(b.queue) == 4)
    engine.gate.set()
    await first
    outcomes = await asyncio.gather(*batch, return_exceptions=True)
    assert isinstance(outcomes[2], BatchFailed)
    for value, out in zip((11, 12, 14), (outcomes[0], outcomes[1], outcomes[3]), strict=True):
        check_result(out, value)
    check_result(await submit(b, 20), 20)  # still serving
    await b.drain()
    await task


async def test_many_concurrent_items_each_get_their_own_answer():
    engine = GatedEngine(delay_s=0.002)
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=16, max_queue_delay_s=0.002,
                                               max_queue_size=1000))  # fmt: skip
    task = await started(b)
    values = [float(v) for v in range(300)]
    results = await asyncio.gather(*(submit(b, v) for v in values))
    for value, result in zip(values, results, strict=True):
        check_result(result, value)
    assert max(len(x) for x in engine.batches) > 1
    await b.drain()
    await task
