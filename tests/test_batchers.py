"""Each batching policy's semantics, one by one, with an engine whose compute the test
controls (no HTTP; the server tests cover the wire). Timing claims run on a fake clock
(``tests/fake_clock.py``): the test moves time and checks the instant a batch goes."""

from __future__ import annotations

import asyncio

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

from tests.fake_clock import FakeClock, settle, until
from tests.gated_engine import GatedEngine, item_input


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def started(batcher):
    task = asyncio.create_task(batcher.run())
    await asyncio.sleep(0)
    return task


def work(batcher, value: float, rows: int = 1, **kw) -> WorkItem:
    """One request of ``rows`` rows arriving now on the batcher's clock."""
    return WorkItem(item_input(value, rows=rows), rows=rows, arrival=batcher.clock.now(), **kw)


async def submit(batcher, value: float, **kw):
    return await batcher.submit(work(batcher, value, **kw))


def later(batcher, value: float, **kw) -> asyncio.Task:
    """``submit`` as a task, for a request the test answers by moving time."""
    return asyncio.create_task(submit(batcher, value, **kw))


async def engine_started(engine: GatedEngine) -> None:
    """Until the engine's thread is computing a batch (it holds at its gate)."""
    assert await asyncio.to_thread(engine.started.wait, 10), "the engine never started a batch"


def check_result(result, value: float, rows: int = 1) -> None:
    """The request's own rows, batch axis kept: [[2v, -2v]] * rows."""
    np.testing.assert_array_equal(result.outputs["y"], [[2 * value, -2 * value]] * rows)


# ---------------------------------------------------------------- dynamic
async def test_dynamic_dispatches_preferred_size_at_once(clock):
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=30.0,
                                               preferred_batch_sizes=(4,)), clock=clock)  # fmt: skip
    task = await started(b)
    t0 = clock.now()
    results = await asyncio.wait_for(asyncio.gather(*(submit(b, i) for i in range(4))), 10)
    assert clock.now() == t0  # answered with no time passing: it went at once
    assert engine.batches == [[0, 1, 2, 3]]
    assert [r.batch_size for r in results] == [4] * 4
    assert [r.queue_time_s for r in results] == [0.0] * 4
    await b.drain()
    await task


async def test_dynamic_batches_whole_requests_by_their_rows(clock):
    """Triton's rule with whole requests (preferred [2, 6], a long delay): a 7-row request
    goes at once as one batch of 7; a 3-row one cannot make a preferred size alone and goes
    whole when the delay has passed; two requests that add up to 6 go at once together."""
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.3,
                                               preferred_batch_sizes=(2, 6)), clock=clock)  # fmt: skip
    task = await started(b)
    seven = await asyncio.wait_for(b.submit(work(b, 7.0, rows=7)), 10)
    assert seven.queue_time_s == 0.0 and seven.batch_size == 7  # at once
    check_result(seven, 7.0, rows=7)
    three = asyncio.create_task(b.submit(work(b, 3.0, rows=3)))
    await clock.advance(0.299)
    assert not three.done()  # held for the delay...
    await clock.advance(0.001)
    three_result = await asyncio.wait_for(three, 10)  # ... then sent whole
    assert three_result.queue_time_s == pytest.approx(0.3) and three_result.batch_size == 3
    check_result(three_result, 3.0, rows=3)
    engine.gate.clear()
    engine.started.clear()
    blocker = later(b, 100)
    await clock.advance(0.3)  # a lone one-row request waits out the delay too
    await engine_started(engine)
    pair = [asyncio.create_task(b.submit(work(b, v, rows=r))) for v, r in ((4.0, 4), (2.0, 2))]
    await until(lambda: b.queue.rows == 6)
    t0 = clock.now()
    engine.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*pair), 10)
    assert clock.now() == t0 and [r.batch_size for r in results] == [6, 6]  # together, at once
    check_result(results[0], 4.0, rows=4)
    check_result(results[1], 2.0, rows=2)
    await blocker
    await b.drain()
    await task


