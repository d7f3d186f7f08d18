"""Window attribution: a device's energy between two counter readings, split among batches.

Energy counters do not tick with every batch. A Hopper GPU's NVML counter advances in steps
every ~20-100 ms while a batch takes ~1 ms, so the difference of two readings around one
batch is usually 0 and now and then a whole step. So energy is booked per *window*: the span
between two readings that show the counter changed. For each window on a device:

- ``E`` = the counter's delta (every booked joule is a counter joule);
- ``U`` = the time inside the window when at least one batch ran on this device, ``T`` the
  window's length, ``T - U`` its idle time;
- busy energy = ``E - P_idle * (T - U)``, clamped to ``[0, E]``, where ``P_idle`` is this
  device's idle power learned from windows in which no batch ran (counter joules over
  seconds, a time-weighted average over the last ~``IDLE_TAU_S`` seconds); until one such
  window was seen, busy = ``E * U / T``;
- the busy energy is divided among the batches by their busy time inside the window (two
  engine instances, or two models, on one GPU split it by the time each ran); the rest is
  idle energy, reported apart.

So per-request energies plus idle energy sum to the counter's delta exactly, and a light load
is not biased towards idle (the baseline, not the share of time, decides what is idle).

When the counter is stepwise (its measured update period is several read intervals), the
moment of a step is estimated as the midpoint between the last reading that did not show it
and the first that did; otherwise (a counter that moves on every read, integrated power) the
reading's own time is the boundary.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence

IDLE_TAU_S = 5.0  # memory of the idle-power estimate (seconds of idle windows)
MAX_WAIT_S = 10.0  # a batch whose counter has not stepped this long after it ended: no figure
BOUNDARY_HISTORY = 64  # counter steps kept to estimate the update period


class BatchSpan:
    """One batch's execution on its devices, and the energy windows later attribute to it.

    Created by ``EnergyMeter.begin``; its figure is known only once every window it overlaps
    has closed (one counter step after it ended), so it has no ``joules`` at response time.
    ``attributed_joules`` is None until then, and stays None when a device failed to answer
    (never a partial figure).
    """

    __slots__ = (
        "_done",
        "_event",
        "_failed",
        "_idle_w",
        "_lock",
        "_on_done",
        "_open",
        "_reported",
        "_shares",
        "end",
        "labels",
        "size",
        "source",
        "start",
    )  # fmt: skip

    def __init__(self, devices: Sequence[str], source: str, start: float):
        self.start = start
        self.end: float | None = None
        self.source = source
        self.size: int | None = None
        self.labels: tuple[str, ...] = ()
        self._shares = dict.fromkeys(devices, 0.0)
        self._idle_w: dict[str, float] = {}  # device -> its idle baseline when the batch closed
        self._open = set(devices)
        self._failed = False
        self._lock = threading.Lock()
        self._done = False
        self._event: threading.Event | None = None  # made only when someone waits
        self._on_done: Callable[[BatchSpan], None] | None = None
        self._reported = False

    @property
    def devices(self) -> list[str]:
        return list(self._shares)

    @property
    def final(self) -> bool:
        return self._done

    @property
    def attributed_joules(self) -> float | None:
        """This batch's energy (all its devices), once every window it ran in has closed."""
        if not self._done or self._failed:
            return None
        return sum(self._shares.values())

    @property
    def idle_power_w(self) -> float | None:
        """Idle power of the batch's devices (their baselines when its last window closed),
        or None while any is unknown: what the device draws anyway, for the batcher's cost
        model (busy joules less this over the batch's time are what batching can save)."""
        if not self._done or self._failed or len(self._idle_w) < len(self._shares):
            return None
        return sum(self._idle_w.values())

    def share(self, device: str) -> float:
        return self._shares[device]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the figure is final (for scripts and tests, never the event loop)."""
        with self._lock:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def when_done(self, size: int, labels: tuple[str, ...], callback: Callable[[BatchSpan], None]) -> None:
        """Call ``callback(self)`` once, when both the batch size and the figure are known."""
        with self._lock:
            self.size, self.labels, self._on_done = size, labels, callback
        self._maybe_report()

    # --- called by DeviceWindows, under the ledger's lock ---
    def _add(self, device: str, joules: float) -> None:
        self._shares[device] += joules

    def _finish(self, device: str, failed: bool = False) -> None:
        with self._lock:
            self._failed |= failed
            self._open.discard(device)
            if self._open:
                return
            self._done = True
            event = self._event
        if event is not None:
            event.set()

    def _maybe_report(self) -> None:
        with self._lock:
            if self._reported or self._on_done is None or not self._done:
                return
            self._reported = True
            callback = self._on_done
        callback(self)


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (overlaps counted once)."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


class DeviceWindows:
    """One device's windows: detects counter steps, books busy/idle, attributes batches.

    Not thread-safe on its own: ``EnergyLedger`` calls it under its lock.
    """

    def __init__(self, device: str, source: str):
        self.device = device
        self.source = source
        self.stepwise = False  # set once the update period is measured
        self.busy = 0.0
        self.idle = 0.0
        self.windows = 0
        self.boundaries: deque[float] = deque(maxlen=BOUNDARY_HISTORY)
        self._last_read: tuple[float, float] | None = None  # (t, joules) of the last reading
        self._window: tuple[float, float] | None = None  # (t, joules) where the open window began
        self._spans: list[BatchSpan] = []
        self._idle_e = 0.0  # decaying sums of idle windows: joules, seconds
        self._idle_t = 0.0

    # --- what the ledger reads ---
    @property
    def idle_power_w(self) -> float | None:
        return self._idle_e / self._idle_t if self._idle_t > 0 else None

    @property
    def update_period_s(self) -> float | None:
        """Median interval between observed counter steps, or None before two were seen."""
        b = list(self.boundaries)
        gaps = sorted(y - x for x, y in itertools.pairwise(b) if y > x)
        if not gaps:
            return None
        mid = len(gaps) // 2
        return gaps[mid] if len(gaps) % 2 else 0.5 * (gaps[mid - 1] + gaps[mid])

    @property
    def pending(self) -> int:
        return len(self._spans)

    def add(self, span: BatchSpan) -> None:
        self._spans.append(span)

    def fail(self, span: BatchSpan) -> None:
        """This device did not answer at the batch's start or end: no figure for it."""
        if span in self._spans:
            self._spans.remove(span)
        span._finish(self.device, failed=True)

    def observe(self, t: float, joules: float) -> list[BatchSpan]:
        """A reading at ``t``; returns the batches whose figure became final."""
        if self._last_read is None:
            self._last_read = self._window = (t, joules)  # counting starts at the first read
            return []
        last_t, last_j = self._last_read
        self._last_read = (t, joules)
        if joules == last_j:
            return self._expire(t)
        boundary = 0.5 * (last_t + t) if self.stepwise else t
        self.boundaries.append(boundary)
        assert self._window is not None
        start_t, start_j = self._window
        self._window = (boundary, joules)
        return self._close(start_t, max(boundary, start_t), max(0.0, joules - start_j))

    def _expire(self, t: float) -> list[BatchSpan]:
        """A counter that stopped stepping must not hold batches (and memory) forever: those
        that ended MAX_WAIT_S ago get no figure; their time then counts as idle."""
        expired = []
        while self._spans and self._spans[0].end is not None and t - self._spans[0].end > MAX_WAIT_S:
            span = self._spans.pop(0)
            span._finish(self.device, failed=True)
            expired.append(span)
        return expired

    def _close(self, t0: float, t1: float, energy: float) -> list[BatchSpan]:
        self.windows += 1
        overlaps: list[tuple[BatchSpan, float, float, float]] = []
        for span in self._spans:
            a = max(span.start, t0)
            b = min(span.end if span.end is not None else t1, t1)
            if b > a:
                overlaps.append((span, a, b, b - a))
        busy_time = union_length([(a, b) for _, a, b, _ in overlaps])
        length = t1 - t0
        if busy_time <= 0:
            busy = 0.0
            if length > 0:
                decay = math.exp(-length / IDLE_TAU_S)
                self._idle_e = self._idle_e * decay + energy
                self._idle_t = self._idle_t * decay + length
        else:
            idle_power = self.idle_power_w
            if idle_power is None:
                busy = energy * busy_time / length if length > 0 else energy
            else:
                busy = energy - idle_power * max(0.0, length - busy_time)
            busy = min(energy, max(0.0, busy))
            ran = sum(o for *_, o in overlaps)
            for span, _, _, o in overlaps:
                span._add(self.device, busy * o / ran)
        self.busy += busy
        self.idle += energy - busy
        finished = [s for s in self._spans if s.end is not None and s.end <= t1]
        if finished:
            self._spans = [s for s in self._spans if not (s.end is not None and s.end <= t1)]
            idle_w = self.idle_power_w
            for span in finished:
                if idle_w is not None:
                    span._idle_w[self.device] = idle_w
                span._finish(self.device)
        return finished
