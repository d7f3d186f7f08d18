"""A request-level policy is one decision, ``decide(view, now) -> Dispatch | Wait``
(batchers/policy.py): asked of a plain queue view at a given time, it answers from the
queue, the drain flag, the time and its own configuration alone, and leaves the queue as
it found it."""

from __future__ import annotations

from types import SimpleNamespace

from wattserve.batchers import BatcherConfig, ContinuousBatcher, DynamicBatcher, DynamicConfig, StaticBatcher
from wattserve.batchers.policy import Dispatch, Wait
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.types import WorkItem

from tests.gated_engine import GatedEngine, item_input


def view(*arrivals: float, rows: int = 1, closing: bool = False) -> SimpleNamespace:
    queue = PriorityFifo()
    for t in arrivals:
        queue.push(WorkItem(item_input(t, rows), arrival=t, rows=rows))
    return SimpleNamespace(queue=queue, closing=closing)


def test_dynamic_waits_out_its_delay_then_dispatches_and_a_drain_never_waits():
    policy = DynamicBatcher([GatedEngine()], DynamicConfig(max_batch_size=8, max_queue_delay_s=0.2,
                                                           preferred_batch_sizes=(4,)))  # fmt: skip
    two = view(10.0, 10.05)
    decision = policy.decide(two, 10.1)
    assert isinstance(decision, Wait)
    assert abs(decision.timeout - 0.1) < 1e-9 and decision.wake_at_depth == 4  # only 4 changes it
    # the oldest waited the delay: it goes, formed on the loop (not chained by a thread)
    assert policy.decide(two, 10.2) == Dispatch(8, complete=False)
    assert policy.decide(view(10.0, 10.05, closing=True), 10.1) == Dispatch(8, complete=False)
    assert policy.decide(view(1, 2, 3, 4), 1.0) == Dispatch(4)  # a preferred size: at once
    assert len(two.queue) == 2  # deciding took nothing


def test_static_dispatches_only_full_batches_or_on_drain():
    policy = StaticBatcher([GatedEngine()], BatcherConfig(max_batch_size=4))
    assert policy.decide(view(1, 2, 3), 9.0) == Wait(wake_at_depth=4)
    assert policy.decide(view(1, 2, 3, 4), 9.0) == Dispatch(4)
    assert policy.decide(view(1, 2, 3, closing=True), 9.0) == Dispatch(4, complete=False)
    assert policy.decide(view(1, rows=5), 9.0) == Dispatch(4)  # a request of 5 rows cannot grow: it goes


def test_continuous_dispatches_whatever_is_queued():
    policy = ContinuousBatcher([GatedEngine()], BatcherConfig(max_batch_size=8))
    assert policy.decide(view(1), 1.0) == Dispatch(8)
