"""The dashboard's GPU and energy panels show data on a real Prometheus when the GPU is
simulated (WATTSERVE_SIMULATED_GPU): the same check as tests/test_prometheus_dashboard.py,
where without hardware those panels must stay empty, here every panel must have data (the
CPU's RAPL panel apart: RAPL is not metered beside a simulated GPU)."""

from __future__ import annotations

import threading
import time

import pytest
from wattserve.server.settings import Settings

from tests.dashboard_support import RATE_INTERVAL, drive_load, evaluate_dashboard, live_wattserve
from tests.prometheus_fixture import prometheus_factory  # noqa: F401 - the fixture


@pytest.mark.slow
def test_every_dashboard_panel_has_data_on_the_simulated_gpu(prometheus_factory, tmp_path):  # noqa: F811
    settings = Settings(model="identity", batcher="dynamic", max_batch_size=8, telemetry_interval_ms=200,
                        simulated_gpu="default", rapl_root=tmp_path / "none")  # fmt: skip
    with live_wattserve(settings) as target:
        stop, sent = threading.Event(), [0]
        loaders = [threading.Thread(target=drive_load, args=(target, stop, sent)) for _ in range(3)]
        for loader in loaders:
            loader.start()
        try:
            prom = prometheus_factory([target])
            prom.wait_until('up{job="wattserve"} == 1')
            prom.wait_until(
                f"sum(rate(wattserve_energy_inference_joules_count[{RATE_INTERVAL}])) > 0", timeout=60
            )
            while prom.scrapes() < 6:
                time.sleep(0.5)
            assert prom.query('wattserve_gpu_power_watts{gpu="simulated0",source="simulated"}')
            failures = evaluate_dashboard(prom)  # hardware present: every panel must have data
        finally:
            stop.set()
            for loader in loaders:
                loader.join(30)
    assert sent[0] > 0
    # RAPL is not metered beside the simulated GPU (real joules would mix with simulated ones)
    failures = [f for f in failures if not f.startswith("CPU package power (RAPL)")]
    assert not failures, "\n".join(failures)
