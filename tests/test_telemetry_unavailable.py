"""Without a GPU (and without RAPL) nothing is measured and nothing is made up."""

from __future__ import annotations

import logging
import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService
from wattserve.telemetry.metrics import needs_energy_hardware

from support.doubles.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeNvml

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", re.M)


def exported_samples(registry: CollectorRegistry) -> dict[str, list[str]]:
    text = generate_latest(registry).decode()
    found: dict[str, list[str]] = {}
    for name, _labels, value in SAMPLE.findall(text):
        found.setdefault(name, []).append(value)
    return found


def check_nothing_measured(service: TelemetryService, registry: CollectorRegistry) -> None:
    assert not service.available and not service.gpu_available and service.meter is None
    samples = exported_samples(registry)
    assert samples["wattserve_gpu_telemetry_available"] == ["0.0"]
    assert samples["wattserve_rapl_available"] == ["0.0"]
    hardware = sorted(n for n in samples if needs_energy_hardware(n))
    assert hardware == [], f"figures exported without hardware: {hardware}"
    assert not [n for n in samples if n.endswith(("_watts", "_joules_total", "_joules_sum"))]
    # record_batch with no energy observes nothing
    service.record_batch("identity", "dynamic", 8, None)
    assert not [n for n in exported_samples(registry) if needs_energy_hardware(n)]
    report = service.window_report(0.0, 1e12)
    assert report["available"] is False
    assert report["energy_joules"] is None and report["joules_per_inference"] is None
    assert "GPU:" in report["reason"]


def test_nvml_library_missing(tmp_path, caplog):
    registry = CollectorRegistry()
    service = TelemetryService(
        Settings(rapl_root=tmp_path).telemetry_config(),
        registry,
        nvml=FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND),
    )
    with caplog.at_level(logging.INFO, logger="wattserve.telemetry"):
        service.start()
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "wattserve.telemetry"]
        assert len(lines) == 1, lines
        assert "telemetry unavailable" in lines[0] and "LibraryNotFound" in lines[0]
        assert service.sampler is None  # no thread when there is nothing to sample
        check_nothing_measured(service, registry)
    finally:
        service.stop()


def test_real_pynvml_on_this_machine(tmp_path):
    """The real nvidia-ml-py: where NVML cannot initialise, the service says so."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine; this test is about machines without it")
    registry = CollectorRegistry()
    service = TelemetryService(Settings(rapl_root=tmp_path / "no-powercap").telemetry_config(), registry)
    service.start()
    try:
        assert service.gpu_reason.startswith("nvmlInit failed")
        check_nothing_measured(service, registry)
    finally:
        service.stop()


def test_hardware_metric_names():
    assert needs_energy_hardware("wattserve_gpu_power_watts")
    assert needs_energy_hardware("wattserve_energy_inference_joules_sum")
    assert needs_energy_hardware("wattserve_cpu_energy_joules_total")
    assert not needs_energy_hardware("wattserve_gpu_telemetry_available")
    assert not needs_energy_hardware("wattserve_requests_total")
    assert not needs_energy_hardware("wattserve_telemetry_sample_duration_seconds_count")
