"""BisectHistogram gives the same samples as prometheus_client's Histogram for the same
observations: bucket edges, beyond the last bound, negatives, infinities and NaN, labelled
children, and the library's error for an unlabelled parent (telemetry/histogram.py)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram
from wattserve.telemetry.buckets import LATENCY_BUCKETS
from wattserve.telemetry.histogram import BisectHistogram

VALUES = [0.0, 0.0005, 0.00050001, 0.001, 0.0049, 0.005, 0.07, 1.0, 59.9, 60.0, 60.1, 1e9, -3.0,
          math.inf, -math.inf, math.nan, 0.02, 0.02, 30.0]  # fmt: skip


def samples(cls: type[Histogram], labelled: bool, many: bool = False) -> list[tuple]:
    registry = CollectorRegistry()
    labels = ("model",) if labelled else ()
    histogram = cls("h_seconds", "doc", labels, buckets=LATENCY_BUCKETS, registry=registry)
    target = histogram.labels("m") if labelled else histogram
    if many:
        target.observe_many(VALUES)
    else:
        for value in VALUES:
            target.observe(value)
    out = []
    for metric in registry.collect():
        for s in metric.samples:
            if s.name.endswith("_created"):
                continue
            value = "nan" if math.isnan(s.value) else s.value
            out.append((s.name, tuple(sorted(s.labels.items())), value))
    return out


@pytest.mark.parametrize("labelled", [False, True])
def test_same_samples_as_the_library(labelled):
    ours, theirs = samples(BisectHistogram, labelled), samples(Histogram, labelled)
    assert ours == theirs
    assert any(name.endswith("_bucket") and value > 0 for name, _, value in ours)


@pytest.mark.parametrize("labelled", [False, True])
def test_observing_many_at_once_gives_the_same_samples(labelled):
    """``observe_many`` (the engine core's per-turn books): the samples of one observe each,
    NaN and infinities included; and for finite values, the one-add-per-bucket path gives them too."""
    assert samples(BisectHistogram, labelled, many=True) == samples(Histogram, labelled)
    finite = [v for v in VALUES if math.isfinite(v)]
    ours, theirs = BisectHistogram("a_seconds", "d", registry=CollectorRegistry()), Histogram(
        "b_seconds", "d", registry=CollectorRegistry())  # fmt: skip
    ours.observe_many(finite)
    for value in finite:
        theirs.observe(value)
    assert [b.get() for b in ours._buckets] == [b.get() for b in theirs._buckets]
    assert ours._sum.get() == pytest.approx(theirs._sum.get())


def test_an_unlabelled_parent_still_refuses_observations():
    histogram = BisectHistogram("p_seconds", "doc", ("model",), registry=CollectorRegistry())
    with pytest.raises(ValueError, match="missing label values"):
        histogram.observe(1.0)
