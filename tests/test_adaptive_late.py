"""The adaptive batcher's late-last rule (``slo_late_last``, on by default): a queued
request that can no longer meet the objective moves behind the ones that still can, and
while any such is queued the engine does not wait. Decisions driven directly on a queue
(no server, no load) through the scheduler's one decision step (``decide_once``: the
policy's answer, the queue moves it names, its ``observe``); the queue's lanes have their
own tests (test_queue_delayed_lane)."""

from __future__ import annotations

from time import monotonic

from wattserve.batchers.adaptive import AdaptiveBatcher, AdaptiveConfig
from wattserve.batchers.policy import Dispatch
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.scheduler import decide_once
from wattserve.batchers.types import WorkItem
from wattserve.engines.identity import IdentityEngine


class _View:
    def __init__(self, queue: PriorityFifo) -> None:
        self.queue = queue
        self.closing = False


def _batcher(**config) -> AdaptiveBatcher:
    """100 ms objective (90 ms budget: 10 ms headroom), 10 ms per request: a request older
    than 80 ms cannot meet it even alone."""
    engine = IdentityEngine(elements=4, max_batch_size=8)
    batcher = AdaptiveBatcher(
        [engine], AdaptiveConfig(max_batch_size=8, slo_s=0.100, calibrate=False, **config)
    )
    batcher.seed_costs({b: 0.010 * b for b in (1, 2, 4, 8)})
    return batcher


def _queue(now: float, ages_ms: list[float]) -> tuple[PriorityFifo, list[WorkItem]]:
    queue = PriorityFifo()
    items = [WorkItem({}, arrival=now - age / 1000) for age in ages_ms]
    for item in items:
        queue.push(item)
    return queue, items


def test_late_requests_go_behind_and_fill_only_what_the_on_time_ones_can_carry() -> None:
    batcher = _batcher()
    now = monotonic()
    queue, items = _queue(now, [95, 90, 85, 45, 40, 35])  # three past saving, three not
    decision = decide_once(batcher, _View(queue), now)
    assert queue.delayed == 3 and batcher.delayed_total == 3
    # the oldest on-time request (45 ms) has 45 ms left: 4 requests (40 ms) fit, 5 do not
    assert decision == Dispatch(4, complete=False)
    assert batcher.last_decision is not None and batcher.last_decision.reason == "late queued"
    assert queue.pop(4) == [items[3], items[4], items[5], items[0]]  # on time first, then the oldest late


def test_only_late_requests_queued_go_at_once_first_come_first_served() -> None:
    batcher = _batcher()
    now = monotonic()
    queue, items = _queue(now, [300, 200, 150])
    assert decide_once(batcher, _View(queue), now) == Dispatch(3, complete=False)
    assert queue.pop(3) == items


def test_without_late_requests_the_plan_is_unchanged() -> None:
    """Requests that can still make it are not moved: a lone young request is waited for
    as before (a modest arrival rate makes one more worth it)."""
    batcher = _batcher()
    batcher.seed_costs({b: 0.006 + 0.004 * b for b in (1, 2, 4, 8)})  # a pair costs less per request
    now = monotonic()
    queue, _ = _queue(now, [5])
    for k in range(4):
        batcher.arrivals.arrived(now - 0.4 + 0.1 * k)
    assert not isinstance(decide_once(batcher, _View(queue), now), Dispatch)
    assert queue.delayed == 0 and batcher.delayed_total == 0


def test_turned_off_the_queue_stays_first_come_first_served() -> None:
    batcher = _batcher(late_last=False)
    now = monotonic()
    queue, items = _queue(now, [95, 90, 85, 50])
    decision = decide_once(batcher, _View(queue), now)
    assert isinstance(decision, Dispatch) and queue.delayed == 0
    assert queue.pop(decision.rows)[0] is items[0]


def test_rejecting_late_requests_replaces_moving_them() -> None:
    batcher = _batcher(reject_late=True)
    assert not batcher.late_last


def test_the_count_is_exported() -> None:
    batcher = _batcher()
    now = monotonic()
    queue, _ = _queue(now, [95, 10])
    decide_once(batcher, _View(queue), now)
    metrics = {m.name: m for m in batcher.collect_policy(("m", "adaptive"))}
    assert metrics["wattserve_adaptive_late_delayed"].samples[0].value == 1


def test_a_burst_moves_its_excess_early_so_the_rest_meet_the_objective() -> None:
    """20 requests 5 ms old at 10 ms each in batches of 8 (80 ms a batch), 90 ms budget:
    first come first served, the second and third batches (160 and 200 ms from now) are
    late, and none is late alone yet (the rule until the fifteenth session moved none).
    Counted with the batches the queue drains in, the 12 oldest move and the 8 youngest
    go now, in time; 13 would move none more in time, 11 leaves a second batch late."""
    batcher = _batcher()
    now = monotonic()
    queue, items = _queue(now, [5.0 - 0.01 * i for i in range(20)])
    decision = decide_once(batcher, _View(queue), now)
    assert queue.delayed == 12 and batcher.delayed_total == 12
    assert decision == Dispatch(8, complete=True)
    assert queue.pop(8) == items[12:]  # the youngest first; the moved ones after them
    assert queue.pop(12) == items[:12]
