"""A CPU engine served on a GPU host is charged no GPU energy (live server, FakeNvml GPU).

The server's own wiring is under test: ModelRuntime asks telemetry for the meter of the
engine's device, and a CPU engine's batches must not be metered on the GPU's counter.
"""

from __future__ import annotations

import sys

import httpx
import numpy as np
from wattserve.server.settings import Settings

from support.doubles.fake_nvml import FakeGpu, FakeNvml
from tests.servers import threaded_server


def test_cpu_engine_on_a_gpu_host_is_charged_no_gpu_energy(monkeypatch, tmp_path):
    gpu = FakeGpu(power_w=80.0, busy_power_w=400.0, update_period_s=0.02)
    fake = FakeNvml([gpu], realtime=True)  # its counter steps with real time
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # what open_gpus imports
    settings = Settings(model="identity", identity_elements=4, identity_delay_ms=5.0,
                        rapl_root=tmp_path / "none", telemetry_interval_ms=50)  # fmt: skip
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                        "data": np.arange(4, dtype=np.float32).tolist()}]}  # fmt: skip
    with threaded_server(settings) as (url, app):
        assert app.state.telemetry.gpu_available
        assert app.state.runtime.engine.device == "cpu"
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(20):
                reply = client.post("/v2/models/identity/infer", json=body)
                assert reply.status_code == 200, reply.text
                assert "X-Energy-Joules" not in reply.headers  # no figure at response time
            app.state.telemetry.sampler.sample_once()
            metrics = client.get("/metrics").text
    books = {a.device: a for a in app.state.telemetry._ledger.snapshot()}
    assert books["gpu0"].busy == 0.0 and books["gpu0"].idle > 0
    assert 'wattserve_energy_joules_total{device="gpu0",source="nvml_counter",state="busy"} 0.0' in metrics
    assert "wattserve_energy_inference_joules_count{" not in metrics
    period = app.state.telemetry._ledger.windows(0).update_period_s
    assert period is not None and 0.015 < period < 0.03  # measured at start, real time
