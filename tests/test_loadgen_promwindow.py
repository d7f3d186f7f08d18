"""Server-side window statistics from two /metrics scrapes.

The serving metrics come from the server's own ``ServingMetrics``; the telemetry families are
declared here with the names and labels of telemetry/metrics.py (the feature branch's exporter),
so the arithmetic is checked against the text prometheus_client really writes.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from wattserve.loadgen.promwindow import gauge_series, is_power, parse, window_stats
from wattserve.server.models.metrics import ServingMetrics


def scrape(registry: CollectorRegistry, model: str = "m") -> object:
    return parse(generate_latest(registry).decode(), model)


def test_serving_window_deltas() -> None:
    reg = CollectorRegistry()
    m = ServingMetrics("m", "dynamic", reg)
    other = ServingMetrics("other", "dynamic", CollectorRegistry())  # a different registry
    # Before the window: must not count.
    m.observe_batch(8, 0.5)
    m.queue_time.observe(1.0)
    start = scrape(reg)
    for size in (1, 2, 2, 4, 7):
        m.observe_batch(size, 0.010)
    for q in (0.001, 0.003):
        m.queue_time.observe(q)
    m.outcome["success"].inc(16)
    m.outcome["queue_full"].inc(2)
    other.observe_batch(32, 1.0)
    end = scrape(reg)

    w = window_stats(start, end)
    assert w["inferences"] == 16 and w["batch_executions"] == 5
    assert w["avg_batch_size"] == pytest.approx(16 / 5)
    assert w["mean_compute_ms"] == pytest.approx(10.0)
    assert w["mean_queue_ms"] == pytest.approx(2.0)
    assert w["requests_by_outcome"]["success"] == 16
    assert w["requests_by_outcome"]["queue_full"] == 2
    counts = {b["le"]: b["count"] for b in w["batch_size_histogram"]}
    # Buckets 1, 2, 3, 4, 6, 8: sizes 1 | 2, 2 | - | 4 | - | 7
    assert counts[1.0] == 1 and counts[2.0] == 2 and counts[3.0] == 0
    assert counts[4.0] == 1 and counts[8.0] == 1 and counts[6.0] == 0
    assert sum(b["count"] for b in w["batch_size_histogram"]) == 5
    # No telemetry families at all: every figure is "not available".
    assert w["energy_per_inference_j"] is None and w["gpu_power_w"] is None
    assert w["gpu_telemetry_available"] is None and w["telemetry"] == []


def test_other_models_series_are_ignored() -> None:
    a_reg, b_reg = CollectorRegistry(), CollectorRegistry()
    a, b = ServingMetrics("a", "static", a_reg), ServingMetrics("b", "static", b_reg)

    def text() -> str:  # one exposition with both models' series, as a multi-model server's
        return generate_latest(a_reg).decode() + generate_latest(b_reg).decode()

    start = text()
    a.observe_batch(4, 0.1)
    b.observe_batch(16, 0.1)
    end = text()
    assert window_stats(parse(start, "a"), parse(end, "a"))["inferences"] == 4
    assert window_stats(parse(start, "b"), parse(end, "b"))["inferences"] == 16
    assert window_stats(parse(start), parse(end))["inferences"] == 20


def telemetry_registry() -> tuple[CollectorRegistry, dict[str, object]]:
    """Telemetry families as telemetry/metrics.py declares them."""
    r = CollectorRegistry()
    fam = {
        "available": Gauge("wattserve_gpu_telemetry_available", "x", registry=r),
        "power": Gauge("wattserve_gpu_power_watts", "x", ("gpu", "source"), registry=r),
        "energy": Counter("wattserve_gpu_energy_joules", "x", ("gpu", "source"), registry=r),
        "util": Gauge("wattserve_gpu_utilization_ratio", "x", ("gpu",), registry=r),
        "limit": Gauge("wattserve_gpu_power_limit_watts", "x", ("gpu",), registry=r),
        "state": Counter("wattserve_energy_joules", "x", ("device", "source", "state"), registry=r),
        "per_inf": Histogram(
            "wattserve_energy_inference_joules", "x", ("model", "batcher", "source"), registry=r
        ),
    }
    return r, fam


def test_energy_power_and_utilization_over_the_window() -> None:
    reg = CollectorRegistry()
    m = ServingMetrics("m", "dynamic", reg)
    treg, t = telemetry_registry()
    t["available"].set(1)
    t["limit"].labels("0").set(700)

    def snap():
        return parse(generate_latest(reg).decode() + generate_latest(treg).decode(), "m")

    def set_power(avg0: float, avg1: float) -> None:
        t["power"].labels("0", "nvml_average").set(avg0)
        t["power"].labels("1", "nvml_average").set(avg1)
        t["power"].labels("0", "nvml_instant").set(999)  # must not be added to the average
        t["util"].labels("0").set(0.5)
        t["util"].labels("1").set(0.7)

    set_power(100, 50)
    t["energy"].labels("0", "nvml_counter").inc(1000)
    start = snap()
    m.observe_batch(4, 0.1)
    m.observe_batch(6, 0.1)
    t["energy"].labels("0", "nvml_counter").inc(300)
    t["energy"].labels("1", "nvml_counter").inc(200)
    t["state"].labels("gpu0", "nvml_counter", "busy").inc(150)
    t["state"].labels("gpu0", "nvml_counter", "idle").inc(50)
    for _ in range(10):
        t["per_inf"].labels("m", "dynamic", "nvml_counter").observe(15.0)
    set_power(200, 100)
    middle = snap()
    end = snap()

    w = window_stats(start, end, [(0.0, start), (1.0, middle), (2.0, end)], (0.0, 2.0))
    assert w["inferences"] == 10
    assert w["gpu_telemetry_available"] is True
    # Busy + idle energy of the metered devices over the window / inferences.
    assert w["energy_per_inference_j"] == pytest.approx(200 / 10)
    assert "busy + idle" in w["energy_source"]
    assert w["energy_busy_j"] == 150 and w["energy_idle_j"] == 50
    assert w["busy_energy_per_inference_j"] == pytest.approx(15.0)
    assert w["gpu_energy_j"] == pytest.approx(500)
    # Power: per scrape the sum over GPUs of the averaged reading; mean of (150, 300, 300).
    assert w["gpu_power_w"] == pytest.approx(250.0)
    assert w["gpu_utilization"] == pytest.approx(0.6)
    names = {row["name"] for row in w["telemetry"]}
    assert {"wattserve_gpu_energy_joules_total", "wattserve_gpu_power_watts"} <= names
    series = gauge_series([(0.0, start), (1.0, middle)], is_power)
    assert series["wattserve_gpu_power_watts{gpu=0,source=nvml_average}"] == [(0.0, 100), (1.0, 200)]
    assert not any("limit" in key for key in series)


def test_gpu_counter_is_used_when_there_is_no_busy_idle_split() -> None:
    reg = CollectorRegistry()
    m = ServingMetrics("m", "dynamic", reg)
    treg, t = telemetry_registry()
    t["available"].set(1)
    start = parse(generate_latest(reg).decode() + generate_latest(treg).decode(), "m")
    m.observe_batch(5, 0.1)
    t["energy"].labels("0", "nvml_power_integrated").inc(50)
    end = parse(generate_latest(reg).decode() + generate_latest(treg).decode(), "m")
    w = window_stats(start, end)
    assert w["energy_per_inference_j"] == pytest.approx(10.0)
    assert "nvml_power_integrated" in w["energy_source"]


def test_unavailable_gpu_reports_no_figures() -> None:
    reg = CollectorRegistry()
    m = ServingMetrics("m", "dynamic", reg)
    treg, t = telemetry_registry()
    t["available"].set(0)
    text = lambda: generate_latest(reg).decode() + generate_latest(treg).decode()  # noqa: E731
    start = parse(text(), "m")
    m.observe_batch(5, 0.1)
    w = window_stats(start, parse(text(), "m"))
    assert w["gpu_telemetry_available"] is False
    assert w["energy_per_inference_j"] is None and w["energy_source"] is None
    assert w["gpu_power_w"] is None and w["gpu_utilization"] is None


def test_policy_state_is_kept_per_window_apart_from_telemetry() -> None:
    """The batcher's own gauges and counters (adaptive's hold and reserve, the objective's
    counts) come back per run, so a run's batches can be explained after the fact."""
    reg = CollectorRegistry()
    m = ServingMetrics("m", "adaptive", reg)
    hold = Gauge("wattserve_adaptive_max_hold_seconds", "h", ["model", "batcher"], registry=reg)
    slo = Counter("wattserve_slo_requests", "s", ["model", "batcher", "outcome"], registry=reg)
    hold.labels("m", "adaptive").set(0.09)
    slo.labels("m", "adaptive", "met").inc(5)
    start = scrape(reg)
    m.observe_batch(4, 0.01)
    hold.labels("m", "adaptive").set(0.045)
    middle = scrape(reg)
    slo.labels("m", "adaptive", "met").inc(3)
    slo.labels("m", "adaptive", "missed").inc(1)
    end = scrape(reg)

    w = window_stats(start, end, [(0.0, start), (1.0, middle), (2.0, end)], (0.0, 2.0))
    rows = {(r["name"], r["labels"].get("outcome")): r for r in w["policy"]}
    gauge = rows[("wattserve_adaptive_max_hold_seconds", None)]
    assert (gauge["min"], gauge["max"]) == (0.045, 0.09)
    assert gauge["mean"] == pytest.approx((0.09 + 0.045 + 0.045) / 3)
    assert rows[("wattserve_slo_requests_total", "met")]["delta"] == 3
    assert rows[("wattserve_slo_requests_total", "missed")]["delta"] == 1
    assert w["telemetry"] == []  # policy state is not device telemetry


