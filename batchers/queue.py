"""A bounded multi-level FIFO of whole requests: priority levels first, arrival order
within a level; sizes counted in rows.

Each level has a second lane behind it, for delayed requests (``delay``): Triton's queue
policy ``timeout_action: DELAY`` moves a request whose timeout expired there, to run after
every request of its level that has not timed out (and before the next level's). Every
walk of the queue (pop, head, peek, iteration) visits the lanes in that order.

The event loop pushes and removes; engine threads pop (pipelining), so every mutation
holds ``lock`` (re-entrant: a thread holds it across its size decision and its pop).

A batch is a run of whole requests from the head (Triton never splits a request): it
starts with the head item, whatever its rows, and goes on while the next item has the
same ``shape_key`` and still fits. ``head`` describes that run for a policy's decision;
``pop_batch`` takes it. In the common case (every item one row, one shape) both are
O(1) arithmetic; otherwise they walk the head of the queue.

Every take also feeds ``drain`` (``batchers.service_rate.DrainRate``): the pace the queue
really empties at under backlog, which the queue's time bound is estimated from.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, repeat

from wattserve.batchers.clock import REAL_CLOCK, Clock
from wattserve.batchers.service_rate import DrainRate
from wattserve.batchers.types import ItemState, WorkItem


@dataclass(slots=True)  # not frozen: a frozen init sets each field through object.__setattr__
class Head:
    """The run of whole requests a batch of at most ``limit`` rows would take now.

    ``rows``: rows of that run. ``sizes``: the batch sizes reachable by whole requests
    (cumulative rows of the run), or None when every size 1..rows is (all items one row).
    ``closed``: the run cannot grow with later arrivals (the next queued item has another
    shape), so waiting for more does not make this batch bigger."""

    rows: int
    sizes: tuple[int, ...] | None
    closed: bool

    def reachable(self, size: int) -> bool:
        return size <= self.rows if self.sizes is None else size in self.sizes


EMPTY_HEAD = Head(0, None, False)


class PriorityFifo:
    """Levels 1..N (1 highest), each with its delayed lane behind it. Removal of a single
    item (expiry, cancel, delay) is O(queue)."""

    def __init__(self, levels: int = 1, clock: Clock = REAL_CLOCK) -> None:
        self._on_time: list[deque[WorkItem]] = [deque() for _ in range(levels)]
        self._delayed: list[deque[WorkItem]] = [deque() for _ in range(levels)]
        # the order every walk visits: level 1, its delayed, level 2, its delayed, ...
        pairs = zip(self._on_time, self._delayed, strict=True)
        self._levels: list[deque[WorkItem]] = [lane for pair in pairs for lane in pair]
        self.delayed = 0  # items in the delayed lanes
        self._count = 0
        self.rows = 0  # rows of every queued item
        self._multi_row = 0  # queued items with more than one row
        self.grouped = 0  # requests beyond one per item that queued groups stand for
        self._keys: dict[tuple, int] = {}  # queued items per shape key (variable-shape models)
        self.lock = threading.RLock()
        self.drain = DrainRate()
        self._now = clock.now  # when a take happened, for the drain (the batcher's clock)

    def __len__(self) -> int:
        return self._count

    @property
    def requests(self) -> int:
        """Client requests queued: one per item, a front end's group counting its members
        (what the model's ``max_queue_size`` bounds)."""
        return self._count + self.grouped

    def level_size(self, level: int) -> int:
        """Requests queued at priority ``level`` (on time and delayed): Triton's per-level
        ``max_queue_size`` counts them."""
        with self.lock:
            return len(self._on_time[level - 1]) + len(self._delayed[level - 1])

    def __iter__(self) -> Iterator[WorkItem]:
        with self.lock:
            snapshot = [item for level in self._levels for item in level]
        return iter(snapshot)

    @property
    def regular(self) -> bool:
        """Every queued item is one row and all share one shape: any prefix batches."""
        return not self._multi_row and len(self._keys) <= 1

    def push(self, item: WorkItem) -> None:
        with self.lock:
            self._on_time[item.priority - 1].append(item)
            self._count += 1
            rows = item.rows
            self.rows += rows
            if rows != 1 or item.shape_key is not None:  # the bookkeeping of the rare cases
                self._added(item)

    def remove(self, item: WorkItem) -> bool:
        """Take out one queued item; False if it was not queued."""
        with self.lock:
            if not self._take(item):
                return False
            self._forget(item)
            if not self._count:
                self.drain.emptied()
            return True

    def delay(self, item: WorkItem) -> bool:
        """Move a queued item behind every on-time item of its level (Triton's
        ``timeout_action: DELAY``); False if it is not queued on time (gone, or delayed
        already)."""
        with self.lock:
            try:
                self._on_time[item.priority - 1].remove(item)
            except ValueError:
                return False
            self._delayed[item.priority - 1].append(item)
            self.delayed += 1
            return True

    def late_moves(self, count: Callable[[int, Sequence[WorkItem]], int]) -> tuple[int, ...]:
        """For each level, in walk order, how many of its oldest on-time items to move
        behind the rest of them: ``count(ahead, lane)``, at most the lane. Reads only
        (``delay_first`` moves them). ``lane``: the level's on-time items, oldest first;
        ``ahead``: the items every walk visits before them (all lanes of the levels above).
        What the adaptive batcher asks for requests that would make the rest late (rule 10)."""
        counts = []
        ahead = 0
        with self.lock:
            for level, delayed in zip(self._on_time, self._delayed, strict=True):
                counts.append(min(count(ahead, level), len(level)) if level else 0)
                ahead += len(level) + len(delayed)
        return tuple(counts)

    def delay_first(self, counts: Sequence[int]) -> int:
        """Move the oldest ``counts[i]`` on-time items of level i+1 behind the rest of
        them (a ``Delay`` decision); how many moved."""
        moved = 0
        with self.lock:
            for level, delayed, n in zip(self._on_time, self._delayed, counts, strict=False):
                n = min(n, len(level))
                for _ in range(n):
                    delayed.append(level.popleft())
                moved += n
            self.delayed += moved
        return moved

    def delay_oldest(self, count: Callable[[int, Sequence[WorkItem]], int]) -> int:
        """``late_moves`` then ``delay_first`` in one hold of the lock; how many moved."""
        with self.lock:
            return self.delay_first(self.late_moves(count))

    def oldest_on_time(self, skip: Sequence[int] = ()) -> float | None:
        """Arrival of the longest-waiting item that is not delayed, the first ``skip[i]``
        on-time items of level i+1 left out (as ``delay_first(skip)`` would leave it)."""
        with self.lock:
            heads = [
                level[n].arrival
                for level, n in zip(self._on_time, chain(skip, repeat(0)))  # noqa: B905 (repeat is endless)
                if len(level) > n
            ]
        return min(heads) if heads else None

    def _take(self, item: WorkItem) -> bool:
        """Unlink ``item`` from whichever lane of its level holds it."""
        level = item.priority - 1
        try:
            self._on_time[level].remove(item)
            return True
        except ValueError:
            pass
        try:
            self._delayed[level].remove(item)
        except ValueError:
            return False
        self.delayed -= 1
        return True

    def pop(self, n: int) -> list[WorkItem]:
        """Up to ``n`` items (not rows), highest level first, FIFO within a level. Each lane's
        run is taken in one slice and counted once; only multi-row or shape-keyed items
        (variable-shape models) are also booked one by one."""
        out: list[WorkItem] = []
        queued = ItemState.QUEUED
        with self.lock:
            before = self.rows
            simple = not self._multi_row and not self._keys  # every queued item one row, unkeyed
            for lane, level in enumerate(self._levels):
                while level and len(out) < n:
                    want = n - len(out)
                    if want >= len(level):
                        taken = list(level)
                        level.clear()
                    else:
                        taken = [level.popleft() for _ in range(want)]
                    if lane & 1:  # a delayed lane
                        self.delayed -= len(taken)
                    self._count -= len(taken)
                    if simple:
                        self.rows -= len(taken)
                    else:
                        for item in taken:
                            self.rows -= item.rows
                            if item.rows != 1 or item.shape_key is not None:
                                self._removed(item)
                    # defensive: answered items never stay queued (skipped, not counted in n)
                    out += [item for item in taken if item.state is queued]
                if len(out) == n:
                    break
            if out:
                self.drain.taken(before - self.rows, self.rows, self._now())
        return out

    def pop_batch(self, limit: int) -> list[WorkItem]:
        """The run ``head(limit)`` describes: the head item whatever its rows, then each
        next item of the same shape while the rows stay within ``limit``."""
        with self.lock:
            if self.regular:
                return self.pop(limit)
            out = self._pop_all() if not self._keys and self.rows <= limit else self._pop_run(limit)
            if out:
                self.drain.taken(sum(item.rows for item in out), self.rows, self._now())
            return out

    def _pop_all(self) -> list[WorkItem]:
        """``pop_batch`` when every queued item goes (one shape, rows within the limit): the
        books are emptied at once rather than item by item (a front end's groups make the
        queue irregular, and a fast accelerator's batches take the whole queue)."""
        out: list[WorkItem] = []
        for level in self._levels:
            if level:
                out += level
                level.clear()
        self._count = self.rows = self._multi_row = self.grouped = self.delayed = 0
        queued = ItemState.QUEUED
        return [item for item in out if item.state is queued]  # defensive, as in pop

    def _pop_run(self, limit: int) -> list[WorkItem]:
        """``pop_batch`` when the queue is not regular (multi-row or mixed-shape items)."""
        out: list[WorkItem] = []
        rows = 0
        key = None
        for lane, level in enumerate(self._levels):
            while level:
                item = level[0]
                if item.state is not ItemState.QUEUED:  # defensive, as in pop
                    level.popleft()
                    self._forget(item, lane)
                    continue
                if out and (item.shape_key != key or rows + item.rows > limit):
                    return out
                level.popleft()
                self._forget(item, lane)
                out.append(item)
                rows += item.rows
                key = item.shape_key
        return out

    def head(self, limit: int) -> Head:
        """What ``pop_batch(limit)`` would take now, without taking it."""
        with self.lock:
            if self.regular:
                return Head(min(self._count, limit), None, False)
            if not self._keys and self.rows <= limit:  # one shape, and every item fits
                return Head(
                    self.rows, tuple(accumulate(it.rows for level in self._levels for it in level)), False
                )
            sizes: list[int] = []
            rows = 0
            key = None
            for level in self._levels:
                for item in level:
                    if sizes and item.shape_key != key:
                        return Head(rows, tuple(sizes), True)
                    if sizes and rows + item.rows > limit:
                        return Head(rows, tuple(sizes), False)
                    rows += item.rows
                    key = item.shape_key
                    sizes.append(rows)
            return Head(rows, tuple(sizes), False)

    def peek(self, n: int) -> list[WorkItem]:
        """The first ``n`` items ``pop`` would return, left in place."""
        out: list[WorkItem] = []
        with self.lock:
            for level in self._levels:
                for item in level:
                    if len(out) == n:
                        return out
                    out.append(item)
        return out

    def pop_arrived_before(self, cutoff: float) -> list[WorkItem]:
        """Take every queued item that arrived before ``cutoff``: the head of each level
        while it is that old (a level's on-time lane is in arrival order), and any such in
        the delayed lanes (in the order they were delayed)."""
        out: list[WorkItem] = []
        with self.lock:
            for level in self._on_time:
                while level and level[0].arrival < cutoff:
                    item = level.popleft()
                    self._forget(item)
                    if item.state is ItemState.QUEUED:
                        out.append(item)
            if self.delayed:
                for lane in self._delayed:
                    for item in [item for item in lane if item.arrival < cutoff]:
                        lane.remove(item)
                        self._forget(item, 1)
                        if item.state is ItemState.QUEUED:
                            out.append(item)
            if out and not self._count:
                self.drain.emptied()
        return out

    def arrived_before(self, cutoff: float) -> bool:
        """True if some queued item (delayed ones included) arrived before ``cutoff``."""
        with self.lock:
            if any(level and level[0].arrival < cutoff for level in self._on_time):
                return True
            late = self._delayed
            return bool(self.delayed) and any(item.arrival < cutoff for lane in late for item in lane)

    def oldest_arrival(self) -> float | None:
        """Arrival time of the longest-waiting item at any level, delayed ones included
        (drives max_queue_delay)."""
        with self.lock:
            heads = [level[0].arrival for level in self._on_time if level]
            if self.delayed:
                heads.extend(item.arrival for lane in self._delayed for item in lane)
        return min(heads) if heads else None

    # ------------------------------------------------------------------ bookkeeping
    def _added(self, item: WorkItem) -> None:
        """Multi-row and shape-keyed items' part of the books (push counts every item)."""
        if item.rows != 1:
            self._multi_row += 1
            self.grouped += item.requests - 1
        key = item.shape_key
        if key is not None:
            self._keys[key] = self._keys.get(key, 0) + 1

    def _forget(self, item: WorkItem, lane: int = 0) -> None:
        """All the books of one item that left the queue (pop books a slice of
        items at once); ``lane`` odd: it left a delayed lane."""
        if lane & 1:
            self.delayed -= 1
        self._count -= 1
        self.rows -= item.rows
        if item.rows != 1 or item.shape_key is not None:
            self._removed(item)

    def _removed(self, item: WorkItem) -> None:
        """The inverse of ``_added`` (pop counts every item)."""
        if item.rows != 1:
            self._multi_row -= 1
            self.grouped -= item.requests - 1
        key = item.shape_key
        if key is not None:
            left = self._keys[key] - 1
            if left:
                self._keys[key] = left
            else:
                del self._keys[key]