async def test_dynamic_sends_a_batch_that_the_next_request_would_overflow(clock):
    """Triton's qa/L0_batcher test_multi_batch_sum_gt_max_preferred: preferred [2, 6]; a 3-row
    request waits; a 4-row one arrives (3 + 4 > 6): the 3 goes at once, alone, and the 4
    then waits out its own delay, counted from its own arrival."""
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.6,
                                               preferred_batch_sizes=(2, 6)), clock=clock)  # fmt: skip
    task = await started(b)
    three = asyncio.create_task(b.submit(work(b, 3.0, rows=3)))
    await clock.advance(0.2)
    assert not three.done()
    four = asyncio.create_task(b.submit(work(b, 4.0, rows=4)))
    first = await asyncio.wait_for(three, 10)
    assert first.queue_time_s == pytest.approx(0.2) and first.batch_size == 3  # sent when the 4 arrived
    await clock.advance(0.599)
    assert not four.done()
    await clock.advance(0.001)
    second = await asyncio.wait_for(four, 10)
    assert second.queue_time_s == pytest.approx(0.6) and second.batch_size == 4  # its own full delay
    check_result(second, 4.0, rows=4)
    await b.drain()
    await task


async def test_requests_of_different_shapes_never_share_a_batch():
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=8))
    task = await started(b)
    blocker = later(b, 100)
    await engine_started(engine)
    keys = [(1,), (1,), (2,), (1,)]  # what the runtime sets for a variable-shape model
    pending = [later(b, float(i), shape_key=k) for i, k in enumerate(keys)]
    await until(lambda: len(b.queue) == 4)
    assert b.queue.head(8).closed and b.queue.head(8).rows == 2  # the run stops at the other shape
    engine.gate.set()
    results = await asyncio.gather(*pending)
    for i, r in enumerate(results):
        check_result(r, float(i))
    assert engine.batches[1:] == [[0, 1], [2], [3]]  # FIFO kept, shapes apart
    await blocker
    await b.drain()
    await task


async def test_dynamic_largest_preferred_that_fits_goes_first(clock):
    engine = GatedEngine()
    engine.gate.clear()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.05,
                                               preferred_batch_sizes=(2, 4)), clock=clock)  # fmt: skip
    task = await started(b)
    blocker = later(b, 100)  # occupies the only instance, once its delay has passed
    await clock.advance(0.05)
    await engine_started(engine)
    pending = [later(b, i) for i in range(5)]
    await until(lambda: len(b.queue) == 5)
    engine.gate.set()
    # 5 queued, preferred sizes 2 and 4: the largest preferred size that fits (4) goes at
    # once, the last one waits for the delay and goes alone.
    first = await asyncio.wait_for(asyncio.gather(blocker, *pending[:4]), 10)
    assert [r.queue_time_s for r in first[1:]] == [0.0] * 4
    await settle()
    assert not pending[4].done()
    await clock.advance(0.05)
    assert (await asyncio.wait_for(pending[4], 10)).queue_time_s == pytest.approx(0.05)
    assert engine.batches[1:] == [[0, 1, 2, 3], [4]]
    await b.drain()
    await task


async def test_dynamic_dispatches_after_max_queue_delay_otherwise(clock):
    engine = GatedEngine()
    delay = 0.2
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=delay), clock=clock)
    task = await started(b)
    pending = [later(b, 1), later(b, 2)]
    await clock.advance(delay - 0.001)
    assert engine.batches == [] and not any(p.done() for p in pending)  # not a moment early
    await clock.advance(0.001)
    results = await asyncio.wait_for(asyncio.gather(*pending), 10)
    assert engine.batches == [[1, 2]]
    for r in results:
        assert r.queue_time_s == pytest.approx(delay)
        assert r.batch_size == 2
    await b.drain()
    await task


async def test_dynamic_sleeps_through_arrivals_that_cannot_dispatch_a_batch(clock):
    """Waiting out the delay, an arrival wakes the policy only at a size that goes at once."""
    engine = GatedEngine()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.3,
                                               preferred_batch_sizes=(6,)), clock=clock)  # fmt: skip
    waits = []
    real_wait = b.wait_for_change

    async def counted(timeout=None, wake_at_depth=None):
        waits.append((len(b.queue), wake_at_depth))
        await real_wait(timeout, wake_at_depth)

    b.wait_for_change = counted
    task = await started(b)
    pending = []
    for i in range(5):  # five arrivals, 10 ms apart: below the preferred 6
        pending.append(later(b, i))
        await clock.advance(0.01)
    assert engine.batches == []
    await clock.advance(0.25)  # the oldest has waited the delay
    results = await asyncio.wait_for(asyncio.gather(*pending), 10)
    assert engine.batches == [[0, 1, 2, 3, 4]]
    assert results[0].queue_time_s == pytest.approx(0.3), "the oldest waited the delay"
    waited_with_work = [w for w in waits if w[0] > 0]
    assert waited_with_work == [(1, 6)], "woken by the first arrival, then only by the delay"
    await b.drain()
    await task


