"""Server-side statistics over a measurement window, from two scrapes of ``/metrics``.

Counters and histograms are differenced between the scrape at window start and the one at
window end; gauges (power, utilization) are averaged over the periodic scrapes that fall inside
the window. Only what the server exports is reported: a figure whose metric is absent is None
and the report says "not available". Parsing uses prometheus_client's own text parser, and it
happens after the run, never while requests are being sent.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .lm_window import lm_window

LabelKey = tuple[tuple[str, str], ...]

INFERENCES = "wattserve_inferences_total"
BATCHES = "wattserve_batch_executions_total"
CACHE_HITS = "nv_cache_num_hits_per_model"  # response-cache hits (only with a cache configured)
PADDED = "wattserve_batch_padded_slots_total"
BATCH_SIZE = "wattserve_batch_size"
QUEUE = "wattserve_queue_duration_seconds"
COMPUTE = "wattserve_batch_compute_duration_seconds"
REQUEST = "wattserve_request_duration_seconds"
REQUESTS = "wattserve_requests_total"
# Telemetry (telemetry/metrics.py); every figure is optional and None when absent.
TELEMETRY_PREFIXES = ("wattserve_gpu_", "wattserve_cpu_", "wattserve_energy_", "wattserve_rapl_")
# The batching policy's own state (batchers/*: adaptive's margins, hold and reserve, AIMD's
# limit, the objective's counters): why a run's batches came out as they did.
POLICY_PREFIXES = ("wattserve_adaptive_", "wattserve_aimd_", "wattserve_slo_")
GPU_AVAILABLE = "wattserve_gpu_telemetry_available"
GPU_POWER = "wattserve_gpu_power_watts"  # labels gpu, source=nvml_average|nvml_instant
GPU_ENERGY = "wattserve_gpu_energy_joules_total"  # labels gpu, source
GPU_UTILIZATION = "wattserve_gpu_utilization_ratio"
CPU_POWER = "wattserve_cpu_power_watts"
ENERGY_STATE = "wattserve_energy_joules_total"  # labels device, source, state=busy|idle
INFERENCE_ENERGY = "wattserve_energy_inference_joules"  # histogram, one observation per request


@dataclass
class Snapshot:
    """One parsed scrape: sample values by (sample name, labels), and each family's type."""

    values: dict[tuple[str, LabelKey], float] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # family name -> counter/gauge/...

    def samples(self, name: str) -> Iterable[tuple[LabelKey, float]]:
        for (sample, labels), value in self.values.items():
            if sample == name:
                yield labels, value


