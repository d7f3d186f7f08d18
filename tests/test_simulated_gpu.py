"""The simulated GPU (WATTSERVE_SIMULATED_GPU): its power model, its counter, and the real
telemetry path (NVML layer, ledger, window attribution, sampler, metrics) on top of it, on a
manual clock so every figure is exact. Every series it produces must say "simulated"."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService
from wattserve.telemetry.simulated_gpu import BUILTIN_MODELS, PowerModel, SimulatedNvml, load_power_model

from tests.simulated_telemetry import ManualClock, simulated_service

MODEL = PowerModel(
    name="t", idle_watts=50.0, busy_watts=100.0, watts_per_item=10.0, counter_update_period_s=0.1
)


def started(model: PowerModel = MODEL) -> tuple[TelemetryService, ManualClock, CollectorRegistry]:
    clock = ManualClock()
    registry = CollectorRegistry()
    service = simulated_service(model, clock, registry)
    service.start()
    return service, clock, registry


def run(service: TelemetryService, clock: ManualClock, seconds: float, tick: float = 0.001) -> None:
    """Let time pass with the energy poller reading every ``tick`` (as its thread would)."""
    for _ in range(round(seconds / tick)):
        clock.sleep(tick)
        service.poll_once()


def test_power_model_formula() -> None:
    m = MODEL
    assert m.batch_watts(4) == 50 + 100 + 40
    assert m.watts(4, 0.5) == pytest.approx(50 + 0.5 * 140)
    assert m.watts(4, 0.0) == 50
    assert PowerModel(max_watts=100.0, idle_watts=50.0).batch_watts(1000) == 100.0  # the power limit


def test_power_model_from_name_or_file(tmp_path) -> None:
    assert load_power_model("default") is BUILTIN_MODELS["default"]
    toml = tmp_path / "h100ish.toml"
    toml.write_text("idle_watts = 90\nwatts_per_item = 3.5\ncounter_update_period_s = 0.02\n")
    loaded = load_power_model(str(toml))
    assert (loaded.name, loaded.idle_watts, loaded.watts_per_item) == ("h100ish", 90.0, 3.5)
    js = tmp_path / "m.json"
    js.write_text(json.dumps({"idle_watts": 10, "power_average_window_s": 0.5}))
    assert load_power_model(str(js)).power_average_window_s == 0.5
    bad = tmp_path / "bad.toml"
    bad.write_text("idle_wats = 3\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_power_model(str(bad))
    with pytest.raises(ValueError, match="not a built-in"):
        load_power_model("h200")
    with pytest.raises(ValueError, match="No such file"):
        load_power_model(str(tmp_path / "missing.json"))


def test_setting_refuses_a_bad_power_model() -> None:
    assert Settings(simulated_gpu="superlinear").telemetry_config().simulated_gpu == "superlinear"
    with pytest.raises(ValueError, match="not a built-in"):
        Settings(simulated_gpu="nope")


def test_a_batch_is_charged_its_power_model_energy_and_labelled_simulated() -> None:
    service, clock, registry = started()
    assert service.simulated and service.gpu_available and "SIMULATED" in service.describe()
    # the idle baseline was learned while measuring the counter's cadence
    meter = service.meter_for("cpu")  # a CPU engine is metered on the simulated device
    assert meter is service.meter_for("cuda:0") and meter is not None and meter.source == "simulated"
    span = meter.begin()
    run(service, clock, 0.03)
    meter.end(span)
    service.record_batch("m", "dynamic", 4, span)  # the size reaches the device
    run(service, clock, 0.2)  # past the next counter step
    assert span.final
    # busy = what the device drew while the batch ran, batch_watts(4) = 50 + 100 + 10 * 4 W,
    # for 0.03 s (the step's moment is known to within a poll: the idle baseline over the
    # window is off by at most that much)
    assert span.attributed_joules == pytest.approx(MODEL.batch_watts(4) * 0.03, rel=0.02)

    # a bigger batch draws more: energy follows the batch size given after it ran
    span2 = meter.begin()
    run(service, clock, 0.03)
    meter.end(span2)
    service.record_batch("m", "dynamic", 10, span2)
    run(service, clock, 0.2)
    assert span2.attributed_joules == pytest.approx(MODEL.batch_watts(10) * 0.03, rel=0.02)

    service._sampler.sample_once()  # type: ignore[union-attr]
    text = _scrape(registry)
    assert 'wattserve_gpu_energy_joules_total{gpu="simulated0",source="simulated"}' in text
    assert 'wattserve_gpu_power_watts{gpu="simulated0",source="simulated"}' in text
    assert 'wattserve_gpu_utilization_ratio{gpu="simulated0"}' in text
    assert 'wattserve_energy_batch_joules_count{batcher="dynamic",model="m",source="simulated"} 2.0' in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    for line in samples:  # nothing poses as a measurement
        if 'source="' in line:
            assert 'source="simulated"' in line, line
        if 'gpu="' in line or 'device="' in line:
            assert 'gpu="simulated0"' in line or 'device="simulated-gpu0"' in line, line
    assert not any(line.startswith("wattserve_cpu_") for line in samples)  # RAPL not beside it
    assert 'name="Simulated GPU' in text
    report = service.window_report(0, 1e9)
    assert report["simulated"] is True and report["source"] == "simulated"
    service.stop()


def test_power_average_and_utilization_follow_busy_time() -> None:
    nvml = SimulatedNvml(MODEL, clock=(clock := ManualClock()))
    gpu = nvml.gpus[0]
    busy = gpu.busy_begin()
    clock.sleep(0.25)
    gpu.busy_end(busy)
    gpu.set_size(busy, 2)
    clock.sleep(0.75)  # 25% of the last second busy at batch 2
    assert gpu.utilization == 25
    assert gpu.moving_average_w(clock.now) == pytest.approx(MODEL.watts(2, 0.25))
    assert gpu.current_power_w == MODEL.idle_watts


def test_a_counter_step_waits_briefly_for_a_batch_size() -> None:
    """A step right after a batch ended, before its record arrived, must not charge it at the
    wrong size; after SIZE_WAIT_S it goes ahead at the last size seen."""
    clock = ManualClock()
    nvml = SimulatedNvml(MODEL, clock=clock)
    gpu = nvml.gpus[0]
    clock.sleep(0.05)
    busy = gpu.busy_begin()
    clock.sleep(0.04)
    gpu.busy_end(busy)
    clock.sleep(0.02)  # a step (t=0.1) has passed; the size is not known yet
    before = gpu.counter_reading_mj()
    assert before == 0
    gpu.set_size(busy, 5)
    after = gpu.counter_reading_mj()
    assert after == pytest.approx((50.0 * 0.1 + 150.0 * 0.04) * 1000, abs=1)  # idle + the batch above it


def _scrape(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


def test_live_server_meters_the_identity_model_on_the_simulated_gpu(tmp_path) -> None:
    """WATTSERVE_SIMULATED_GPU on a real server: the identity model's batches are metered on
    the simulated device through the real sampler, poller and windows; /metrics says simulated."""
    import re
    import time

    import httpx
    import numpy as np

    from tests.servers import threaded_server

    settings = Settings(model="identity", identity_elements=4, identity_delay_ms=5.0, simulated_gpu="default",
                        rapl_root=tmp_path / "none", telemetry_interval_ms=50)  # fmt: skip
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                        "data": np.arange(4, dtype=np.float32).tolist()}]}  # fmt: skip
    with threaded_server(settings) as (url, app):
        telemetry = app.state.telemetry
        assert telemetry.simulated and telemetry.meter_for("cpu") is not None
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(20):
                assert client.post("/v2/models/identity/infer", json=body).status_code == 200
            time.sleep(0.3)  # a few counter steps: every batch's window closes
            metrics = client.get("/metrics").text
    count = re.search(
        r'wattserve_energy_inference_joules_count\{batcher="dynamic",model="identity",source="simulated"\} (\S+)',
        metrics,
    )
    assert count is not None and float(count.group(1)) >= 15, metrics  # a late window may still be open
    assert re.search(r'wattserve_gpu_power_watts\{gpu="simulated0",source="simulated"\} [1-9]', metrics)
    assert 'wattserve_energy_joules_total{device="simulated-gpu0",source="simulated",state="busy"}' in metrics
    assert "wattserve_gpu_telemetry_available 1.0" in metrics


def test_loadgen_report_opens_with_the_simulation_banner(tmp_path) -> None:
    """A report of figures from the simulated GPU says so on its first line; a measured one does not."""
    from wattserve.loadgen import htmlreport, report

    from tests.energy_runs import fake_run

    measured = fake_run("m", 20, 0.010, 2.0)
    simulated = fake_run("s", 20, 0.010, 2.0)
    simulated.server["telemetry"][0]["labels"]["source"] = "simulated"  # type: ignore[index]
    assert not htmlreport.is_simulated([measured]) and htmlreport.is_simulated([measured, simulated])
    report.write_all(tmp_path / "sim", [simulated], "sim", per_request_csv=False)
    body = (tmp_path / "sim" / "report.html").read_text().split("<body>", 1)[1]
    assert body.lstrip().startswith('<p class="note"><b>SIMULATED GPU')
    report.write_all(tmp_path / "real", [measured], "real", per_request_csv=False)
    assert "SIMULATED" not in (tmp_path / "real" / "report.html").read_text()
