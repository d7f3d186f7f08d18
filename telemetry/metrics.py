"""Telemetry metric declarations, on the app's own registry (base units, ``_total`` counters).

Every metric whose value comes from energy hardware (NVML or RAPL) is named with one of
``HARDWARE_PREFIXES``; the one exception is ``wattserve_gpu_telemetry_available``, which is
always exported (0 when there is no GPU). Tests and the dashboard check rely on that naming to
tell the panels that need hardware from those that must always have data.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from wattserve.telemetry.histogram import BisectHistogram

HARDWARE_PREFIXES = ("wattserve_gpu_", "wattserve_cpu_", "wattserve_energy_")
ALWAYS_EXPORTED = frozenset({"wattserve_gpu_telemetry_available", "wattserve_rapl_available"})

# Joules per batch/inference span micro-models on CPUs to large batches on 700 W GPUs.
ENERGY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0,
    100.0, 200.0, 500.0, 1000.0,
)  # fmt: skip
SAMPLE_COST_BUCKETS = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1)


def needs_energy_hardware(metric_name: str) -> bool:
    """True when ``metric_name`` only has series where NVML or RAPL is readable."""
    base = metric_name
    for suffix in ("_bucket", "_sum", "_count", "_created"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    if base in ALWAYS_EXPORTED:
        return False
    return base.startswith(HARDWARE_PREFIXES)


class TelemetryMetrics:
    """Every telemetry metric; label children are created only for devices that exist."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self._declare_availability(registry)
        self._declare_gpu(registry)
        self._declare_cpu(registry)
        self._declare_energy(registry)

    def _declare_availability(self, r: CollectorRegistry) -> None:
        """Always exported, so a dashboard can say "no GPU" instead of showing nothing."""
        self.gpu_available = Gauge(
            "wattserve_gpu_telemetry_available",
            "1 when NVML initialised and at least one GPU is sampled, else 0.",
            registry=r,
        )
        self.rapl_available = Gauge(
            "wattserve_rapl_available",
            "1 when a readable RAPL package energy counter is sampled, else 0.",
            registry=r,
        )

    def _declare_gpu(self, r: CollectorRegistry) -> None:
        """NVML readings, one label child per sampled GPU."""
        gpu = ("gpu",)
        self.gpu_info = Gauge(
            "wattserve_gpu_info", "Sampled GPU (value 1).", ("gpu", "name", "uuid"), registry=r
        )
        self.gpu_power = Gauge(
            "wattserve_gpu_power_watts",
            "GPU power: source=nvml_average (nvmlDeviceGetPowerUsage, a 1 s average on Ampere "
            "and newer) or nvml_instant (NVML_FI_DEV_POWER_INSTANT field); source=simulated on a "
            "simulated GPU (WATTSERVE_SIMULATED_GPU, gpu=simulatedN): a power model, not a reading.",
            ("gpu", "source"),
            registry=r,
        )
        self.gpu_power_limit = Gauge(
            "wattserve_gpu_power_limit_watts", "Enforced power limit.", gpu, registry=r
        )
        self.gpu_energy = Counter(
            "wattserve_gpu_energy_joules",
            "GPU energy since the server started: source=nvml_counter (the GPU's own counter) "
            "or nvml_power_integrated (sampled power, trapezoid rule) or simulated (a power model).",
            ("gpu", "source"),
            registry=r,
        )
        self.gpu_utilization = Gauge(
            "wattserve_gpu_utilization_ratio",
            "Fraction of the last sample period a kernel ran (NVML utilization.gpu).",
            gpu,
            registry=r,
        )
        self.gpu_memory_utilization = Gauge(
            "wattserve_gpu_memory_utilization_ratio",
            "Fraction of the last sample period device memory was read or written.",
            gpu,
            registry=r,
        )
        self.gpu_memory_used = Gauge(
            "wattserve_gpu_memory_used_bytes", "Device memory in use.", gpu, registry=r
        )
        self.gpu_memory_total = Gauge(
            "wattserve_gpu_memory_total_bytes", "Device memory in all.", gpu, registry=r
        )
        self.gpu_sm_clock = Gauge("wattserve_gpu_sm_clock_hertz", "Current SM clock.", gpu, registry=r)
        self.gpu_temperature = Gauge(
            "wattserve_gpu_temperature_celsius", "GPU die temperature.", gpu, registry=r
        )
        self.gpu_stale = Gauge(
            "wattserve_gpu_stale",
            "1 when this GPU's last sample failed; its other series are withdrawn until it "
            "answers again, so Prometheus marks them stale.",
            gpu,
            registry=r,
        )
        self.gpu_sample_errors = Counter(
            "wattserve_gpu_sample_errors", "Failed NVML samples.", gpu, registry=r
        )

    def _declare_cpu(self, r: CollectorRegistry) -> None:
        """RAPL package energy and power, one label child per domain."""
        self.cpu_energy = Counter(
            "wattserve_cpu_energy_joules",
            "CPU package energy from Linux powercap (RAPL), wraparound corrected.",
            ("domain", "source"),
            registry=r,
        )
        self.cpu_power = Gauge(
            "wattserve_cpu_power_watts",
            "CPU package power over the last sample period (RAPL energy delta / time).",
            ("domain",),
            registry=r,
        )

    def _declare_energy(self, r: CollectorRegistry) -> None:
        """Counter windows, batch and per-inference attribution, and the cost of measuring."""
        self.energy_state = Counter(
            "wattserve_energy_joules",
            "Energy of each metered device from its counter, booked per window between counter "
            "steps: state=busy is what the window's batches were charged (its energy less the "
            "idle baseline over its idle time), state=idle the rest.",
            ("device", "source", "state"),
            registry=r,
        )
        self.energy_update_period = Gauge(
            "wattserve_energy_counter_update_period_seconds",
            "Median time between steps of the device's energy counter, measured at start and "
            "kept current (windows shorter than this read as zero energy).",
            ("device", "source"),
            registry=r,
        )
        self.energy_idle_power = Gauge(
            "wattserve_energy_idle_power_watts",
            "The device's idle baseline: counter joules over seconds of windows in which no "
            "batch ran (time-weighted, last ~5 s of them). Decides busy vs idle energy.",
            ("device", "source"),
            registry=r,
        )
        self.batch_energy = BisectHistogram(
            "wattserve_energy_batch_joules",
            "Energy charged to one batch: its busy-time share of every counter window it ran "
            "in, observed one counter step after it ended.",
            ("model", "batcher", "source"),
            buckets=ENERGY_BUCKETS,
            registry=r,
        )
        self.inference_energy = BisectHistogram(
            "wattserve_energy_inference_joules",
            "Each request's equal share of its batch's energy (one observation per request); "
            'idle energy is not in it (see wattserve_energy_joules_total{state="idle"}).',
            ("model", "batcher", "source"),
            buckets=ENERGY_BUCKETS,
            registry=r,
        )
        self.meter_read_cost = Gauge(
            "wattserve_energy_meter_read_duration_seconds",
            "Mean cost of one energy-meter read (all metered devices), measured at start.",
            ("source",),
            registry=r,
        )
        self.sample_cost = BisectHistogram(
            "wattserve_telemetry_sample_duration_seconds",
            "Wall time of one sampler pass over every device.",
            buckets=SAMPLE_COST_BUCKETS,
            registry=r,
        )
