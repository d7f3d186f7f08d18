"""The sampler thread and the exported metrics, against the FakeNvml test double."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService

from support.doubles.fake_nvml import NVML_ERROR_GPU_IS_LOST, FakeGpu, FakeNvml


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def make(fake: FakeNvml, interval_ms: float = 5.0) -> tuple[TelemetryService, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = Settings(telemetry_interval_ms=interval_ms, rapl_root="/nonexistent")
    return TelemetryService(
        settings.telemetry_config(), registry, nvml=fake, clock=fake.clock, sleep=fake.sleep
    ), registry


def test_gauges_in_base_units_and_labelled_power_sources():
    fake = FakeNvml(
        [
            FakeGpu(power_w=123.0, average_power_w=120.0),
            FakeGpu(power_w=50.0, has_energy_counter=False, has_instant_power=False),
        ]
    )
    service, registry = make(fake, interval_ms=3_600_000)  # one sample, at start
    service.start()
    try:
        get = registry.get_sample_value
        assert get("wattserve_gpu_telemetry_available") == 1
        assert get("wattserve_gpu_power_watts", {"gpu": "0", "source": "nvml_average"}) == 120.0
        assert get("wattserve_gpu_power_watts", {"gpu": "0", "source": "nvml_instant"}) == 123.0
        # GPU 1 has no instant field: that series is absent, not zero
        assert get("wattserve_gpu_power_watts", {"gpu": "1", "source": "nvml_instant"}) is None
        assert get("wattserve_gpu_power_watts", {"gpu": "1", "source": "nvml_average"}) == 50.0
        assert get("wattserve_gpu_power_limit_watts", {"gpu": "0"}) == 700.0
        assert get("wattserve_gpu_utilization_ratio", {"gpu": "0"}) == 0.5
        assert get("wattserve_gpu_memory_utilization_ratio", {"gpu": "0"}) == 0.2
        assert get("wattserve_gpu_memory_used_bytes", {"gpu": "0"}) == 10 * 2**30
        assert get("wattserve_gpu_memory_total_bytes", {"gpu": "0"}) == 141 * 2**30
        assert get("wattserve_gpu_sm_clock_hertz", {"gpu": "0"}) == 1980e6
        assert get("wattserve_gpu_temperature_celsius", {"gpu": "0"}) == 45.0
        assert get("wattserve_gpu_stale", {"gpu": "0"}) == 0
        assert get("wattserve_energy_meter_read_duration_seconds", {"source": "nvml_power_integrated"}) > 0
        assert get("wattserve_telemetry_sample_duration_seconds_count") >= 1
        # the energy counters carry their source label (a few simulated ms were read at start,
        # measuring the counter's update period)
        assert get("wattserve_gpu_energy_joules_total", {"gpu": "0", "source": "nvml_counter"}) < 1.0
        assert get("wattserve_gpu_energy_joules_total", {"gpu": "1", "source": "nvml_power_integrated"}) < 1.0
        assert "meter nvml_power_integrated over gpu0,gpu1" in service.describe()
    finally:
        service.stop()


def test_unsupported_readings_are_absent_not_zero_and_not_stale():
    """E.g. utilization under MIG: that series is missing; the GPU is still sampled."""
    fake = FakeNvml([FakeGpu(unsupported={"utilization", "temperature"})])
    service, registry = make(fake, interval_ms=3_600_000)
    service.start()
    try:
        get = registry.get_sample_value
        assert get("wattserve_gpu_utilization_ratio", {"gpu": "0"}) is None
        assert get("wattserve_gpu_memory_utilization_ratio", {"gpu": "0"}) is None
        assert get("wattserve_gpu_temperature_celsius", {"gpu": "0"}) is None
        assert get("wattserve_gpu_power_watts", {"gpu": "0", "source": "nvml_average"}) == 100.0
        assert get("wattserve_gpu_stale", {"gpu": "0"}) == 0
    finally:
        service.stop()


def test_energy_counter_and_busy_idle_follow_the_gpu():
    fake = FakeNvml([FakeGpu(power_w=100.0)])
    service, registry = make(fake, interval_ms=3_600_000)
    service.start()
    try:
        meter, sampler = service.meter, service.sampler
        fake.advance(2.0)  # idle 200 J
        mark = meter.begin()
        fake.advance(1.0)  # busy 100 J
        meter.end(mark)
        fake.advance(1.0)  # idle 100 J
        sampler.sample_once()
        get = registry.get_sample_value
        # + under 1 J of idle while the update period was measured at start
        assert get("wattserve_gpu_energy_joules_total", {"gpu": "0", "source": "nvml_counter"}) == (
            pytest.approx(400.0, abs=1.0)
        )
        labels = {"device": "gpu0", "source": "nvml_counter"}
        assert get("wattserve_energy_joules_total", {**labels, "state": "busy"}) == pytest.approx(100)
        assert get("wattserve_energy_joules_total", {**labels, "state": "idle"}) == pytest.approx(
            300, abs=1.0
        )
    finally:
        service.stop()


def test_gpu_error_mid_run_marks_it_stale_and_the_sampler_survives():
    fake = FakeNvml([FakeGpu(power_w=100.0, uuid="a"), FakeGpu(power_w=200.0, uuid="b")])
    service, registry = make(fake, interval_ms=5.0)
    get = registry.get_sample_value
    power1 = {"gpu": "1", "source": "nvml_average"}
    service.start()
    try:
        sampler = service.sampler
        wait_for(lambda: sampler.samples >= 3)
        assert get("wattserve_gpu_power_watts", power1) == 200.0

        fake.gpus[1].failing = NVML_ERROR_GPU_IS_LOST
        wait_for(lambda: get("wattserve_gpu_stale", {"gpu": "1"}) == 1)
        # its gauges are withdrawn, so Prometheus marks them stale instead of scraping old values
        wait_for(lambda: get("wattserve_gpu_power_watts", power1) is None)
        assert get("wattserve_gpu_utilization_ratio", {"gpu": "1"}) is None
        text = generate_latest(registry).decode()
        assert 'wattserve_gpu_temperature_celsius{gpu="1"}' not in text

        # the thread is alive and GPU 0 keeps being sampled
        before = sampler.samples
        fake.gpus[0].power_w = 150.0
        wait_for(lambda: sampler.samples >= before + 3)
        assert sampler.running
        # (the instant reading: the 1 s average follows only as simulated time passes)
        wait_for(lambda: get("wattserve_gpu_power_watts", {"gpu": "0", "source": "nvml_instant"}) == 150.0)
        assert get("wattserve_gpu_stale", {"gpu": "0"}) == 0
        assert get("wattserve_gpu_sample_errors_total", {"gpu": "1"}) >= 1
        # a batch spanning the failing GPU has no figure
        mark = service.meter.begin()
        fake.advance(0.01)
        span = service.meter.end(mark)
        fake.advance(0.01)
        service.poll_once()  # gpu0's window closes too
        assert span.final and span.attributed_joules is None

        fake.gpus[1].failing = None  # it recovers
        wait_for(lambda: get("wattserve_gpu_stale", {"gpu": "1"}) == 0)
        wait_for(lambda: get("wattserve_gpu_power_watts", power1) == 200.0)
    finally:
        service.stop()


@pytest.mark.serial  # a wall-clock bound: stop < 5 s
def test_stop_is_prompt_even_with_a_long_interval():
    fake = FakeNvml()
    service, _ = make(fake, interval_ms=60_000)
    service.start()
    sampler = service.sampler
    assert sampler.running
    started = time.monotonic()
    service.stop()
    elapsed = time.monotonic() - started
    assert not sampler.running
    assert elapsed < 5.0, f"stop took {elapsed:.2f} s with a 60 s interval"
    assert not fake.initialized  # nvmlShutdown was called


def test_telemetry_disabled_by_settings_touches_no_nvml():
    fake = FakeNvml()
    registry = CollectorRegistry()
    service = TelemetryService(Settings(telemetry=False).telemetry_config(), registry, nvml=fake)
    service.start()
    assert not fake.initialized and service.meter is None and not service.available
    assert registry.get_sample_value("wattserve_gpu_telemetry_available") == 0
    service.stop()
