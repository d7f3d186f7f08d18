"""TelemetryService: owns NVML/RAPL discovery, the energy meter, the sampler and the books.

One per app. ``start()`` and ``stop()`` block (NVML init can take a moment), so the server's
lifespan calls them through ``asyncio.to_thread``; nothing here touches the event loop.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry
from wattserve.telemetry.cumulative import (
    Clock,
    CounterEnergy,
    CumulativeEnergy,
    IntegratedPowerEnergy,
    RaplEnergy,
)
from wattserve.telemetry.energy import EnergyLedger, EnergyMeter
from wattserve.telemetry.metrics import TelemetryMetrics
from wattserve.telemetry.nvml_gpu import NvmlGpu, open_gpus
from wattserve.telemetry.poller import EnergyPoller, poll_interval
from wattserve.telemetry.rapl import find_packages
from wattserve.telemetry.sampler import Sampler
from wattserve.telemetry.simulated_gpu import (
    SimulatedCounterEnergy,
    SimulatedEnergyMeter,
    SimulatedNvml,
    SimulatedNvmlGpu,
    load_power_model,
)
from wattserve.telemetry.windows import BatchSpan

log = logging.getLogger("wattserve.telemetry")

COST_READS = 20  # meter reads timed at start
CADENCE_STEPS = 6  # counter steps seen at start to measure the update period
CADENCE_POLL_S = 0.001  # read gap while measuring it
CADENCE_MAX_S = 1.5  # longest the measurement may take (a counter that never steps: unknown)
STEPWISE_FACTOR = 3  # a counter is stepwise when its period is this many poll gaps or more
MAX_HISTORY_TICKS = 40_000  # window_report history: 66 min at 100 ms; ~13 MB (measured)


@dataclass(frozen=True)
class TelemetryConfig:
    """The telemetry part of the server's settings (same names: ``WATTSERVE_TELEMETRY``...)."""

    telemetry: bool = True  # False: sample nothing, say so in the availability gauges
    telemetry_interval_ms: float = 100.0
    gpus: Sequence[int] | None = None  # NVML indices; None: every GPU
    rapl_root: Path = Path("/sys/class/powercap")
    simulated_gpu: str | None = None  # a power model (telemetry/simulated_gpu.py): NVML simulated


def observe_many(histogram: Any, value: float, count: int) -> None:
    """``count`` observations of one value, in O(buckets) rather than O(count).

    record_batch runs on the event loop, and a 256-request batch observed one by one costs
    ~0.8 ms there (measured). This does what ``Histogram.observe`` does (prometheus_client
    0.20-0.26), ``count`` at a time; if those internals ever change it falls back to the loop.
    """
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    total = getattr(histogram, "_sum", None)
    if buckets is None or bounds is None or total is None or len(buckets) != len(bounds):
        for _ in range(count):
            histogram.observe(value)
        return
    total.inc(value * count)
    for bucket, bound in zip(buckets, bounds, strict=True):
        if value <= bound:
            bucket.inc(count)
            break