async def test_dynamic_max_batch_size_goes_at_once_and_splits(clock):
    engine = GatedEngine(max_batch_size=3)
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=3, max_queue_delay_s=30.0), clock=clock)
    task = await started(b)
    first = [later(b, i) for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*first), 10)  # no time passes: at once
    assert engine.batches == [[0, 1, 2]]
    await b.drain()
    await task


async def test_dynamic_allowed_sizes_only(clock):
    engine = GatedEngine(batch_sizes=[1, 2, 4])
    engine.gate.clear()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.01,
                                               allowed_sizes=(1, 2, 4)), clock=clock)  # fmt: skip
    task = await started(b)
    blocker = later(b, 100)
    await clock.advance(0.01)
    await engine_started(engine)
    pending = [later(b, i) for i in range(7)]
    await until(lambda: len(b.queue) == 7)
    engine.gate.set()
    await asyncio.wait_for(blocker, 10)
    for _ in range(3):  # each batch goes at once (4 fits, then 2, then 1) or when its delay ends
        await clock.advance(0.01)
    await asyncio.wait_for(asyncio.gather(*pending), 10)
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
    blocker = later(b, 100, priority=2)
    await engine_started(engine)
    low = [later(b, v, priority=2) for v in (10, 11)]
    await until(lambda: len(b.queue) == 2)
    high = [later(b, v, priority=1) for v in (1, 2)]
    await until(lambda: len(b.queue) == 4)
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
    running = later(b, 0)
    await engine_started(engine)
    queued = [later(b, v) for v in (1, 2)]
    await until(lambda: len(b.queue) == 2)
    with pytest.raises(QueueFull):
        await submit(b, 3)
    engine.gate.set()
    for value, t in zip((0, 1, 2), [running, *queued], strict=True):
        check_result(await t, value)
    assert 3 not in engine.seen
    await b.drain()
    await task


# ---------------------------------------------------------------- deadlines and cancellation
async def test_timeout_while_queued_is_never_computed_even_during_a_batch(clock):
    engine = GatedEngine()
    engine.gate.clear()
    b = DynamicBatcher([engine], DynamicConfig(max_batch_size=4, max_queue_delay_s=0.0), clock=clock)
    task = await started(b)
    running = later(b, 0)
    await engine_started(engine)
    doomed = later(b, 7, deadline=clock.now() + 0.1)
    await clock.advance(0.099)
    assert not doomed.done()
    await clock.advance(0.001)
    assert doomed.done()  # answered at its deadline, while the batch still computes
    with pytest.raises(DeadlineExceeded, match=r"^Request timeout expired$") as expired:
        await doomed
    assert "not computed" in expired.value.detail
    assert len(b.queue) == 0
    engine.gate.set()
    check_result(await running, 0)
    await b.drain()
    await task
    assert 7 not in engine.seen


async def test_timeout_during_compute_discards_unless_the_action_is_delay(clock):
    """REJECT (the default): answered UNAVAILABLE at its deadline, the result discarded.
    DELAY acts only while queued: once running, the request is answered as usual."""
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=4), clock=clock)
    task = await started(b)
    rejected = later(b, 5, deadline=clock.now() + 0.1)
    await engine_started(engine)
    await clock.advance(0.1)
    assert rejected.done()  # at its deadline, the batch still computing
    with pytest.raises(DeadlineExceeded, match=r"^Request timeout expired$") as expired:
        await rejected
    assert expired.value.status is Status.UNAVAILABLE  # Triton's code, not a 504
    assert "during compute" in expired.value.detail
    engine.gate.set()
    check_result(await submit(b, 8), 8)  # the discarded batch has finished
    engine.gate.clear()
    engine.started.clear()
    delayed = later(b, 6, deadline=clock.now() + 0.1, delay_on_timeout=True)
    await engine_started(engine)
    await clock.advance(0.1)
    assert not delayed.done()
    engine.gate.set()
    check_result(await asyncio.wait_for(delayed, 10), 6)
    await b.drain()
    await task


