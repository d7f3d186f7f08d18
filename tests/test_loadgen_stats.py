"""HDR-histogram percentiles agree with exact percentiles of the recorded latencies."""

from __future__ import annotations

import math

import numpy as np
import pytest
from wattserve.loadgen.stats import (
    PERCENTILES,
    min_queries_for,
    percentile_key,
    slo_percentile_ms,
    summarize_ms,
)

# 3 significant digits: every value in a bucket is within 2^-10 (< 0.1%) of the bucket's top.
HDR_RELATIVE = 2.0**-10


def exact_nearest_rank(values_us: np.ndarray, p: float) -> float:
    """The smallest recorded value with at least p% of the values at or below it."""
    ordered = np.sort(values_us)
    rank = max(1, math.ceil(p / 100.0 * ordered.size - 1e-9))
    return float(ordered[rank - 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hdr_percentiles_match_exact_within_precision(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Heavy-tailed latencies from 0.1 ms to seconds, like a loaded server's.
    latencies_s = rng.lognormal(mean=math.log(0.005), sigma=1.2, size=20_000)
    summary = summarize_ms(latencies_s.tolist())
    recorded_us = np.round(latencies_s * 1e6)  # what the histogram was given
    for p in PERCENTILES:
        exact_ms = exact_nearest_rank(recorded_us, p) / 1000.0
        hdr_ms = summary[percentile_key(p)]
        # HDR reports the top of the exact value's bucket (capped at the max): at most 0.1% above.
        assert exact_ms - 0.001 <= hdr_ms <= exact_ms * (1 + HDR_RELATIVE) + 0.001, (p, exact_ms, hdr_ms)
    assert summary["count"] == latencies_s.size
    assert summary["mean"] == pytest.approx(latencies_s.mean() * 1000, rel=1e-3)
    assert summary["max"] == pytest.approx(latencies_s.max() * 1000)
    assert summary["min"] == pytest.approx(latencies_s.min() * 1000)


def test_percentiles_are_ordered_and_empty_input_gives_none() -> None:
    s = summarize_ms(np.random.default_rng(3).exponential(0.01, 5000).tolist())
    values = [s[percentile_key(p)] for p in PERCENTILES]
    assert values == sorted(values)
    assert s["min"] <= values[0] and values[-1] <= s["max"]
    empty = summarize_ms([])
    assert empty["count"] == 0 and empty["p99"] is None


def test_failures_count_as_misses_in_the_slo_percentile() -> None:
    ok = [0.010] * 90  # 90 fast answers, 10 ms
    assert slo_percentile_ms(ok, 0, 95) == pytest.approx(10.0, rel=1e-3)
    # 10 failures of 100: p95 falls among the failures -> infinitely slow.
    assert slo_percentile_ms(ok, 10, 95) == math.inf
    # 4 failures of 94: p95 (rank 90) is still the slowest success.
    assert slo_percentile_ms(ok, 4, 95) == pytest.approx(10.0, rel=1e-3)
    slow_tail = [0.010] * 95 + [1.0] * 5
    assert slo_percentile_ms(slow_tail, 0, 95) == pytest.approx(10.0, rel=1e-3)
    assert slo_percentile_ms(slow_tail, 0, 96) == pytest.approx(1000.0, rel=1e-3)
    assert slo_percentile_ms([], 0, 95) == math.inf


def test_min_queries_leaves_enough_samples_beyond_the_percentile() -> None:
    assert min_queries_for(95) == 500
    assert min_queries_for(99) == 2500
    assert min_queries_for(99.9) == 25000
    for p in (50, 90, 95, 99, 99.9):
        n = min_queries_for(p)
        assert n * (1 - p / 100) >= 25 - 1e-6
