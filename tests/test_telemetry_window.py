"""window_report: energy over [t0, t1] split busy/idle, and joules per inference."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService

from support.doubles.fake_nvml import NVML_ERROR_GPU_IS_LOST, FakeGpu, FakeNvml


@pytest.fixture
def rig():
    fake = FakeNvml([FakeGpu(power_w=100.0, uuid="a"), FakeGpu(power_w=50.0, uuid="b")])
    wall = lambda: 1_700_000_000.0 + fake.now  # noqa: E731 - a Unix-time view of fake time
    settings = Settings(telemetry_interval_ms=3_600_000, rapl_root="/nonexistent")
    service = TelemetryService(
        settings.telemetry_config(),
        CollectorRegistry(),
        nvml=fake,
        clock=fake.clock,
        wall_clock=wall,
        sleep=fake.sleep,
    )
    service.start()  # one tick at fake t=0
    yield fake, service, wall
    service.stop()


def run_batch(fake, service, size: int, seconds: float) -> None:
    mark = service.meter.begin()
    fake.advance(seconds)
    service.record_batch("m", "dynamic", size, service.meter.end(mark))


def test_window_energy_busy_idle_and_joules_per_inference(rig):
    fake, service, wall = rig
    tick = service.sampler.sample_once
    fake.advance(1.0)
    tick()  # t=1: window starts here
    t0 = wall()
    run_batch(fake, service, 4, 0.5)  # busy 75 J (150 W * 0.5 s)
    fake.advance(1.5)  # idle 225 J
    run_batch(fake, service, 2, 1.0)  # busy 150 J
    tick()  # t=4
    t1 = wall()
    fake.advance(5.0)
    run_batch(fake, service, 8, 1.0)  # after the window
    tick()

    report = service.window_report(t0, t1)
    assert report["available"] is True
    assert report["start"] == t0 and report["end"] == t1 and report["duration_s"] == 3.0
    assert report["sources"] == ["nvml_counter"] and report["source"] == "nvml_counter"
    assert report["devices"] == ["gpu0", "gpu1"]
    assert report["energy_joules"] == pytest.approx(450.0)
    assert report["busy_joules"] == pytest.approx(225.0)
    assert report["idle_joules"] == pytest.approx(225.0)
    assert report["average_power_watts"] == pytest.approx(150.0)
    assert report["inferences"] == 6 and report["batches"] == 2
    assert report["metered_inferences"] == 6
    assert report["attributed_joules"] == pytest.approx(225.0)
    assert report["joules_per_inference"] == pytest.approx(75.0)
    assert report["busy_joules_per_inference"] == pytest.approx(37.5)
    assert report["stale_devices"] == [] and report["ticks"] == 2


def test_window_without_two_ticks_has_no_figures(rig):
    fake, service, wall = rig
    fake.advance(1.0)
    report = service.window_report(wall() - 0.5, wall())
    assert report["energy_joules"] is None and report["joules_per_inference"] is None
    assert report["ticks"] == 0 and "fewer than two" in report["reason"]


def test_window_lists_devices_that_failed_inside_it(rig):
    fake, service, wall = rig
    t0 = wall()
    fake.gpus[1].failing = NVML_ERROR_GPU_IS_LOST
    fake.advance(1.0)
    service.sampler.sample_once()
    fake.gpus[1].failing = None
    fake.advance(1.0)
    service.sampler.sample_once()
    report = service.window_report(t0, wall())
    assert report["stale_devices"] == ["gpu1"]
    # the failing GPU's gap is booked when it answers again, so the total stays whole
    assert report["energy_joules"] == pytest.approx(300.0)


def test_response_cache_hits_count_as_inferences_with_zero_engine_energy(rig):
    """The same window as above, plus 6 requests' rows answered from the response cache: no
    batch ran for them, so the energy stays 450 J and joules per inference halves."""
    fake, service, wall = rig
    tick = service.sampler.sample_once
    fake.advance(1.0)
    tick()
    t0 = wall()
    run_batch(fake, service, 4, 0.5)
    fake.advance(1.5)
    run_batch(fake, service, 2, 1.0)
    service.record_cached(6)
    tick()
    report = service.window_report(t0, wall())
    assert report["energy_joules"] == pytest.approx(450.0) and report["busy_joules"] == pytest.approx(225.0)
    assert report["inferences"] == 6 and report["cached_inferences"] == 6 and report["batches"] == 2
    assert report["joules_per_inference"] == pytest.approx(37.5)  # 450 J / 12
    assert report["busy_joules_per_inference"] == pytest.approx(18.75)