async def test_delay_on_timeout_runs_after_the_on_time_requests_of_its_level(clock):
    """Triton's ``timeout_action: DELAY``: the expired request is not answered with an
    error; it runs after every request of its level that has not timed out, and before
    the next level's."""
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=1, priority_levels=2), clock=clock)
    task = await started(b)
    blocker = later(b, 100)
    await engine_started(engine)
    late = later(b, 1, deadline=clock.now() + 0.05, delay_on_timeout=True)
    await until(lambda: len(b.queue) == 1)
    on_time = [later(b, v) for v in (2, 3)]
    low = later(b, 4, priority=2)
    await clock.advance(0.049)
    assert b.queue.delayed == 0
    await clock.advance(0.001)
    assert b.queue.delayed == 1  # its deadline passed: moved, not answered
    assert not late.done() and len(b.queue) == 4
    engine.gate.set()
    for value, t in zip((100, 1, 2, 3, 4), [blocker, late, *on_time, low], strict=True):
        check_result(await t, value)  # every one answered with its own rows
    assert engine.batches == [[100], [2], [3], [1], [4]]
    assert b.queue.delayed == 0
    await b.drain()
    await task


async def test_past_deadline_is_rejected_before_queueing(clock):
    engine = GatedEngine()
    b = ContinuousBatcher([engine], BatcherConfig(), clock=clock)
    task = await started(b)
    with pytest.raises(DeadlineExceeded):
        await submit(b, 1, deadline=clock.now())
    assert engine.batches == []
    await b.drain()
    await task


async def test_cancelled_request_is_never_computed():
    engine = GatedEngine()
    engine.gate.clear()
    b = ContinuousBatcher([engine], BatcherConfig(max_batch_size=4))
    task = await started(b)
    running = later(b, 0)
    await engine_started(engine)
    gone = later(b, 9)
    await until(lambda: len(b.queue) == 1)
    gone.cancel()
    await until(lambda: len(b.queue) == 0)
    engine.gate.set()
    await running
    await b.drain()
    await task
    assert 9 not in engine.seen


# ---------------------------------------------------------------- static
async def test_static_waits_for_n(clock):
    engine = GatedEngine()
    b = StaticBatcher([engine], BatcherConfig(max_batch_size=3), clock=clock)
    task = await started(b)
    first = [later(b, v) for v in (1, 2)]
    await clock.advance(3600.0)
    assert engine.batches == []  # two of three: still waiting, however long
    third = later(b, 3)
    results = await asyncio.wait_for(asyncio.gather(*first, third), 10)
    assert engine.batches == [[1, 2, 3]]
    assert [r.batch_size for r in results] == [3, 3, 3]
    assert [r.queue_time_s for r in results] == [3600.0, 3600.0, 0.0]
    await b.drain()
    await task


async def test_static_lone_request_deadline_still_applies(clock):
    engine = GatedEngine()
    b = StaticBatcher([engine], BatcherConfig(max_batch_size=4), clock=clock)
    task = await started(b)
    lone = later(b, 1, deadline=clock.now() + 0.1)
    await clock.advance(0.1)
    with pytest.raises(DeadlineExceeded):
        await lone
    assert engine.batches == []
    await b.drain()
    await task


async def test_static_flushes_partial_batch_on_drain_and_refuses_new_work():
    engine = GatedEngine()
    b = StaticBatcher([engine], BatcherConfig(max_batch_size=4))
    task = await started(b)
    waiting = [later(b, v) for v in (1, 2)]
    await until(lambda: len(b.queue) == 2)
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
    first = later(b, 0)
    await engine_started(engine)
    rest = [later(b, v) for v in range(1, 6)]
    await until(lambda: len(b.queue) == 5)
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
    pending = [later(b, v) for v in (1, 2)]
    await engine_started(engines[0])
    await engine_started(engines[1])  # both busy at the same time
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
    first = later(b, 0)
    await engine_started(engine)
    batch = [later(b, v) for v in (11, 12, 13, 14)]
    await until(lambda: len(b.queue) == 4)
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
    """Under real time and real threads (the load every other test here leaves out): 300
    requests racing a short delay and a short compute, each answered with its own rows."""
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