def _cuda_uuid(index: int) -> str | None:
    """CUDA device ``index``'s UUID (lowercase, no "GPU-") when torch has CUDA up, else None.

    CUDA and NVML may number GPUs differently (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER); the
    UUID is what both agree on. torch is imported only if the engine already did."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        return str(torch.cuda.get_device_properties(index).uuid).lower()
    except Exception:  # old torch without .uuid, bad index: fall back to the index
        return None


class _Tick(NamedTuple):
    """Cumulative books at one sampler tick (wall-clock time, for other processes)."""

    wall: float
    busy: float
    idle: float
    inferences: int
    batches: int
    metered_inferences: int
    attributed: float
    stale: tuple[str, ...]
    cached: int = 0  # requests' rows answered from the response cache (no engine energy)


@dataclass
class _Counts:
    inferences: int = 0
    cached: int = 0
    batches: int = 0
    metered_inferences: int = 0
    attributed: float = 0.0


class TelemetryService:
    """GPU (NVML) and CPU (RAPL) energy telemetry for one server.

    ``config``: what to sample and how often (the server's telemetry settings).
    ``nvml`` replaces the ``pynvml`` module (tests pass the FakeNvml double); ``clock`` is
    the monotonic clock energy windows and power integration use, ``sleep`` its sleep (the
    update-period measurement at start); ``wall_clock`` stamps the window history.
    ``background=False`` starts no threads: a test drives ``poll_once`` and the sampler.
    """

    def __init__(
        self,
        config: TelemetryConfig,
        registry: CollectorRegistry,
        *,
        nvml: ModuleType | Any | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        sleep: Any = time.sleep,
        history_s: float = 3600.0,
        background: bool = True,
    ):
        self.config = config
        self.metrics = TelemetryMetrics(registry)
        self.metrics.gpu_available.set(0)
        self.metrics.rapl_available.set(0)
        self._nvml_module = nvml
        self._nvml: Any | None = None  # the module, once nvmlInit succeeded
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._background = background
        self.interval_s = config.telemetry_interval_ms / 1000.0
        ticks = min(MAX_HISTORY_TICKS, max(1000, math.ceil(history_s / self.interval_s)))
        self._history: deque[_Tick] = deque(maxlen=ticks)
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.gpus: list[NvmlGpu] = []
        self.rapl: list[RaplEnergy] = []
        self.gpu_reason: str | None = "not started"
        self.rapl_reason: str | None = "not started"
        self.meter_read_cost_s: float | None = None
        self.sample_cost_s: float | None = None
        self._ledger: EnergyLedger | None = None
        self._meter: EnergyMeter | None = None
        self._meters: dict[tuple[str, ...], EnergyMeter] = {}
        self._simulated: SimulatedEnergyMeter | None = None  # every engine's meter when simulated
        self._sampler: Sampler | None = None
        self._poller: EnergyPoller | None = None
        self.poll_s: float | None = None
        self._started = False

    # --- what the server asks ---
    @property
    def meter(self) -> EnergyMeter | None:
        """A meter over every GPU (else every RAPL package), or None when nothing is measured.

        The server uses ``meter_for(engine.device)`` instead, so batches are charged only the
        energy of the device they ran on."""
        return self._meter

    def meter_for(self, device: str) -> EnergyMeter | None:
        """The meter for an engine on ``device`` ("cuda:N", "cuda", "cpu", ...).

        CUDA devices: that GPU's NVML counter (matched by UUID when torch can tell it, else by
        index). Anything else runs on the CPU: the RAPL packages, or None (not measured). A
        CPU engine is never charged GPU energy. With a simulated GPU, every engine is metered
        as if it ran on it."""
        if self._simulated is not None:
            return self._simulated
        if self._ledger is None:
            return None
        if device.startswith("cuda"):
            gpu = self._gpu_for_cuda(device)
            if gpu is None:
                log.warning("%s is not among the sampled GPUs; its batches are not metered", device)
                return None
            names: tuple[str, ...] = (f"gpu{gpu.index}",)
        else:
            names = tuple(r.device for r in self.rapl)
            if not names:
                log.info("engine on %s: no RAPL counter, so its batches are not metered", device)
                return None
        meter = self._meters.get(names)
        if meter is None:
            meter = self._meters[names] = EnergyMeter(self._ledger, names)
        return meter

    def _gpu_for_cuda(self, device: str) -> NvmlGpu | None:
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        uuid = _cuda_uuid(index)
        if uuid is not None:
            for gpu in self.gpus:
                if gpu.uuid.lower().removeprefix("gpu-") == uuid:
                    return gpu
        return next((g for g in self.gpus if g.index == index), None)

    @property
    def available(self) -> bool:
        """True when some energy source (GPU or RAPL) is measured."""
        return self._meter is not None

    @property
    def gpu_available(self) -> bool:
        return bool(self.gpus)

    @property
    def simulated(self) -> bool:
        """True when the GPU is simulated (``WATTSERVE_SIMULATED_GPU``): no figure is measured."""
        return self._simulated is not None

    # --- lifecycle ---
    def start(self) -> None:
        """Discover devices, measure read costs, start the sampler. Blocking; idempotent."""
        if self._started:
            return
        self._started = True
        if not self.config.telemetry:
            self.gpu_reason = self.rapl_reason = "disabled by settings (WATTSERVE_TELEMETRY=false)"
            log.info("telemetry: %s; no power or energy figures are exported", self.gpu_reason)
            return
        if self.config.simulated_gpu:
            self._start_simulated(self.config.simulated_gpu)
        else:
            opened = open_gpus(
                self._nvml_module, None if self.config.gpus is None else list(self.config.gpus)
            )
            self.gpus, self.gpu_reason = opened.gpus, opened.reason
            domains, self.rapl_reason = find_packages(self.config.rapl_root)
            self.rapl = [RaplEnergy(d) for d in domains]
        if self.gpus:
            self._nvml = self.gpus[0].nvml
        self.metrics.gpu_available.set(1 if self.gpus else 0)
        self.metrics.rapl_available.set(1 if self.rapl else 0)

        metered: list[CumulativeEnergy] = [
            SimulatedCounterEnergy(g)
            if isinstance(g, SimulatedNvmlGpu)
            else CounterEnergy(g)
            if g.has_energy_counter
            else IntegratedPowerEnergy.for_gpu(g, self._clock)
            for g in self.gpus
        ]
        metered += self.rapl
        if metered:
            self._ledger = EnergyLedger(metered, self._clock)
            default = [m.device for m in metered]
            if self.config.simulated_gpu:
                sims = [g.device for g in self.gpus if isinstance(g, SimulatedNvmlGpu)]
                self._meter = self._simulated = SimulatedEnergyMeter(self._ledger, default, sims)
            else:
                default = [f"gpu{g.index}" for g in self.gpus] or [r.device for r in self.rapl]
                self._meter = EnergyMeter(self._ledger, default)
        if not self.gpus and not self.rapl:
            log.warning(
                "telemetry unavailable: GPU: %s; RAPL: %s; no power or energy figures are "
                "exported (wattserve_gpu_telemetry_available 0)",
                self.gpu_reason,
                self.rapl_reason,
            )
            return
        self._sampler = Sampler(
            self.metrics,
            self.gpus,
            self._ledger,
            [],
            self.interval_s,
            on_tick=self._on_tick,
            clock=self._clock,
        )
        self._measure_cadence()
        self._measure_costs()
        if self._ledger is not None:
            self._poller = EnergyPoller(self._ledger, self.poll_s or 0.01)
        if self._background:
            self._sampler.start()
            if self._poller is not None:
                self._poller.start()
        log.info("telemetry: %s", self.describe())

    def _start_simulated(self, spec: str) -> None:
        """NVML answered by a power model driven by the engines' busy time; RAPL is not
        metered beside it (its real joules would mix with simulated ones)."""
        nvml = self._nvml_module or SimulatedNvml(load_power_model(spec), clock=self._clock)
        model = nvml.model  # a test passes its own SimulatedNvml
        opened = open_gpus(nvml, None, SimulatedNvmlGpu)
        self.gpus, self.gpu_reason = opened.gpus, opened.reason
        self.rapl, self.rapl_reason = [], "not metered beside the simulated GPU"
        log.warning(
            "telemetry: SIMULATED GPU (power model %r: idle %.0f W, counter every %.0f ms); every "
            'energy and power figure is simulated (source="simulated", gpu="simulated0")',
            model.name,
            model.idle_watts,
            model.counter_update_period_s * 1e3,
        )

    def _measure_cadence(self) -> None:
        """Read the counters until each has stepped CADENCE_STEPS times (or time is up).

        Gives each device's update period (published, and it sets the poll interval and
        whether a step's moment is estimated as a midpoint) and a first idle-power baseline
        (these windows hold no batch)."""
        ledger = self._ledger
        if ledger is None:
            return
        count = len(ledger.devices)
        started = self._clock()
        for _ in range(int(CADENCE_MAX_S / CADENCE_POLL_S)):
            ledger.tick()
            if all(len(ledger.windows(i).boundaries) > CADENCE_STEPS for i in range(count)):
                break
            if self._clock() - started > CADENCE_MAX_S:
                break
            self._sleep(CADENCE_POLL_S)
        periods = [ledger.windows(i).update_period_s for i in range(count)]
        gpu_periods = [p for p, s in zip(periods, ledger.sources, strict=True) if p and s != "rapl"]
        self.poll_s = poll_interval(min(gpu_periods) if gpu_periods else None)
        for i, period in enumerate(periods):
            windows = ledger.windows(i)
            windows.stepwise = period is not None and period >= STEPWISE_FACTOR * max(
                self.poll_s, CADENCE_POLL_S
            )
            label = "unknown" if period is None else f"{period * 1e3:.1f} ms"
            log.info("energy counter of %s: update period %s", windows.device, label)
            if period is not None:
                self.metrics.energy_update_period.labels(windows.device, windows.source).set(period)

    def poll_once(self) -> None:
        """One energy poll (what the poller thread does every ``poll_s``)."""
        if self._poller is not None:
            self._poller.poll_once()

    def _measure_costs(self) -> None:
        assert self._sampler is not None
        if self._ledger is not None and self._meter is not None:
            t0 = time.perf_counter()
            for _ in range(COST_READS):
                self._ledger.tick()
            self.meter_read_cost_s = (time.perf_counter() - t0) / COST_READS
            self.metrics.meter_read_cost.labels(self._meter.source).set(self.meter_read_cost_s)
        t0 = time.perf_counter()
        self._sampler.sample_once()
        self.sample_cost_s = time.perf_counter() - t0

    def describe(self) -> str:
        """One line: what is sampled, which source meters batches, and what reads cost."""
        gpus = ", ".join(
            f"{g.label}:{g.name} counter={'yes' if g.has_energy_counter else 'no'} "
            f"instant={'yes' if g.has_instant_power else 'no'}"
            for g in self.gpus
        )
        parts = [f"GPUs [{gpus}]" if self.gpus else f"GPU unavailable ({self.gpu_reason})"]
        if self.simulated:
            parts.insert(0, "SIMULATED")
        parts.append(
            f"RAPL [{', '.join(r.device for r in self.rapl)}]"
            if self.rapl
            else f"RAPL unavailable ({self.rapl_reason})"
        )
        if self._meter is not None:
            parts.append(f"meter {self._meter.source} over {','.join(self._meter.devices)}")
        if self.meter_read_cost_s is not None:
            parts.append(f"meter read {self.meter_read_cost_s * 1e6:.1f} us")
        if self.sample_cost_s is not None:
            parts.append(f"sample {self.sample_cost_s * 1e6:.1f} us")
        if self._ledger is not None:
            periods = [
                f"{a.device} {'?' if a.update_period_s is None else f'{a.update_period_s * 1e3:.1f} ms'}"
                for a in self._ledger.snapshot()
            ]
            parts.append(f"counter update period [{', '.join(periods)}]; poll {self.poll_s or 0:.3f} s")
        parts.append(f"interval {self.interval_s * 1e3:g} ms")
        return "; ".join(parts)

    def stop(self) -> None:
        """Stop the sampler (within one wait) and shut NVML down. Blocking; idempotent."""
        if self._poller is not None:
            self._poller.stop()
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)
            self._nvml = None

    @property
    def sampler(self) -> Sampler | None:
        return self._sampler

    # --- per batch (any thread; no device reads here) ---
    def record_batch(self, model: str, batcher: str, batch_size: int, energy: BatchSpan | None) -> None:
        """Count one executed batch; its energy is observed once its windows have closed.

        ``energy`` is what ``EnergyMeter.end`` returned (None when the engine's device is not
        metered). The histograms get the batch's figure one counter step after it ended,
        from whichever thread closes its last window."""
        with self._lock:
            self._counts.inferences += batch_size
            self._counts.batches += 1
        if self._simulated is not None:  # the simulated device draws power by the batch's size
            self._simulated.set_size(energy, batch_size)
        if energy is None or batch_size <= 0:
            return
        energy.when_done(batch_size, (model, batcher), self._observe_span)

    def record_cached(self, rows: int) -> None:
        """Count ``rows`` inferences answered from the response cache: no batch ran, so they
        add no energy, and joules per inference divides the window's energy by them too."""
        with self._lock:
            self._counts.cached += rows

    def _observe_span(self, span: BatchSpan) -> None:
        joules, size = span.attributed_joules, span.size or 0
        if joules is None or size <= 0:
            return
        with self._lock:
            self._counts.metered_inferences += size
            self._counts.attributed += joules
        model, batcher = span.labels
        key = (model, batcher, span.source)
        children = self._children.get(key)
        if children is None:
            children = (
                self.metrics.batch_energy.labels(*key),
                self.metrics.inference_energy.labels(*key),
            )
            self._children[key] = children
        per_batch, per_inference = children
        per_batch.observe(joules)
        # one observation per request, so _sum/_count = J/inference
        observe_many(per_inference, joules / size, size)

    # --- window report ---
    def _on_tick(self) -> None:
        if self._ledger is None:
            return
        accounts = self._ledger.snapshot()
        with self._lock:
            c = self._counts
            self._history.append(
                _Tick(
                    wall=self._wall_clock(),
                    busy=sum(a.busy for a in accounts),
                    idle=sum(a.idle for a in accounts),
                    inferences=c.inferences,
                    batches=c.batches,
                    metered_inferences=c.metered_inferences,
                    attributed=c.attributed,
                    stale=tuple(a.device for a in accounts if not a.ok),
                    cached=c.cached,
                )
            )

    def window_report(self, t0: float, t1: float) -> dict[str, Any]:
        """Energy and requests over [t0, t1] (Unix seconds), between the sampler ticks inside it.

        Keys are documented in docs/telemetry.md. Energy figures are None, never guessed,
        when nothing is measured or the window holds fewer than two ticks.
        """
        report: dict[str, Any] = {
            "available": self.available,
            "simulated": self.simulated,
            "requested_start": t0,
            "requested_end": t1,
            "start": None,
            "end": None,
            "duration_s": None,
            "sources": sorted(set(self._ledger.sources)) if self._ledger else [],
            "source": self._meter.source if self._meter else None,
            "devices": self._ledger.devices if self._ledger else [],
            "energy_joules": None,
            "busy_joules": None,
            "idle_joules": None,
            "average_power_watts": None,
            "inferences": None,
            "cached_inferences": None,
            "batches": None,
            "metered_inferences": None,
            "attributed_joules": None,
            "joules_per_inference": None,
            "busy_joules_per_inference": None,
            "stale_devices": [],
            "ticks": 0,
            "reason": None,
        }
        if not self.available:
            report["reason"] = f"no energy source: GPU: {self.gpu_reason}; RAPL: {self.rapl_reason}"
            return report
        with self._lock:
            inside = [t for t in self._history if t0 <= t.wall <= t1]
        report["ticks"] = len(inside)
        if len(inside) < 2:
            report["reason"] = "fewer than two sampler ticks inside the window"
            return report
        first, last = inside[0], inside[-1]
        busy, idle = last.busy - first.busy, last.idle - first.idle
        energy = busy + idle
        inferences = last.inferences - first.inferences
        cached = last.cached - first.cached
        answered = inferences + cached  # a cache hit: an inference with zero engine energy
        duration = last.wall - first.wall
        report.update(
            start=first.wall,
            end=last.wall,
            duration_s=duration,
            energy_joules=energy,
            busy_joules=busy,
            idle_joules=idle,
            average_power_watts=energy / duration if duration > 0 else None,
            inferences=inferences,
            cached_inferences=cached,
            batches=last.batches - first.batches,
            metered_inferences=last.metered_inferences - first.metered_inferences,
            attributed_joules=last.attributed - first.attributed,
            joules_per_inference=energy / answered if answered else None,
            busy_joules_per_inference=busy / answered if answered else None,
            stale_devices=sorted({d for t in inside for d in t.stale}),
        )
        return report
