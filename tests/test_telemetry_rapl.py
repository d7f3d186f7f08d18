"""RAPL (powercap) CPU package energy, against a sysfs-like tree the test builds."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService
from wattserve.telemetry.cumulative import RaplEnergy
from wattserve.telemetry.rapl import find_packages, unwrap_delta_uj

from support.doubles.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, FakeNvml
from tests.rapl_tree import make_zone, set_energy


def test_finds_package_zones_only(tmp_path):
    make_zone(tmp_path, "intel-rapl:0", "package-0", 1)
    make_zone(tmp_path, "intel-rapl:1", "package-1", 1)
    make_zone(tmp_path, "intel-rapl:0:0", "core", 1)  # a subzone: already inside package-0
    (tmp_path / "intel-rapl").mkdir()  # the control type folder
    domains, reason = find_packages(tmp_path)
    assert reason is None
    assert [d.name for d in domains] == ["package-0", "package-1"]


def test_missing_or_unreadable_tree_gives_a_reason(tmp_path):
    assert find_packages(tmp_path / "nope") == ([], f"{tmp_path / 'nope'} does not exist")
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 5)
    (zone / "energy_uj").unlink()
    (zone / "energy_uj").mkdir()  # reading it fails the way a root-only file does for others
    domains, reason = find_packages(tmp_path)
    assert domains == [] and "intel-rapl:0" in reason


def test_wraparound():
    assert unwrap_delta_uj(100, 250, 1000) == 150
    assert unwrap_delta_uj(900, 50, 1000) == 150  # 100 to the wrap, 50 after it


def test_rapl_energy_unwraps_into_monotonic_joules(tmp_path):
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 999_000_000, max_range=1_000_000_000)
    (domain,), _ = find_packages(tmp_path)
    energy = RaplEnergy(domain)
    assert energy.read_joules() == 0.0
    set_energy(zone, 999_500_000)
    assert energy.read_joules() == pytest.approx(0.5)
    set_energy(zone, 1_500_000)  # wrapped: 0.5 J to the top, 1.5 J after
    assert energy.read_joules() == pytest.approx(2.5)


def test_service_meters_rapl_when_there_is_no_gpu(tmp_path):
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 10_000_000)
    registry = CollectorRegistry()
    settings = Settings(telemetry_interval_ms=3_600_000, rapl_root=tmp_path)
    no_nvml = FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    clock = [0.0]
    service = TelemetryService(
        settings.telemetry_config(), registry, nvml=no_nvml, clock=lambda: clock[0], sleep=lambda s: None
    )
    service.start()
    try:
        get = registry.get_sample_value
        assert get("wattserve_gpu_telemetry_available") == 0
        assert get("wattserve_rapl_available") == 1
        meter = service.meter
        assert service.available and not service.gpu_available
        assert meter.source == "rapl" and meter.devices == ["package-0"]
        mark = meter.begin()
        clock[0] = 1.0
        set_energy(zone, 40_000_000)  # +30 J
        energy = meter.end(mark)
        assert energy.attributed_joules == pytest.approx(30.0) and energy.source == "rapl"
        clock[0] = 3.0
        set_energy(zone, 50_000_000)  # +10 J idle, over 2 s
        service.sampler.sample_once()
        assert get("wattserve_cpu_energy_joules_total", {"domain": "package-0", "source": "rapl"}) == (
            pytest.approx(40.0)
        )
        labels = {"device": "package-0", "source": "rapl"}
        assert get("wattserve_energy_joules_total", {**labels, "state": "busy"}) == pytest.approx(30)
        assert get("wattserve_energy_joules_total", {**labels, "state": "idle"}) == pytest.approx(10)
        assert get("wattserve_cpu_power_watts", {"domain": "package-0"}) == pytest.approx(40.0 / 3.0)
        # no GPU series at all
        assert get("wattserve_gpu_power_watts", {"gpu": "0", "source": "nvml_average"}) is None
    finally:
        service.stop()


def test_rapl_is_exported_beside_gpus_but_batches_are_metered_on_the_gpu(tmp_path):
    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    fake = FakeNvml([FakeGpu(power_w=100.0)])
    registry = CollectorRegistry()
    settings = Settings(telemetry_interval_ms=3_600_000, rapl_root=tmp_path)
    service = TelemetryService(
        settings.telemetry_config(), registry, nvml=fake, clock=fake.clock, sleep=fake.sleep
    )
    service.start()
    try:
        assert service.meter.source == "nvml_counter" and service.meter.devices == ["gpu0"]
        set_energy(zone, 7_000_000)
        service.sampler.sample_once()
        assert registry.get_sample_value(
            "wattserve_cpu_energy_joules_total", {"domain": "package-0", "source": "rapl"}
        ) == pytest.approx(7.0)
    finally:
        service.stop()
