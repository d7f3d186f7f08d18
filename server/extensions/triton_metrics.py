"""Triton's Prometheus names (``nv_*``) beside wattserve's own, computed at scrape time.

Model Analyzer and the Grafana dashboards Triton users already run read Triton's families
(docs/user_guide/metrics.md). This collector derives them when ``/metrics`` is scraped from
what wattserve already keeps: each model's ``ModelStatistics`` (the statistics extension's
numbers), its outcome counters and queue, and the telemetry's last NVML sample, so a
request pays nothing for them. Triton's units and labels: durations are cumulative
microseconds; per-model families carry ``model`` and ``version`` (failures also ``reason``);
GPU families carry ``gpu_uuid``.

Two differences, both forced by the exposition library: the cumulative families are exposed
as ``untyped``, not ``counter``, because prometheus_client names every counter ``*_total``
and Triton's names have no suffix (queries such as ``rate(nv_inference_count[1m])`` work
the same); and the GPU families appear only where NVML answered: without a GPU there is no
``nv_gpu_*`` or ``nv_energy_consumption`` series at all, never a made-up figure. On the
simulated GPU (``WATTSERVE_SIMULATED_GPU``) they are exported with one label more,
``source="simulated"`` (and its ``gpu_uuid`` is ``GPU-simulated-NNNN``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Triton's failure reasons <- wattserve's request outcomes
FAILURE_REASONS = {
    "REJECTED": ("timeout", "queue_timeout"),  # a queue timeout expired in the scheduler
    "CANCELED": ("cancelled",),
    "BACKEND": ("error",),  # the engine failed the batch
    "OTHER": ("bad_request", "queue_full", "draining"),
}
# Triton's duration counters <- the statistics extension's inference_stats keys
_CACHED = "(includes cached requests)"
_NOT_CACHED = "(does not include cached requests)"
DURATIONS = {  # name -> (inference_stats key, help)
    "nv_inference_request_duration_us": ("success", "inference request duration", _CACHED),
    "nv_inference_queue_duration_us": ("queue", "inference queuing duration", _CACHED),
    "nv_inference_compute_input_duration_us": ("compute_input", "compute input duration", _NOT_CACHED),
    "nv_inference_compute_infer_duration_us": ("compute_infer", "compute inference duration", _NOT_CACHED),
    "nv_inference_compute_output_duration_us": (
        "compute_output",
        "inference compute output duration",
        _NOT_CACHED,
    ),
}
MODEL_LABELS = ["model", "version"]


def _cumulative(name: str, documentation: str) -> Metric:
    return Metric(name, documentation, "unknown")


class TritonMetrics(Collector):
    """``registry.register(TritonMetrics(models, telemetry))``: the ``nv_*`` families."""

    def __init__(
        self, models: Any, telemetry: Any = None, proc: Path = Path("/proc"), cache: Any = None
    ) -> None:
        self.models = models
        self.cache = cache  # the response cache: its nv_cache_* families only when one is configured
        self.telemetry = telemetry
        self.proc = proc
        self._cpu_last = _cpu_times(proc)  # utilization is over the time since the last scrape

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on the hardware present: no registry-time collision checks

    def collect(self) -> Iterator[Metric]:
        yield from self._models()
        yield from self._gpus()
        yield from self._cpu()

    # ------------------------------------------------------------------ per model
    def _models(self) -> Iterator[Metric]:
        success = _cumulative("nv_inference_request_success",
                              "Number of successful inference requests, all batch sizes")  # fmt: skip
        failure = _cumulative(
            "nv_inference_request_failure", "Number of failed inference requests, all batch sizes"
        )
        count = _cumulative(
            "nv_inference_count", "Number of inferences performed (does not include cached requests)"
        )
        execs = _cumulative("nv_inference_exec_count", f"Number of model executions performed {_NOT_CACHED}")
        durations = {
            name: _cumulative(name, f"Cumulative {what} in microseconds {cached}")
            for name, (_, what, cached) in DURATIONS.items()
        }
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=MODEL_LABELS)  # fmt: skip
        for entry in self.models.entries():
            runtime = entry.runtime
            if runtime is None:  # unloaded or failed: Triton drops its series
                continue
            labels = {"model": entry.name, "version": entry.version}
            doc = runtime.metrics.statistics.triton(entry.name, entry.version)
            stats = doc["inference_stats"]
            success.add_sample("nv_inference_request_success", labels, stats["success"]["count"])
            for reason, outcomes in FAILURE_REASONS.items():
                value = sum(runtime.metrics.count(o) for o in outcomes)
                # labels in Triton's (sorted) order: QA tests match the exposition text
                failure_labels = {"model": entry.name, "reason": reason, "version": entry.version}
                failure.add_sample("nv_inference_request_failure", failure_labels, value)
            count.add_sample("nv_inference_count", labels, doc["inference_count"])
            execs.add_sample("nv_inference_exec_count", labels, doc["execution_count"])
            for name, (key, _, _) in DURATIONS.items():
                durations[name].add_sample(name, labels, stats[key]["ns"] // 1000)
            batcher = runtime.batcher
            pending.add_metric([entry.name, entry.version], batcher.queue_depth if batcher is not None else 0)
        yield from (success, failure, count, execs, *durations.values(), pending)
        if self.cache is not None:
            yield from self._cache_families()

    def _cache_families(self) -> Iterator[Metric]:
        """Triton's per-model response cache counters (cumulative microseconds), from the
        statistics' ``cache_hit`` / ``cache_miss``; as Triton, only with a cache configured."""
        families = [
            (_cumulative(name, help_), key, field)
            for name, help_, key, field in (
                ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", "count"),
                ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", "count"),
                ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
                 "cache_hit", "ns"),
                ("nv_cache_miss_duration_per_model",
                 "Total cache miss (insert+lookup) duration per model, in microseconds", "cache_miss", "ns"),
            )
        ]  # fmt: skip
        for entry in self.models.entries():
            runtime = entry.runtime
            if runtime is None:
                continue
            stats = runtime.metrics.statistics
            labels = {"model": entry.name, "version": entry.version}
            for family, key, field in families:
                duration = getattr(stats, key)
                value = duration.count if field == "count" else duration.ns // 1000
                family.add_sample(family.name, labels, value)
        yield from (family for family, _, _ in families)

    # ------------------------------------------------------------------ GPUs (NVML present)
    def _gpus(self) -> Iterator[Metric]:
        metrics = getattr(self.telemetry, "metrics", None)
        if metrics is None or not getattr(self.telemetry, "gpu_available", False):
            return
        uuids = {s.labels["gpu"]: s.labels["uuid"] for s in _samples(metrics.gpu_info)}
        # The simulated GPU (WATTSERVE_SIMULATED_GPU): Triton's names, plus source="simulated"
        # on every series, so no dashboard can read a power model's figure as a measurement.
        extra = {"source": "simulated"} if getattr(self.telemetry, "simulated", False) else {}
        families = [
            ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", metrics.gpu_utilization, None),
            ("nv_gpu_power_usage", "GPU power usage in watts", metrics.gpu_power, "nvml_average"),
            ("nv_gpu_power_limit", "GPU power management limit in watts", metrics.gpu_power_limit, None),
            ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", metrics.gpu_memory_total, None),
            ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", metrics.gpu_memory_used, None),
        ]
        for name, doc, source, prefer in families:
            family = GaugeMetricFamily(name, doc, labels=["gpu_uuid", *extra])
            for gpu, value in _per_gpu(source, prefer, "").items():
                family.add_metric([uuids.get(gpu, gpu), *extra.values()], value)
            yield family
        energy = _cumulative(
            "nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started"
        )
        for gpu, value in _per_gpu(metrics.gpu_energy, "nvml_counter", "_total").items():
            energy.add_sample("nv_energy_consumption", {"gpu_uuid": uuids.get(gpu, gpu), **extra}, value)
        yield energy

    # ------------------------------------------------------------------ CPU (Linux /proc)
    def _cpu(self) -> Iterator[Metric]:
        now = _cpu_times(self.proc)
        if now is not None and self._cpu_last is not None:
            busy = now[0] - self._cpu_last[0]
            total = now[1] - self._cpu_last[1]
            utilization = GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]")
            utilization.add_metric([], busy / total if total > 0 else 0.0)
            if total > 0:
                self._cpu_last = now
            yield utilization
        memory = _meminfo(self.proc)
        if memory is not None:
            total_b, available_b = memory
            yield GaugeMetricFamily(
                "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=total_b
            )
            yield GaugeMetricFamily(
                "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=total_b - available_b
            )


def _samples(metric: Any) -> list[Any]:
    return [s for family in metric.collect() for s in family.samples]


def _per_gpu(metric: Any, prefer: str | None, suffix: str) -> dict[str, float]:
    """gpu label -> value; with a ``source`` label, the ``prefer`` source where present."""
    chosen: dict[str, tuple[bool, float]] = {}
    for s in _samples(metric):
        if suffix and not s.name.endswith(suffix):
            continue  # e.g. a counter's _created sample
        gpu = s.labels["gpu"]
        preferred = prefer is None or s.labels.get("source") == prefer
        if gpu not in chosen or (preferred and not chosen[gpu][0]):
            chosen[gpu] = (preferred, s.value)
    return {gpu: value for gpu, (_, value) in chosen.items()}


def _cpu_times(proc: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies over every CPU from /proc/stat, as Triton counts them."""
    try:
        first = (proc / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def _meminfo(proc: Path) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo."""
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return None
    values = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            values[key] = int(rest.split()[0]) * 1024
    if len(values) != 2:
        return None
    return values["MemTotal"], values["MemAvailable"]
