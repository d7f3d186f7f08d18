"""Feedback from the latency the objective is about: arrival to answer, per request.

The cost model's margin learns how wrong the *compute* prediction was. A request's latency
has more in it on a shared host: the event loop answering late, a wait timer firing late,
HTTP and torch threads competing for the same cores. Two loops close that gap:

- ``LatencyMargin``: for each answered request, ``actual - planned`` where actual is its
  arrival to the moment its answer is set and planned is what the plan expected when it
  was dispatched (its age then, plus the late start of a planned wait, plus the predicted
  compute). The margin is the objective's percentile of that over the last ``window``
  requests (request-weighted, as the objective is), so it covers whatever the plan does not
  see, not only compute error.
- ``MissBackoff``: AIMD on how long a planned wait may hold a request (a share of the
  budget: ``scale``). Over the last ``window`` requests, if more of them missed than the
  percentile allows (p99: 1%), halve it (down to ``floor``: a few milliseconds, a dynamic
  batcher's delay) and judge the new hold on new evidence; once a whole window has passed
  with misses under half the allowance, give back ``recover`` of the budget per
  ``window`` requests, up to all of it. All of that per band of offered load (``rho``, the
  share of the engine the arrival rate takes in the plan's cheapest batches; bands in
  ``LOAD_BANDS``), each band with its own window: a cut at one load holds there, at every
  higher load and in the band just below; a clean window at one load gives back there and
  at every lower one.
  Misses past capacity say nothing about waiting at a third of it; with one hold for every
  load, a minute of overload left the hold at its floor for ~9,500 requests (5 minutes at
  30 req/s). Every answered request counts, as the objective
  counts it (``outcomes``): on a shared host the misses come in episodes (a burst of
  arrivals, a stall), and they catch the requests that queued behind a batch the plan
  waited for as well as the ones inside it. The wait is the only latency the batcher adds
  on purpose, so it is what gives way; the batch-size cap and the deadline keep the
  whole budget, so a backlog still drains in batches as big as the queue. The same cut
  raises the decision's queueing reserve (``caution``: its least while the hold is whole,
  its most at the floor, in the band it is asked at), so what the misses taught at one
  load carries to every higher one.

Both are plain data updated on the event loop once per answered batch; deterministic, no
clock of their own (tests drive them with fake outcomes).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable

import numpy as np


class LatencyMargin:
    """The ``percentile``-th quantile of (actual - planned) request latency."""

    def __init__(self, percentile: float = 99.0, window: int = 2048, min_samples: int = 32) -> None:
        self.percentile = percentile
        self.min_samples = min_samples
        # the last ``window`` requests' errors in a ring (order does not matter to a quantile):
        # a deque turned into an array for every quantile cost ~170 us per batch on the loop
        self._ring = np.zeros(window)
        self._filled = 0
        self._at = 0
        self._cached: float | None = None

    def observe(self, actual_s: float, planned_s: float, requests: int = 1) -> None:
        """``requests`` answered ``actual_s`` after arrival where the plan said ``planned_s``."""
        error = actual_s - planned_s
        if requests <= 0 or error != error:  # NaN
            return
        ring = self._ring
        size = len(ring)
        k = min(requests, size)
        at = self._at
        first = min(k, size - at)
        ring[at : at + first] = error
        ring[: k - first] = error  # the part that wraps around (nothing when it does not)
        self._at = (at + k) % size
        self._filled = min(self._filled + k, size)
        self._cached = None

    def margin(self) -> float:
        """Seconds to hold back (0 until ``min_samples`` requests were seen; never negative)."""
        if self._cached is None:
            value = 0.0
            if self._filled >= self.min_samples:
                value = max(float(np.percentile(self._ring[: self._filled], self.percentile)), 0.0)
            self._cached = value
        return self._cached

    def __len__(self) -> int:
        return self._filled


LOAD_BANDS = (0.3, 0.5, 0.7, 0.85, 1.0)  # offered load (rho) edges: six bands, the last overload


def load_band(load: float, edges: tuple[float, ...] = LOAD_BANDS) -> int:
    """Which band an offered load ``rho`` falls in (0: below the first edge)."""
    return bisect_right(edges, load)


class MissBackoff:
    """AIMD on the share of the budget a planned wait may hold a request (``scale``, in
    [floor, 1]), learned per band of offered load (``LOAD_BANDS``): misses at one load say
    nothing about waiting at a much lower one (module docstring)."""

    def __init__(
        self,
        percentile: float = 99.0,
        window: int = 500,
        decrease: float = 0.5,
        recover: float = 0.05,
        floor: float = 0.05,
        bands: tuple[float, ...] = LOAD_BANDS,
    ) -> None:
        self.allowed = max((100.0 - percentile) / 100.0, 1e-4)  # share that may miss
        self.window = window
        self.decrease = decrease
        self.recover = recover
        self.floor = floor
        self.bands = bands
        self.scales = [1.0] * (len(bands) + 1)  # by band; never rising with load
        self.backoffs = 0  # times the hold was cut
        # by band, the last ``window`` requests answered at that load (True: missed)
        self._recent: list[deque[bool]] = [deque(maxlen=window) for _ in self.scales]
        self._missed = [0] * len(self.scales)  # misses in each band's window

    @property
    def scale(self) -> float:
        """The lowest load's share (every band's, where no load is given)."""
        return self.scales[0]

    @scale.setter
    def scale(self, value: float) -> None:
        self.scales = [value] * len(self.scales)

    def record(self, met: int, missed: int, load: float = 0.0) -> None:
        """One answered batch: ``met`` within the ceiling, ``missed`` past it, answered at
        offered load ``load``."""
        band = load_band(load, self.bands)
        recent, scales = self._recent[band], self.scales
        for late in (True,) * missed + (False,) * met:
            if len(recent) == recent.maxlen and recent[0]:
                self._missed[band] -= 1
            recent.append(late)
            self._missed[band] += late
        if self._missed[band] > self.allowed * self.window:
            cut = max(scales[band] * self.decrease, self.floor)
            # waiting at more load misses too; and the band just below: a steady load
            # near an edge moves across it, and a band without misses of its own would
            # hold the whole budget there
            for affected in range(max(band - 1, 0), len(scales)):
                scales[affected] = min(scales[affected], cut)
            self.backoffs += 1
            recent.clear()  # judge the new hold on new evidence
            self._missed[band] = 0
        elif met and len(recent) == self.window and self._missed[band] <= self.allowed * self.window / 2:
            scales[band] = min(scales[band] + self.recover * met / self.window, 1.0)
            for lower in range(band):  # what holds at this load holds at less
                scales[lower] = max(scales[lower], scales[band])

    def hold_s(self, budget_s: float, load: float = 0.0) -> float:
        """The longest a planned wait may hold a request at ``load``, for an objective's
        ``budget_s``."""
        return self.scales[load_band(load, self.bands)] * budget_s

    def caution(self, least: float = 0.0, most: float = 1.0, load: float = 0.0) -> float:
        """How much of a queueing reserve a wait should keep at ``load``: ``least`` while
        the hold is whole, rising to ``most`` at the floor (the same misses that cut the
        hold say the host queues more than the plan allowed for)."""
        scale = self.scales[load_band(load, self.bands)]
        return least + (most - least) * (1.0 - scale) / (1.0 - self.floor)

    def miss_ratio(self, load: float = 0.0) -> float:
        """Misses over the requests in the window of ``load``'s band (0 when empty)."""
        band = load_band(load, self.bands)
        recent = self._recent[band]
        return self._missed[band] / len(recent) if recent else 0.0


def outcomes(arrivals: Iterable[float], now: float, ceiling: float) -> tuple[int, int]:
    """(met, missed): requests of one batch answered at ``now``, within ``ceiling`` seconds
    of their arrival or past it; what ``MissBackoff`` records."""
    met = missed = 0
    for arrival in arrivals:
        if now - arrival > ceiling:
            missed += 1
        else:
            met += 1
    return met, missed
