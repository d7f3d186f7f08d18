"""What a batch of each size costs: engine seconds (and joules where a meter measures).

Learned, and kept current from every executed batch:

- ``seconds(b) = scale * shape(b)``. ``shape(b)`` blends a per-size EWMA with a weighted
  least-squares fit ``a + c*b`` over all sizes: the blend (and the fit's weights) favour
  sizes observed recently, with ``freshness = exp(-batches since last seen / memory)``
  (floored, so old timings still anchor the slope). A size not run lately thus follows the
  sizes that are, and a size never run is the fit. ``scale`` is a slow EWMA of every
  batch's observed/predicted ratio: a change that hits every size (a slower clock, a
  neighbour on the GPU) moves all of them at once.
- Each update's ratio is clipped to [1/3, 3]: one stall (a GC pause, a page-fault storm)
  nudges the model instead of rewriting it. The unclipped errors (plus each batch's
  hand-off time) are kept apart: ``margin`` is their ``percentile``-th quantile, what the
  policy holds back so that the objective's percentile survives prediction error.
- Predictions are made non-decreasing in ``b`` (a running maximum): a smaller batch never
  costs more than a larger one, which the policy relies on when it dispatches fewer
  requests than it waited for.
- Joules arrive late: a batch's energy is final only when the counter window it ran in
  closes (telemetry/windows.py), one counter step after the batch. ``observe_energy`` takes
  it then, per batch size, with the device's idle power; ``energy_mode`` says whether there
  is enough of it to decide by (``MIN_METERED`` batches), and why not.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import TypedDict

import numpy as np
from wattserve.batchers.size_ewma import SizeEwma

RATIO_CLIP = 3.0
MIN_METERED = 8  # metered batches before the decision trusts joules over seconds

# energy_mode() reasons, also the adaptive batcher's metric label values
NO_METER = "no meter"
WARMING_UP = "meter warming up"
JOULES = "joules"


class CostSnapshot(TypedDict):
    """``CostModel.snapshot()``: the fit a + c*b, its margin and tables, as plain data."""

    intercept_s: float
    per_item_s: float
    scale: float
    margin_s: float
    seconds: dict[int, float]  # size -> predicted seconds (empty before the first fit)
    joules: dict[int, float]  # size -> joules per batch, measured sizes only
    observations: int


class CostModel:
    """Engine seconds per batch size; joules per batch size where measured."""

    def __init__(
        self,
        max_batch_size: int,
        *,
        percentile: float = 99.0,
        size_alpha: float = 0.3,
        scale_alpha: float = 0.1,
        error_window: int = 512,
        memory: float = 64.0,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.percentile = percentile
        self.size_alpha = size_alpha
        self.scale_alpha = scale_alpha
        self.scale = 1.0
        self._shape = SizeEwma(size_alpha)  # size -> seconds / scale
        self._count: dict[int, int] = {}  # size -> observations (seed counts as one)
        self._seen: dict[int, int] = {}  # size -> self.observations when last updated
        self.memory = memory
        self._joules = SizeEwma(size_alpha)  # size -> joules per batch, measured sizes only
        self.metered = 0  # batches whose joules were observed
        self.idle_watts: float | None = None  # the metered device's idle power, last known
        self._errors: deque[float] = deque(maxlen=error_window)  # observed - predicted + hand-off
        self._curve: np.ndarray | None = None  # cached predictions, index = size
        self._margin: float | None = None  # cached
        self._bias: float | None = None  # cached with it
        self.observations = 0

    # ------------------------------------------------------------------ learning
    def seed(self, seconds_by_size: Mapping[int, float]) -> None:
        """Start from timed runs of each size (the warm-up pass)."""
        for size, seconds in seconds_by_size.items():
            if seconds > 0:
                self._shape.set(size, seconds / self.scale)
                self._count[size] = max(1, self._count.get(size, 0))
                self._seen[size] = self.observations
        self._curve = None

    def observe(self, size: int, seconds: float, joules: float | None = None) -> None:
        """One executed batch of ``size`` took ``seconds`` (and ``joules`` where measured)."""
        if size < 1 or seconds <= 0 or not math.isfinite(seconds):
            return
        self.observations += 1
        if self._shape:
            predicted = self.seconds(size)
            self._errors.append(seconds - predicted)
            self._margin = self._bias = None
            ratio = min(max(seconds / predicted, 1.0 / RATIO_CLIP), RATIO_CLIP)
            self.scale *= ratio**self.scale_alpha
            self._shape.update(size, predicted * ratio / self.scale)
        else:
            self._shape.update(size, seconds / self.scale)
        self._count[size] = self._count.get(size, 0) + 1
        self._seen[size] = self.observations
        if joules is not None and joules >= 0 and math.isfinite(joules):
            self._joules.update(size, joules)
            self.metered += 1
        self._curve = None

    def observe_energy(self, size: int, joules: float | None, idle_watts: float | None = None) -> None:
        """A batch's busy joules (its share of the counter windows it ran in), once they are
        final, and its device's idle power then: what the device draws when nothing runs."""
        if size < 1 or joules is None or joules < 0 or not math.isfinite(joules):
            return
        self._joules.update(size, joules)
        self.metered += 1
        if idle_watts is not None and idle_watts >= 0 and math.isfinite(idle_watts):
            self.idle_watts = idle_watts

    def energy_mode(self) -> tuple[str, str]:
        """("joules" | "seconds", why): joules once MIN_METERED batches were metered."""
        if self.metered == 0:
            return "seconds", NO_METER
        if self.metered < MIN_METERED:
            return "seconds", WARMING_UP
        return "joules", JOULES

    # ------------------------------------------------------------------ predictions
    def seconds(self, size: int) -> float:
        """Predicted engine seconds of one batch of ``size`` (0 when nothing is known)."""
        curve = self.curve()
        return float(curve[min(max(size, 1), self.max_batch_size)])

    def curve(self) -> np.ndarray:
        """Predicted seconds for sizes 0..max_batch_size (index = size; [0] = 0)."""
        if self._curve is None:
            self._curve = self._build_curve()
        return self._curve

    def _build_curve(self) -> np.ndarray:
        n = self.max_batch_size
        out = np.zeros(n + 1)
        if not self._shape:
            return out
        intercept, slope = self.fit()
        for b in range(1, n + 1):
            fitted = max(intercept + slope * b, 0.0)
            shape = self._shape.get(b)
            w = 0.0 if shape is None else self._freshness(b)
            out[b] = self.scale * (w * shape + (1 - w) * fitted if shape is not None else fitted)
        np.maximum.accumulate(out, out=out)
        return out

    def fit(self) -> tuple[float, float]:
        """``a + c*b`` in shape units, weighted least squares over the observed sizes."""
        sizes = np.array(sorted(self._shape), dtype=float)
        values = np.array([self._shape[int(s)] for s in sizes])
        if len(sizes) == 1:  # one point: assume the cost is all fixed (the cautious reading
            return float(values[0]), 0.0  # for waiting: a bigger batch looks no cheaper per item)
        weights = np.array([min(self._count[int(s)], 10) * self._freshness(int(s)) for s in sizes])
        w_sum = weights.sum()
        mean_b = (weights * sizes).sum() / w_sum
        mean_v = (weights * values).sum() / w_sum
        var = (weights * (sizes - mean_b) ** 2).sum()
        slope = max((weights * (sizes - mean_b) * (values - mean_v)).sum() / var, 0.0)
        return float(mean_v - slope * mean_b), float(slope)

    def _freshness(self, size: int) -> float:
        return max(math.exp(-(self.observations - self._seen[size]) / self.memory), 0.05)

    def observe_overhead(self, seconds: float) -> None:
        """Time the last observed batch spent outside the model that every request in it
        waits through (hand-off to the engine thread and back): added to that batch's
        prediction error, so the margin covers the two together."""
        if seconds >= 0 and math.isfinite(seconds) and self._errors:
            self._errors[-1] += seconds
            self._margin = self._bias = None

    def margin(self) -> float:
        """Seconds held back: the percentile of (observed - predicted + hand-off) over the
        recent batches, 0 until there are a few."""
        if self._margin is None:
            error = 0.0
            if len(self._errors) >= 8:
                error = max(float(np.percentile(np.fromiter(self._errors, float), self.percentile)), 0.0)
            self._margin = error
        return self._margin

    def bias(self) -> float:
        """Seconds a batch takes beyond its prediction on average (hand-off included; 0
        until there are a few, never below 0): what each of several batches in a row adds,
        where ``margin`` is the tail of one."""
        if self._bias is None:
            errors = np.fromiter(self._errors, float) if len(self._errors) >= 8 else np.zeros(1)
            self._bias = max(float(errors.mean()), 0.0)
        return self._bias

    def joules(self, size: int) -> float | None:
        """Measured joules per batch of ``size`` (EWMA), or None where not measured."""
        return self._joules.get(size)

    def joule_curve(self) -> np.ndarray | None:
        """Joules for sizes 0..max, or None when no batch was ever metered.

        Measured sizes use their own EWMA; the others are their predicted seconds times the
        busy power (joules per busy second) of the measured sizes: a straight-line fit of
        power against size where two or more sizes were measured (a bigger batch may draw
        more), their mean where one was.
        """
        if not self._joules:
            return None
        seconds = self.curve()
        rates = {
            b: j / seconds[b]
            for b, j in self._joules.items()
            if 1 <= b <= self.max_batch_size and seconds[b] > 0
        }
        watts = np.full(len(seconds), float(np.mean(list(rates.values()))) if rates else 0.0)
        if len(rates) >= 2:
            sizes = np.array(list(rates), dtype=float)
            slope, intercept = np.polyfit(sizes, np.array(list(rates.values())), 1)
            fitted = intercept + slope * np.arange(len(seconds))
            watts = np.clip(fitted, min(rates.values()) if slope < 0 else 0.0, None)
        out = seconds * watts
        for b, j in self._joules.items():
            if 1 <= b <= self.max_batch_size:
                out[b] = j
        return out

    def snapshot(self) -> CostSnapshot:
        """The model as plain data, for metrics and logs."""
        a, c = self.fit() if self._shape else (0.0, 0.0)
        return {
            "intercept_s": a * self.scale,
            "per_item_s": c * self.scale,
            "scale": self.scale,
            "margin_s": self.margin(),
            "seconds": {b: self.seconds(b) for b in range(1, self.max_batch_size + 1)} if self._shape else {},
            "joules": dict(self._joules.items()),
            "observations": self.observations,
        }
