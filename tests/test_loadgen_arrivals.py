"""Arrival schedules have the rate and the distribution they claim (fixed seeds).

scipy is not installed, so the one-sample Kolmogorov-Smirnov test is written out here: the
statistic with numpy and its p-value from the Kolmogorov distribution's series.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from wattserve.loadgen.arrivals import BurstSpec, bursty, constant, load_trace, make_schedule, poisson


def ks_exponential(samples: np.ndarray, rate: float) -> tuple[float, float]:
    """KS statistic of ``samples`` against Exp(rate), and its asymptotic p-value."""
    x = np.sort(samples)
    n = x.size
    cdf = 1.0 - np.exp(-rate * x)
    d_plus = np.max(np.arange(1, n + 1) / n - cdf)
    d_minus = np.max(cdf - np.arange(0, n) / n)
    d = float(max(d_plus, d_minus))
    # Stephens' small-sample correction, then P(K > t) = 2 sum (-1)^(k-1) exp(-2 k^2 t^2).
    t = d * (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n))
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * t * t) for k in range(1, 101))
    return d, min(max(p, 0.0), 1.0)


def counts_per_bin(times: np.ndarray, horizon: float, width: float) -> np.ndarray:
    return np.histogram(times, bins=np.arange(0.0, horizon + width / 2, width))[0]


def test_ks_helper_rejects_the_wrong_rate() -> None:
    """The KS helper has power: exponential data at rate 50 is not Exp(40)."""
    x = np.random.default_rng(1).exponential(1 / 50, size=5000)
    assert ks_exponential(x, 50.0)[1] > 0.01
    assert ks_exponential(x, 40.0)[1] < 1e-6


def test_poisson_rate_and_exponential_interarrivals() -> None:
    rate, horizon = 50.0, 200.0
    times = poisson(rate, horizon, np.random.default_rng(42))
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < horizon
    # Count ~ Poisson(10000): 4 sigma is 400.
    assert abs(times.size - rate * horizon) < 4 * math.sqrt(rate * horizon)
    gaps = np.diff(np.concatenate([[0.0], times]))
    d, p = ks_exponential(gaps, rate)
    assert p > 0.01, f"KS D={d:.4f} p={p:.4g}: inter-arrivals are not Exp({rate})"
    counts = counts_per_bin(times, horizon, 1.0)
    dispersion = counts.var() / counts.mean()
    assert 0.8 < dispersion < 1.2  # Poisson counts: variance = mean


def test_poisson_is_reproducible_from_its_seed() -> None:
    a = make_schedule("poisson", 30.0, 10.0, seed=7)
    b = make_schedule("poisson", 30.0, 10.0, seed=7)
    c = make_schedule("poisson", 30.0, 10.0, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[: min(a.size, c.size)], c[: min(a.size, c.size)])


def test_constant_is_evenly_spaced_at_the_rate() -> None:
    times = constant(40.0, 5.0)
    assert times.size == 200
    assert np.allclose(np.diff(times), 1 / 40.0)
    # A constant schedule is far from exponential: the KS test must see it.
    assert ks_exponential(np.diff(times), 40.0)[1] < 1e-6


@pytest.mark.parametrize("low_fraction", [0.0, 0.5])
def test_bursty_keeps_the_mean_rate_and_is_overdispersed(low_fraction: float) -> None:
    rate, horizon = 20.0, 20_000.0
    spec = BurstSpec(peak_factor=4.0, low_fraction=low_fraction, mean_on_s=1.0)
    times = bursty(rate, horizon, np.random.default_rng(3), spec)
    assert np.all(np.diff(times) >= 0) and times[-1] < horizon
    # Long-run mean: over 5,000 on/off cycles the realised rate has a ~2% spread (measured
    # over 30 seeds: 6% at 500 cycles); 8% is four of those spreads.
    assert abs(times.size / horizon / rate - 1.0) < 0.08
    counts = counts_per_bin(times, horizon, 1.0)
    assert counts.var() / counts.mean() > 2.0  # bursts: far more variable than Poisson


def test_on_off_has_silent_periods_and_peak_rate_inside_bursts() -> None:
    rate, horizon = 20.0, 1000.0
    spec = BurstSpec(peak_factor=4.0, low_fraction=0.0, mean_on_s=2.0, dwell="fixed")
    times = bursty(rate, horizon, np.random.default_rng(5), spec)
    assert spec.on_share == pytest.approx(0.25)
    counts = counts_per_bin(times, horizon, 0.5)
    # Off periods last 6 s, so many half-second bins are empty; Poisson(10) almost never is.
    assert (counts == 0).mean() > 0.5
    busy = counts[counts > 0]
    assert busy.mean() / 0.5 == pytest.approx(rate * spec.peak_factor, rel=0.15)


def test_trace_replay_sorts_shifts_and_scales(tmp_path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,comment\n# a comment\n10.5,b\n10.0,a\n12.0\n11.0,c\n")
    times = load_trace(path)
    assert times.tolist() == [0.0, 0.5, 1.0, 2.0]
    assert load_trace(path, time_scale=2.0).tolist() == [0.0, 1.0, 2.0, 4.0]
    cut = make_schedule("trace", None, 1.5, trace=times)
    assert cut.tolist() == [0.0, 0.5, 1.0]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        make_schedule("poisson", None, 1.0)
    with pytest.raises(ValueError):
        make_schedule("lognormal", 1.0, 1.0)
    with pytest.raises(ValueError):
        BurstSpec(peak_factor=0.5)
    with pytest.raises(ValueError):
        poisson(0.0, 1.0, np.random.default_rng(0))