def test_response_cache_hits_divide_the_energy_as_inferences_with_none_of_their_own() -> None:
    """nv_cache_num_hits_per_model (Triton's, untyped as the server exports it) counts requests
    answered without the engine: energy per inference is the window's energy over computed
    and cached inferences."""
    reg = CollectorRegistry()
    m = ServingMetrics("m", "dynamic", reg)
    energy = Counter("wattserve_energy_joules", "", ["device", "source", "state"], registry=reg)

    def text(hits: int) -> str:
        return generate_latest(reg).decode() + (
            "# HELP nv_cache_num_hits_per_model Number of cache hits per model\n"
            "# TYPE nv_cache_num_hits_per_model untyped\n"
            f'nv_cache_num_hits_per_model{{model="m",version="1"}} {hits}\n'
        )

    start = parse(text(5), "m")
    m.observe_batch(10, 0.01)
    energy.labels("gpu0", "nvml_counter", "busy").inc(30.0)
    energy.labels("gpu0", "nvml_counter", "idle").inc(10.0)
    end = parse(text(35), "m")
    w = window_stats(start, end)
    assert w["inferences"] == 10 and w["cached_inferences"] == 30
    assert w["energy_per_inference_j"] == pytest.approx(40.0 / 40)
    no_cache = window_stats(
        parse(generate_latest(reg).decode(), "m"), parse(generate_latest(reg).decode(), "m")
    )
    assert no_cache["cached_inferences"] is None  # no cache configured: no such series
