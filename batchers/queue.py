"""A bounded multi-level FIFO: priority levels first, arrival order within a level.

The event loop pushes and removes; engine threads pop (pipelining), so every mutation
holds ``lock`` (re-entrant: a thread holds it across its size decision and its pop)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from wattserve.batchers.types import ItemState, WorkItem


class PriorityFifo:
    """Levels 1..N (1 highest). Removal of a single item (expiry, cancel) is O(queue)."""

    def __init__(self, levels: int = 1) -> None:
        self._levels: list[deque[WorkItem]] = [deque() for _ in range(levels)]
        self._count = 0
        self.lock = threading.RLock()

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[WorkItem]:
        with self.lock:
            snapshot = [item for level in self._levels for item in level]
        return iter(snapshot)

    def push(self, item: WorkItem) -> None:
        with self.lock:
            self._levels[item.priority - 1].append(item)
            self._count += 1

    def remove(self, item: WorkItem) -> bool:
        """Take out one queued item; False if it was not queued."""
        with self.lock:
            try:
                self._levels[item.priority - 1].remove(item)
            except ValueError:
                return False
            self._count -= 1
            return True

    def pop(self, n: int) -> list[WorkItem]:
        """Up to ``n`` items, highest level first, FIFO within a level."""
        out: list[WorkItem] = []
        with self.lock:
            for level in self._levels:
                while level and len(out) < n:
                    item = level.popleft()
                    self._count -= 1
                    if item.state is ItemState.QUEUED:  # defensive: answered items never stay queued
                        out.append(item)
                if len(out) == n:
                    break
        return out

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

    def oldest_arrival(self) -> float | None:
        """Arrival time of the longest-waiting item at any level (drives max_queue_delay)."""
        with self.lock:
            heads = [level[0].arrival for level in self._levels if level]
        return min(heads) if heads else None
