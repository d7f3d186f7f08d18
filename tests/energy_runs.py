"""Load generator runs with energy figures, written by hand as ``window_stats`` would make
them from a GPU server's metrics (this machine has no GPU, so live runs never carry them):
for the tests of reports and plots that only appear with energy data."""

from __future__ import annotations

import math

from wattserve.loadgen.runner import LoadSpec, RunResult, summarize
from wattserve.loadgen.stats import RequestRecord


def fake_run(label: str, rate: float, latency_s: float, energy: float | None) -> RunResult:
    spec = LoadSpec("constant", rate=rate, warmup_s=0.0, duration_s=2.0)
    n = int(rate * 2)
    records = [
        RequestRecord(i, i / rate, i / rate, i / rate + latency_s * (1 + i % 5 / 10), "200") for i in range(n)
    ]
    server = {
        "inferences": float(n),
        "batch_executions": n / 2,
        "avg_batch_size": 2.0,
        "batch_size_histogram": [
            {"gt": None, "le": 1.0, "count": 0.0},
            {"gt": 1.0, "le": 2.0, "count": n / 2},
            {"gt": 2.0, "le": math.inf, "count": 0.0},
        ],
        "mean_queue_ms": 1.0,
        "mean_compute_ms": 2.0,
        "energy_per_inference_j": energy,
        "energy_source": "wattserve_energy_joules_total (busy + idle) over the window / inferences",
        "gpu_power_w": 250.0,
        "telemetry": [
            {"name": "wattserve_gpu_power_watts", "labels": {"gpu": "0", "source": "nvml_average"},
             "type": "gauge", "mean": 250.0, "min": 240.0, "max": 260.0},
            {"name": "wattserve_gpu_energy_joules_total", "labels": {"gpu": "0"},
             "type": "counter", "delta": 500.0, "per_inference": energy},
        ],
    }  # fmt: skip
    power = {"wattserve_gpu_power_watts{gpu=0,source=nvml_average}": [(0.0, 240.0), (1.0, 260.0)]}
    return RunResult(label, spec, {"url": "u", "model": "m"}, records, summarize(records, spec, n),
                     server, power, "now")  # fmt: skip
