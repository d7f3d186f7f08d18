"""Open-loop arrival schedules, computed in full before the first request is sent.

Scheduling ahead keeps the generator honest: the send times do not depend on how fast the
server answers, so a slow server cannot slow the offered load down (no coordinated omission).
Every schedule is an increasing float64 array of offsets in seconds from the run's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARRIVALS = ("poisson", "constant", "bursty", "trace")


@dataclass(frozen=True)
class BurstSpec:
    """A two-state Markov-modulated Poisson process (MMPP-2); on/off when ``low_fraction`` is 0.

    The mean rate is the run's ``rate``. In the high state requests arrive at
    ``peak_factor * rate``, in the low state at ``low_fraction * rate``; the share of time spent
    high follows from keeping the mean. ``mean_on_s`` is the mean high-state dwell; dwells are
    exponential (a true MMPP) or ``fixed`` (a square wave).
    """

    peak_factor: float = 4.0
    low_fraction: float = 0.0
    mean_on_s: float = 0.5
    dwell: str = "exponential"  # or "fixed"

    def __post_init__(self) -> None:
        if not self.low_fraction < 1.0 < self.peak_factor:
            raise ValueError("bursty needs low_fraction < 1 < peak_factor")
        if self.low_fraction < 0 or self.mean_on_s <= 0:
            raise ValueError("bursty needs low_fraction >= 0 and mean_on_s > 0")
        if self.dwell not in ("exponential", "fixed"):
            raise ValueError("dwell must be 'exponential' or 'fixed'")

    @property
    def on_share(self) -> float:
        """Fraction of time in the high state so that the long-run mean equals the rate."""
        return (1.0 - self.low_fraction) / (self.peak_factor - self.low_fraction)

    @property
    def mean_off_s(self) -> float:
        share = self.on_share
        return self.mean_on_s * (1.0 - share) / share


def poisson(rate: float, horizon_s: float, rng: np.random.Generator) -> np.ndarray:
    """Exponential inter-arrivals with mean 1/rate, cut at ``horizon_s``."""
    _check_rate(rate)
    return _poisson_segment(rate, 0.0, horizon_s, rng)


def constant(rate: float, horizon_s: float) -> np.ndarray:
    """Evenly spaced arrivals at exactly ``rate`` per second (first one at 0)."""
    _check_rate(rate)
    count = int(np.ceil(horizon_s * rate - 1e-9))
    return np.arange(count, dtype=np.float64) / rate


def bursty(
    rate: float, horizon_s: float, rng: np.random.Generator, spec: BurstSpec | None = None
) -> np.ndarray:
    """MMPP-2 arrivals: Poisson at a high rate during bursts, a low (or zero) rate between."""
    _check_rate(rate)
    spec = spec or BurstSpec()
    high, low = spec.peak_factor * rate, spec.low_fraction * rate
    pieces: list[np.ndarray] = []
    t = 0.0
    # Start in a random state weighted by its long-run share, so short runs are not biased.
    on = bool(rng.random() < spec.on_share)
    while t < horizon_s:
        mean = spec.mean_on_s if on else spec.mean_off_s
        dwell = rng.exponential(mean) if spec.dwell == "exponential" else mean
        end = min(t + dwell, horizon_s)
        state_rate = high if on else low
        if state_rate > 0:
            pieces.append(_poisson_segment(state_rate, t, end, rng))
        t, on = end, not on
    return np.concatenate(pieces) if pieces else np.empty(0)


def load_trace(path: str | Path, time_scale: float = 1.0) -> np.ndarray:
    """Arrival times from a file: one timestamp (seconds) per line, or CSV whose first column is.

    Lines that do not start with a number (headers, comments) are skipped. Times are sorted
    and shifted to start at 0; ``time_scale`` stretches (>1) or compresses (<1) the trace.
    """
    times: list[float] = []
    for line in Path(path).read_text().splitlines():
        field = line.split(",")[0].strip()
        try:
            times.append(float(field))
        except ValueError:
            continue
    if not times:
        raise ValueError(f"no timestamps found in {path}")
    arr = np.sort(np.asarray(times, dtype=np.float64))
    return (arr - arr[0]) * time_scale


def make_schedule(
    arrival: str,
    rate: float | None,
    horizon_s: float,
    seed: int = 0,
    burst: BurstSpec | None = None,
    trace: np.ndarray | None = None,
) -> np.ndarray:
    """The schedule for a named arrival process over ``[0, horizon_s)``."""
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        return poisson(_need(rate), horizon_s, rng)
    if arrival == "constant":
        return constant(_need(rate), horizon_s)
    if arrival == "bursty":
        return bursty(_need(rate), horizon_s, rng, burst)
    if arrival == "trace":
        if trace is None:
            raise ValueError("trace arrival needs a trace file")
        return trace[trace < horizon_s]
    raise ValueError(f"unknown arrival {arrival!r}; expected one of {ARRIVALS}")


def _poisson_segment(rate: float, start: float, end: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals in [start, end), drawn in vectorised chunks."""
    out: list[np.ndarray] = []
    t = start
    expected = max((end - start) * rate, 1.0)
    chunk = int(expected + 6 * np.sqrt(expected) + 16)
    while True:
        times = t + np.cumsum(rng.exponential(1.0 / rate, size=chunk))
        inside = times[times < end]
        out.append(inside)
        if inside.size < times.size:
            break
        t = float(times[-1])
    return np.concatenate(out)


def _check_rate(rate: float) -> None:
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")


def _need(rate: float | None) -> float:
    if rate is None:
        raise ValueError("this arrival process needs --rate")
    return float(rate)
