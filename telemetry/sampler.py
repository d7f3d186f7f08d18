"""The sampler thread: every interval, read every device and update the exported metrics.

It runs in its own daemon thread (never on the event loop), survives any device error (the
device is marked stale and its gauges withdrawn until it answers again), and stops within one
``Event.wait`` when asked.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from wattserve.telemetry.cumulative import RAPL, Clock, RaplEnergy
from wattserve.telemetry.energy import EnergyLedger
from wattserve.telemetry.metrics import TelemetryMetrics
from wattserve.telemetry.nvml_gpu import NvmlGpu

log = logging.getLogger(__name__)

POWER_SOURCES = ("nvml_average", "nvml_instant")


class Sampler:
    """Samples GPUs (status), the energy ledger (counters, busy/idle) and extra RAPL zones.

    The ledger holds every GPU and RAPL package since energy follows the engine's device, so
    ``extra_rapl`` is empty when the service builds it; it stays for a ledger-less sampler."""

    def __init__(
        self,
        metrics: TelemetryMetrics,
        gpus: Sequence[NvmlGpu],
        ledger: EnergyLedger | None,
        extra_rapl: Sequence[RaplEnergy],
        interval_s: float,
        on_tick: Callable[[], None] | None = None,
        clock: Clock = time.monotonic,
    ):
        self.metrics = metrics
        self.gpus = list(gpus)
        self.ledger = ledger
        self.extra_rapl = list(extra_rapl)
        self.interval_s = interval_s
        self.on_tick = on_tick
        self.clock = clock
        self.samples = 0
        self._status_ok: dict[str, bool] = {g.label: True for g in self.gpus}
        self._exported: dict[tuple[str, str], float] = {}  # (device, state) -> joules exported
        self._rapl_last: dict[str, tuple[float, float]] = {}  # domain -> (t, joules)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for gpu in self.gpus:
            metrics.gpu_info.labels(gpu.label, gpu.name, gpu.uuid).set(1)
            metrics.gpu_stale.labels(gpu.label).set(0)
            metrics.gpu_sample_errors.labels(gpu.label)

    # --- thread control ---
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="wattserve-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("telemetry sampler did not stop within %.1f s", timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        # start() is preceded by one sample (the cost measurement), so wait first.
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.sample_once()
            next_at += self.interval_s
            if next_at < time.monotonic():  # fell behind (slow NVML, busy CPU): no catching up
                next_at = time.monotonic()

    # --- one pass ---
    def sample_once(self) -> None:
        """Read everything once; never raises."""
        started = time.perf_counter()
        try:
            for gpu in self.gpus:
                self._sample_gpu(gpu)
            if self.ledger is not None:
                self.ledger.tick()
                self._export_ledger()
            for rapl in self.extra_rapl:
                self._sample_extra_rapl(rapl)
            if self.on_tick is not None:
                self.on_tick()
        except Exception:  # a bug here must not kill the thread that keeps metrics alive
            log.exception("telemetry sample failed")
        self.samples += 1
        self.metrics.sample_cost.observe(time.perf_counter() - started)

    def _sample_gpu(self, gpu: NvmlGpu) -> None:
        m, label = self.metrics, gpu.label
        try:
            status = gpu.status()
        except Exception as exc:
            m.gpu_sample_errors.labels(label).inc()
            if self._status_ok[label]:
                log.warning("GPU %s sample failed, marking it stale: %s", label, exc)
                self._withdraw_gpu(label, gpu.power_sources)
            self._status_ok[label] = False
            self._update_stale(label)
            return
        if not self._status_ok[label]:
            log.warning("GPU %s answers again", label)
        self._status_ok[label] = True
        for gauge, value, labels in (
            (m.gpu_power, status.power_average_w, (label, gpu.power_sources[0])),
            (m.gpu_power, status.power_instant_w, (label, gpu.power_sources[1])),
            (m.gpu_power_limit, status.power_limit_w, (label,)),
            (m.gpu_utilization, status.utilization, (label,)),
            (m.gpu_memory_utilization, status.memory_utilization, (label,)),
            (m.gpu_memory_used, status.memory_used_bytes, (label,)),
            (m.gpu_memory_total, status.memory_total_bytes, (label,)),
            (m.gpu_sm_clock, status.sm_clock_hz, (label,)),
            (m.gpu_temperature, status.temperature_c, (label,)),
        ):
            if value is not None:  # unsupported readings are not exported, not zero
                gauge.labels(*labels).set(value)
        self._update_stale(label)

    def _withdraw_gpu(self, label: str, sources: Sequence[str] = POWER_SOURCES) -> None:
        """Remove the GPU's gauge series so no old value is scraped as if it were current."""
        m = self.metrics
        for source in set(sources):
            _remove(m.gpu_power, label, source)
        for gauge in (
            m.gpu_power_limit,
            m.gpu_utilization,
            m.gpu_memory_utilization,
            m.gpu_memory_used,
            m.gpu_memory_total,
            m.gpu_sm_clock,
            m.gpu_temperature,
        ):
            _remove(gauge, label)

    def _update_stale(self, label: str) -> None:
        energy_ok = True
        if self.ledger is not None:
            energy_ok = all(a.ok for a in self.ledger.snapshot() if a.label == label)
        self.metrics.gpu_stale.labels(label).set(0 if self._status_ok[label] and energy_ok else 1)

    def _export_ledger(self) -> None:
        assert self.ledger is not None
        m = self.metrics
        for account in self.ledger.snapshot():
            if account.update_period_s is not None:
                m.energy_update_period.labels(account.device, account.source).set(account.update_period_s)
            if account.idle_power_w is not None:
                m.energy_idle_power.labels(account.device, account.source).set(account.idle_power_w)
            for state, value in (("busy", account.busy), ("idle", account.idle)):
                key = (account.device, state)
                delta = value - self._exported.get(key, 0.0)
                m.energy_state.labels(account.device, account.source, state).inc(max(0.0, delta))
                self._exported[key] = value
            total = account.busy + account.idle
            key = (account.device, "total")
            delta = max(0.0, total - self._exported.get(key, 0.0))
            self._exported[key] = total
            if account.source == RAPL:
                m.cpu_energy.labels(account.label, RAPL).inc(delta)
                self._set_rapl_power(account.label, total)
            else:
                m.gpu_energy.labels(account.label, account.source).inc(delta)
                if account.label in self._status_ok:
                    self._update_stale(account.label)

    def _sample_extra_rapl(self, rapl: RaplEnergy) -> None:
        try:
            total = rapl.read_joules()
        except OSError as exc:
            log.warning("RAPL read of %s failed: %s", rapl.device, exc)
            return
        key = (rapl.device, "total")
        delta = max(0.0, total - self._exported.get(key, 0.0))
        self._exported[key] = total
        self.metrics.cpu_energy.labels(rapl.label, RAPL).inc(delta)
        self._set_rapl_power(rapl.label, total)

    def _set_rapl_power(self, domain: str, total_j: float) -> None:
        now = self.clock()
        previous = self._rapl_last.get(domain)
        self._rapl_last[domain] = (now, total_j)
        if previous is not None and now > previous[0]:
            self.metrics.cpu_power.labels(domain).set((total_j - previous[1]) / (now - previous[0]))


def _remove(metric, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
