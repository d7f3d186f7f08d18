"""Triton's Prometheus names beside wattserve's own (docs/user_guide/metrics.md).

Where each behaviour comes from:
- per model, labels ``model`` and ``version``: nv_inference_request_success,
  nv_inference_request_failure (plus ``reason``: REJECTED, CANCELED, BACKEND, OTHER),
  nv_inference_count, nv_inference_exec_count, the cumulative ``*_duration_us`` counters in
  microseconds, nv_inference_pending_request_count: metrics.md "Inference Request Metrics";
  the failure line's label set as qa/L0_model_queue/model_queue_test.py matches it.
- per GPU, label ``gpu_uuid``: nv_gpu_utilization, nv_gpu_power_usage, nv_gpu_power_limit,
  nv_energy_consumption, nv_gpu_memory_total_bytes, nv_gpu_memory_used_bytes: metrics.md
  "GPU Metrics" (qa/L0_metrics/test.sh greps ``nv_gpu_utilization{``). Absent without NVML.
- nv_cpu_utilization, nv_cpu_memory_total_bytes, nv_cpu_memory_used_bytes: "CPU Metrics".
"""

from __future__ import annotations

import types

import httpx
import numpy as np
import tritonclient.http as thttp
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from wattserve.server.extensions.triton_metrics import TritonMetrics
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService

from support.doubles.fake_nvml import FakeGpu, FakeNvml
from tests.conformance.tiny_models import write_model
from tests.servers import threaded_server

MODEL_FAMILIES = [
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
]  # fmt: skip
GPU_FAMILIES = ["nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption",
                "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"]  # fmt: skip


def scrape(url: str) -> dict[str, list]:
    text = httpx.get(url + "/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text) if f.name.startswith("nv_")}


def value(samples: list, **labels: str) -> float:
    (found,) = [s.value for s in samples if s.labels == labels]
    return found


def test_model_families_count_what_was_served(tmp_path):
    write_model(tmp_path, "m")
    settings = Settings(model_repository=tmp_path, torch_threads=1, telemetry=False, warmup=False)
    with threaded_server(settings) as (url, _):
        client = thttp.InferenceServerClient(url.removeprefix("http://"))
        before = scrape(url)
        assert set(MODEL_FAMILIES) <= set(before)
        assert not set(GPU_FAMILIES) & set(before), "no NVML here: no GPU figure may appear"
        assert {"nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"} <= set(before)
        labels = {"model": "m", "version": "1"}
        assert value(before["nv_inference_request_success"], **labels) == 0
        reasons = {s.labels["reason"] for s in before["nv_inference_request_failure"]}
        assert reasons == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}

        for rows in (1, 3, 2):
            tensor = thttp.InferInput("INPUT0", [rows, 4], "FP32")
            tensor.set_data_from_numpy(np.zeros((rows, 4), np.float32))
            client.infer("m", [tensor])
        bad = httpx.post(url + "/v2/models/m/infer", json={"inputs": [{"name": "NOPE", "shape": [1, 4],
                                                                       "datatype": "FP32", "data": [0] * 4}]})  # fmt: skip
        assert bad.status_code == 400
        after = scrape(url)
        assert value(after["nv_inference_request_success"], **labels) == 3
        assert value(after["nv_inference_count"], **labels) == 6  # rows, as Triton counts
        assert 1 <= value(after["nv_inference_exec_count"], **labels) <= 3
        assert value(after["nv_inference_request_failure"], **labels, reason="OTHER") == 1
        assert value(after["nv_inference_request_failure"], **labels, reason="BACKEND") == 0
        # the exact line qa/L0_model_queue/model_queue_test.py looks for in the text
        text = httpx.get(url + "/metrics").text
        assert 'nv_inference_request_failure{model="m",reason="OTHER",version="1"} 1.0' in text
        assert (
            "# TYPE nv_inference_count untyped" in text
            and 'nv_inference_count{model="m",version="1"} 6.0' in text
        )
        request_us = value(after["nv_inference_request_duration_us"], **labels)
        infer_us = value(after["nv_inference_compute_infer_duration_us"], **labels)
        assert 0 < infer_us <= request_us < 60e6  # microseconds: positive, well under a minute
        assert value(after["nv_inference_pending_request_count"], **labels) == 0
        assert 0 <= value(after["nv_cpu_utilization"]) <= 1
        assert 0 < value(after["nv_cpu_memory_used_bytes"]) < value(after["nv_cpu_memory_total_bytes"])


def test_gpu_families_come_from_the_telemetry_with_gpu_uuid_labels():
    """NVML is a test double here (support/doubles/fake_nvml.py); the real path runs on a GPU."""
    fake = FakeNvml([FakeGpu(power_w=123.0, average_power_w=120.0, uuid="GPU-abc")])
    registry = CollectorRegistry()
    settings = Settings(telemetry_interval_ms=3_600_000, rapl_root="/nonexistent")
    telemetry = TelemetryService(
        settings.telemetry_config(), registry, nvml=fake, clock=fake.clock, sleep=fake.sleep
    )
    models = types.SimpleNamespace(entries=lambda: [])
    registry.register(TritonMetrics(models, telemetry))
    telemetry.start()
    try:
        get = registry.get_sample_value
        uuid = {"gpu_uuid": "GPU-abc"}
        assert get("nv_gpu_power_usage", uuid) == 120.0  # NVML's power usage (average), as Triton
        assert get("nv_gpu_power_limit", uuid) == 700.0
        assert get("nv_gpu_utilization", uuid) == 0.5
        assert get("nv_gpu_memory_total_bytes", uuid) == 141 * 2**30
        assert get("nv_gpu_memory_used_bytes", uuid) == 10 * 2**30
        energy = get("nv_energy_consumption", uuid)
        assert energy is not None and energy == get(
            "wattserve_gpu_energy_joules_total", {"gpu": "0", "source": "nvml_counter"}
        )
    finally:
        telemetry.stop()
    registry_without = CollectorRegistry()
    registry_without.register(TritonMetrics(models, types.SimpleNamespace(gpu_available=False)))
    assert registry_without.get_sample_value("nv_gpu_utilization", {"gpu_uuid": "GPU-abc"}) is None