def parse(text: str, model: str | None = None) -> Snapshot:
    """Parse Prometheus text; drop ``*_created`` samples and other models' series."""
    snap = Snapshot()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            continue
        snap.types[family.name] = family.type
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            if model is not None and "model" in s.labels and s.labels["model"] != model:
                continue
            snap.values[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return snap


def is_telemetry(family: str) -> bool:
    """Device telemetry and energy families (the telemetry module's naming)."""
    return family.startswith(TELEMETRY_PREFIXES) or ("energy" in family and "joules" in family)


def is_policy(family: str) -> bool:
    """The batching policy's own families (``POLICY_PREFIXES``)."""
    return family.startswith(POLICY_PREFIXES)


def window_stats(
    start: Snapshot,
    end: Snapshot,
    series: Sequence[tuple[float, Snapshot]] = (),
    window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Everything the server says about the window ``[start, end]``.

    ``series`` holds (offset seconds, snapshot) pairs from periodic scrapes, used for gauges;
    ``window`` is the (start, end) offset pair that selects which of them count.
    """
    delta = _Delta(start, end)
    inferences = delta.total(INFERENCES)
    batches = delta.total(BATCHES)
    inside = [s for t, s in series if window is None or window[0] <= t <= window[1]] or [start, end]
    out: dict[str, Any] = {
        "inferences": inferences,
        "batch_executions": batches,
        "avg_batch_size": _ratio(inferences, batches),
        "padded_slots": delta.total(PADDED),
        "batch_size_histogram": delta.buckets(BATCH_SIZE),
        "mean_queue_ms": _ms(delta.hist_mean(QUEUE)),
        "mean_compute_ms": _ms(delta.hist_mean(COMPUTE)),
        "mean_request_ms": _ms(delta.hist_mean(REQUEST)),
        "requests_by_outcome": delta.by_label(REQUESTS, "outcome"),
    }
    # a response-cache hit is an inference answered with no engine energy: energy per
    # inference divides by the computed and the cached ones alike
    cached = delta.total(CACHE_HITS)
    out["cached_inferences"] = cached
    answered = inferences + cached if inferences is not None and cached is not None else inferences
    out.update(_telemetry(delta, inside, answered))
    out["policy"] = _series_table(delta, inside, inferences, is_policy)
    lm = lm_window(delta, inside, window[1] - window[0] if window else None)
    if lm is not None:  # a language model: its tokens over the window (lm_window.py)
        out["lm"] = lm
    return out


def gauge_series(
    series: Sequence[tuple[float, Snapshot]], predicate: Any
) -> dict[str, list[tuple[float, float]]]:
    """Time series of every gauge sample whose family passes ``predicate`` (e.g. power)."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t, snap in series:
        for (name, labels), value in snap.values.items():
            if snap.types.get(name) == "gauge" and predicate(name) and math.isfinite(value):
                out[_series_name(name, labels)].append((t, value))
    return dict(out)


def is_power(name: str) -> bool:
    """Device power gauges (GPU by NVML, CPU package by RAPL), not their limits."""
    device = name.startswith(("wattserve_gpu_", "wattserve_cpu_"))
    return device and name.endswith("_watts") and "limit" not in name


class _Delta:
    """Differences of counters and histograms between two snapshots."""

    def __init__(self, start: Snapshot, end: Snapshot) -> None:
        self.start, self.end = start, end

    def by_labels(self, name: str) -> dict[LabelKey, float]:
        return {
            labels: value - self.start.values.get((name, labels), 0.0)
            for labels, value in self.end.samples(name)
        }

    def total(self, name: str) -> float | None:
        parts = self.by_labels(name)
        return sum(parts.values()) if parts else None

    def by_label(self, name: str, label: str) -> dict[str, float] | None:
        parts = self.by_labels(name)
        if not parts:
            return None
        out: dict[str, float] = defaultdict(float)
        for labels, value in parts.items():
            out[dict(labels).get(label, "")] += value
        return dict(out)

    def hist_mean(self, base: str) -> float | None:
        count, total = self.total(base + "_count"), self.total(base + "_sum")
        return _ratio(total, count)

    def buckets(self, base: str) -> list[dict[str, float | None]] | None:
        """Per-bucket counts (not cumulative) of a histogram over the window, summed over labels;
        the first bucket's lower bound ``gt`` is None."""
        cumulative: dict[float, float] = defaultdict(float)
        for labels, value in self.by_labels(base + "_bucket").items():
            le = dict(labels).get("le")
            if le is not None:
                cumulative[float(le)] += value
        if not cumulative:
            return None
        out: list[dict[str, float | None]] = []
        below, lower = 0.0, None
        for bound in sorted(cumulative):
            out.append({"gt": lower, "le": bound, "count": cumulative[bound] - below})
            below, lower = cumulative[bound], bound
        return out


def _telemetry(delta: _Delta, inside: Sequence[Snapshot], inferences: float | None) -> dict[str, Any]:
    """Energy and device figures over the window, from whichever telemetry metrics exist."""
    table = _series_table(delta, inside, inferences, is_telemetry)
    energy, source = None, None
    state = delta.by_label(ENERGY_STATE, "state")  # busy/idle energy of the metered devices
    gpu_energy = delta.total(GPU_ENERGY)
    busy_share = delta.hist_mean(INFERENCE_ENERGY)  # each request's share of its batch
    if state and inferences:
        energy = sum(state.values()) / inferences
        source = (
            f"{ENERGY_STATE} (busy + idle, source {_sources(delta, ENERGY_STATE)}) over the window "
            "/ inferences"
        )
    elif gpu_energy is not None and inferences:
        energy = gpu_energy / inferences
        source = f"{GPU_ENERGY} (source {_sources(delta, GPU_ENERGY)}) over the window / inferences"
    elif busy_share is not None:
        energy, source = busy_share, f"mean of {INFERENCE_ENERGY} (busy energy only)"
    available = _last_gauge(delta.end, GPU_AVAILABLE)
    return {
        "gpu_telemetry_available": None if available is None else bool(available),
        "energy_per_inference_j": energy,
        "energy_source": source,
        "energy_busy_j": state.get("busy") if state else None,
        "energy_idle_j": state.get("idle") if state else None,
        "busy_energy_per_inference_j": busy_share,
        "gpu_energy_j": gpu_energy,
        "gpu_power_w": _mean_of_sums(inside, GPU_POWER, _preferred_power_source(delta.end)),
        "gpu_utilization": _mean_of_means(inside, GPU_UTILIZATION),
        "cpu_power_w": _mean_of_sums(inside, CPU_POWER, None),
        "telemetry": table,
    }


def _series_table(
    delta: _Delta, inside: Sequence[Snapshot], inferences: float | None, keep: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """One row per series of the families ``keep`` selects: gauge mean/min/max over the
    window's scrapes, counter delta, histogram mean."""
    rows: list[dict[str, Any]] = []
    for family, kind in sorted(delta.end.types.items()):
        if not keep(family):
            continue
        if kind == "gauge":
            for labels, _ in delta.end.samples(family):
                values = [s.values[(family, labels)] for s in inside if (family, labels) in s.values]
                values = [v for v in values if math.isfinite(v)]
                if values:
                    mean = sum(values) / len(values)
                    rows.append(_row(family, labels, "gauge", mean=mean, min=min(values), max=max(values)))
        elif kind == "counter":
            for labels, d in delta.by_labels(family + "_total").items():
                per_inf = _ratio(d, inferences) if "joules" in family else None
                rows.append(_row(family + "_total", labels, "counter", delta=d, per_inference=per_inf))
        elif kind == "histogram":
            sums = delta.by_labels(family + "_sum")
            for labels, count in delta.by_labels(family + "_count").items():
                total = sums.get(labels)
                rows.append(
                    _row(family, labels, "histogram", count=count, sum=total, mean=_ratio(total, count))
                )
    return rows


def _sources(delta: _Delta, name: str) -> str:
    found = {dict(labels).get("source", "?") for labels, _ in delta.end.samples(name)}
    return ",".join(sorted(found)) or "?"


def _last_gauge(snap: Snapshot, name: str) -> float | None:
    values = [v for _, v in snap.samples(name)]
    return max(values) if values else None


def _preferred_power_source(snap: Snapshot) -> str | None:
    """NVML's averaged power where exported (steadier), else the instantaneous field."""
    sources = {dict(labels).get("source") for labels, _ in snap.samples(GPU_POWER)}
    for preferred in ("nvml_average", "nvml_instant"):
        if preferred in sources:
            return preferred
    return None


def _mean_of_sums(inside: Sequence[Snapshot], name: str, source: str | None) -> float | None:
    """Per scrape, the sum over devices (one source); then the mean over the window's scrapes."""
    per_scrape = []
    for snap in inside:
        values = [
            v
            for labels, v in snap.samples(name)
            if (source is None or dict(labels).get("source") == source) and math.isfinite(v)
        ]
        if values:
            per_scrape.append(sum(values))
    return sum(per_scrape) / len(per_scrape) if per_scrape else None


def _mean_of_means(inside: Sequence[Snapshot], name: str) -> float | None:
    values = [v for snap in inside for _, v in snap.samples(name) if math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _row(name: str, labels: LabelKey, kind: str, **values: Any) -> dict[str, Any]:
    return {"name": name, "labels": dict(labels), "type": kind, **values}


def _series_name(name: str, labels: LabelKey) -> str:
    inner = ",".join(f"{k}={v}" for k, v in labels if k not in ("model", "batcher"))
    return f"{name}{{{inner}}}" if inner else name


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def merge_texts(texts: Mapping[float, str], model: str | None) -> list[tuple[float, Snapshot]]:
    """Parse periodic scrapes (offset -> text), skipping any that failed to parse."""
    out = []
    for t in sorted(texts):
        try:
            out.append((t, parse(texts[t], model)))
        except ValueError:
            continue
    return out
