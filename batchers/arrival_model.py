"""The recent arrival rate, over a short and a long window.

The short window (default 100 ms) sees a burst at once; the long one (default 2 s) keeps a
steady estimate when the short window holds too few arrivals to mean anything. ``rate``
uses the short window once it holds ``min_short`` arrivals, else the long one. Each window
is a deque pruned from the left by ``arrived`` and ``prune`` (the writers); a query only
reads, skipping what has aged out since the last prune, so a decision that asks the rate
changes nothing (``batchers.policy``) and still costs O(1) amortized.
"""

from __future__ import annotations

from collections import deque


class _Window:
    def __init__(self, seconds: float, max_kept: int) -> None:
        self.seconds = seconds
        self.times: deque[float] = deque(maxlen=max_kept)  # bounded whatever the rate

    def count(self, now: float) -> int:
        """Arrivals at or after ``now - seconds`` (reads only)."""
        times, edge = self.times, now - self.seconds
        stale, n = 0, len(times)
        while stale < n and times[stale] < edge:
            stale += 1
        return n - stale

    def prune(self, now: float) -> None:
        times, edge = self.times, now - self.seconds
        while times and times[0] < edge:
            times.popleft()


class ArrivalModel:
    def __init__(
        self, short_s: float = 0.1, long_s: float = 2.0, min_short: int = 8, max_kept: int = 65536
    ) -> None:
        self.min_short = min_short
        self._short = _Window(short_s, max_kept)
        self._long = _Window(long_s, max_kept)
        self._start: float | None = None

    def arrived(self, when: float) -> None:
        if self._start is None:
            self._start = when
        self._short.times.append(when)
        self._long.times.append(when)
        self.prune(when)

    def prune(self, now: float) -> None:
        """Drop what has left each window by ``now`` (the queries skip it anyway)."""
        self._short.prune(now)
        self._long.prune(now)

    def rates(self, now: float) -> tuple[float, float]:
        """(short-window, long-window) arrivals per second at ``now``."""
        return self._rates(now)[:2]

    def rate(self, now: float) -> float:
        """The short-window rate when it holds ``min_short`` arrivals, else the long one."""
        return self.rate_and_long(now)[0]

    def rate_and_long(self, now: float) -> tuple[float, float]:
        """(``rate``, long-window rate) from one pass over the windows: the decision plans
        with the first and sizes its queueing reserve with the larger of the two."""
        short, long_, short_count = self._rates(now)
        return (short if short_count >= self.min_short else long_), long_

    def _rates(self, now: float) -> tuple[float, float, int]:
        if self._start is None:
            return 0.0, 0.0, 0
        # a window is never longer than the time observed so far, so the first second of
        # traffic is not diluted by the idle time before it
        observed = max(now - self._start, 1e-3)
        short_count = self._short.count(now)
        short = short_count / min(self._short.seconds, observed)
        long_ = self._long.count(now) / min(self._long.seconds, observed)
        return short, long_, short_count
