"""Triton's GPU families (``nv_gpu_*``, ``nv_energy_consumption``) on the simulated GPU: the
same names and ``gpu_uuid`` label as on NVML, plus ``source="simulated"`` on every series, so
a Triton dashboard reading them cannot take a power model's figure for a measurement."""

from __future__ import annotations

import types

from prometheus_client import CollectorRegistry
from wattserve.server.extensions.triton_metrics import TritonMetrics
from wattserve.telemetry.simulated_gpu import PowerModel

from tests.simulated_telemetry import ManualClock, simulated_service

FAMILIES = ("nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_gpu_memory_total_bytes",
            "nv_gpu_memory_used_bytes", "nv_energy_consumption")  # fmt: skip


def test_nv_gpu_families_are_labelled_simulated() -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    model = PowerModel(name="t", idle_watts=50.0, counter_update_period_s=0.1)
    telemetry = simulated_service(model, clock, registry, rapl_root="/nonexistent")
    registry.register(TritonMetrics(types.SimpleNamespace(entries=lambda: []), telemetry))
    telemetry.start()
    try:
        for _ in range(2000):  # 2 s of idle device, the poller reading every ms
            clock.sleep(0.001)
            telemetry.poll_once()
        samples = {
            s.name: s.labels
            for family in registry.collect()
            for s in family.samples
            if s.name.startswith(("nv_gpu_", "nv_energy"))
        }
        assert set(samples) == set(FAMILIES)
        for name, labels in samples.items():
            assert labels == {"gpu_uuid": "GPU-simulated-0000", "source": "simulated"}, name
        get = registry.get_sample_value
        labels = {"gpu_uuid": "GPU-simulated-0000", "source": "simulated"}
        assert get("nv_gpu_power_usage", labels) == get(
            "wattserve_gpu_power_watts", {"gpu": "simulated0", "source": "simulated"}
        )
        assert get("nv_gpu_power_usage", labels) == 50.0  # idle: the power model's idle watts
        assert get("nv_gpu_power_limit", labels) == model.max_watts
        energy = get("nv_energy_consumption", labels)
        assert energy is not None and 0 < energy <= 100.0  # at most 2 s at 50 W
        assert energy == get(
            "wattserve_gpu_energy_joules_total", {"gpu": "simulated0", "source": "simulated"}
        )
        assert get("nv_gpu_power_usage", {"gpu_uuid": "GPU-simulated-0000"}) is None  # never unlabelled
    finally:
        telemetry.stop()
