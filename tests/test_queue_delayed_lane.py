"""The queue's delayed lanes (Triton's ``timeout_action: DELAY``): every walk of the queue
visits a level's on-time items, then its delayed ones, then the next level; the books
(items, rows, delayed count) stay right whichever way an item leaves."""

from __future__ import annotations

import numpy as np
import pytest
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.types import WorkItem


def item(value: float, *, priority: int = 1, arrival: float = 0.0, rows: int = 1) -> WorkItem:
    return WorkItem(
        {"x": np.full((rows, 1), value, np.float32)}, priority=priority, arrival=arrival, rows=rows
    )


def values(items) -> list[float]:
    return [float(i.inputs["x"][0, 0]) for i in items]


def queue_of(*items: WorkItem, levels: int = 2) -> PriorityFifo:
    q = PriorityFifo(levels)
    for i in items:
        q.push(i)
    return q


def test_delayed_item_goes_after_its_level_and_before_the_next():
    a, b, c, low = item(1, arrival=1), item(2, arrival=2), item(3, arrival=3), item(9, priority=2, arrival=0)
    q = queue_of(a, b, c, low)
    assert q.delay(a) and q.delayed == 1
    assert not q.delay(a)  # delayed once; a second expiry changes nothing
    assert values(q) == [2, 3, 1, 9] and values(q.peek(4)) == [2, 3, 1, 9]
    assert q.head(3).rows == 3 and len(q) == 4 and q.rows == 4
    assert values(q.pop(2)) == [2, 3] and q.delayed == 1
    assert values(q.pop(2)) == [1, 9] and q.delayed == 0 and len(q) == 0 and q.rows == 0


def test_oldest_arrival_counts_the_delayed():
    """A delayed item is still the longest-waiting one: a dynamic batcher's delay is
    measured from it."""
    a, b = item(1, arrival=1.0), item(2, arrival=2.0)
    q = queue_of(a, b)
    q.delay(a)
    assert q.oldest_arrival() == 1.0
    assert q.arrived_before(1.5) and not q.arrived_before(0.5)


def test_remove_and_time_bound_take_delayed_items_too():
    a, b, c = item(1, arrival=1.0), item(2, arrival=2.0), item(3, arrival=3.0)
    q = queue_of(a, b, c)
    q.delay(a)
    q.delay(c)  # delayed lane in delay order: a, c
    assert q.remove(c) and q.delayed == 1 and len(q) == 2
    assert not q.remove(c)
    assert values(q.pop_arrived_before(1.5)) == [1]  # the delayed a, by its arrival
    assert q.delayed == 0 and values(q) == [2]


def test_whole_requests_of_several_rows_batch_across_the_lanes():
    """The irregular path (multi-row items) walks the same lanes in the same order."""
    a, b, c = item(1, rows=2, arrival=1), item(2, rows=3, arrival=2), item(3, rows=1, arrival=3)
    q = queue_of(a, b, c)
    q.delay(a)
    head = q.head(6)
    assert (head.rows, head.sizes) == (6, (3, 4, 6))
    assert values(q.pop_batch(4)) == [2, 3]  # b (3 rows) + c (1): a's 2 rows would overflow
    assert q.delayed == 1 and q.rows == 2
    assert values(q.pop_batch(4)) == [1] and q.delayed == 0 and q.rows == 0


def test_delay_oldest_moves_a_prefix_of_each_level_and_says_what_is_ahead():
    """The count is asked per level in walk order, with the items every walk visits first
    (the levels above, delayed ones included); a count past the level's size moves all."""
    a, b, c = item(1, arrival=1), item(2, arrival=2), item(3, arrival=3)
    low1, low2 = item(8, priority=2, arrival=0), item(9, priority=2, arrival=4)
    q = queue_of(a, b, c, low1, low2)
    asked = []

    def count(ahead, lane):
        asked.append((ahead, values(lane)))
        return 2 if len(asked) == 1 else 5

    assert q.delay_oldest(count) == 4 and q.delayed == 4
    assert asked == [(0, [1, 2, 3]), (3, [8, 9])]
    assert values(q) == [3, 1, 2, 8, 9] and len(q) == 5 and q.rows == 5


@pytest.mark.parametrize("multi_row", [False, True], ids=["one-row", "multi-row"])
def test_pop_takes_a_lanes_run_at_a_time_in_the_walk_order(multi_row):
    """``pop`` takes a lane's run at a time: the same items in the same order as one by one
    (level 1 on time, its delayed lane, level 2, ...), answered items skipped without
    counting toward ``n``, and the books (items, rows, delayed) right, with one-row items
    only (booked in bulk) or some of several rows (booked one by one)."""
    from wattserve.batchers.types import ItemState

    rng = np.random.default_rng(7)
    for _ in range(200):
        q = PriorityFifo(3)
        items = [item(float(k), priority=int(rng.integers(1, 4)), arrival=float(k),
                      rows=int(rng.integers(1, 4)) if multi_row else 1) for k in range(30)]  # fmt: skip
        for i in items:
            q.push(i)
        for i in items:
            if rng.random() < 0.3:
                q.delay(i)
        walk = list(q)  # the walk order, before anything is answered
        for i in items:
            if rng.random() < 0.1:
                i.state = ItemState.DONE  # answered while queued (defensive path): skipped
        expected = [i for i in walk if i.state is ItemState.QUEUED]
        got = []
        while len(q):
            n = int(rng.integers(1, 9))
            taken = q.pop(n)
            assert len(taken) <= n
            got += taken
            left = list(q)
            assert len(q) == len(left) and q.rows == sum(i.rows for i in left)
            assert q.delayed == sum(1 for lane in q._delayed for _ in lane)
        assert values(got) == values(expected)
        assert q._multi_row == 0 and q.rows == 0  # the multi-row books emptied with the queue


def test_a_batch_of_the_whole_irregular_queue_is_what_the_walk_would_take():
    """``head`` and ``pop_batch`` when every queued item fits the limit (a front end's groups
    make the queue irregular; the whole queue goes at once): the same sizes and items, in the
    walk order, as the item-by-item run, answered items skipped, and the books (items, rows,
    delayed, multi-row items, grouped requests) emptied."""
    from wattserve.batchers.types import ItemState

    rng = np.random.default_rng(11)
    for _ in range(200):
        q = PriorityFifo(3)
        items = [item(float(k), priority=int(rng.integers(1, 4)), rows=int(rng.integers(1, 5)))
                 for k in range(int(rng.integers(1, 12)))]  # fmt: skip
        items[0].rows = 2  # at least one group: the queue is irregular
        for i in items:
            i.requests = i.rows  # a group of one-row requests
            q.push(i)
        for i in items:
            if rng.random() < 0.3:
                q.delay(i)
        walk = list(q)
        limit = q.rows + int(rng.integers(0, 3))  # everything fits
        assert q.head(limit).sizes == tuple(np.cumsum([i.rows for i in walk]))
        assert q.head(limit).rows == q.rows and q.requests == sum(i.rows for i in walk)
        for i in walk:
            if rng.random() < 0.1:
                i.state = ItemState.DONE
        taken = q.pop_batch(limit)
        assert values(taken) == values([i for i in walk if i.state is ItemState.QUEUED])
        assert (len(q), q.rows, q.delayed, q._multi_row, q.grouped, q.requests) == (0, 0, 0, 0, 0, 0)
