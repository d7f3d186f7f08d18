"""Cumulative energy readers: each turns one device's raw readings into joules since open.

Three kinds, one interface (``read_joules``, monotonic non-decreasing):
- ``CounterEnergy``: the GPU's own millijoule counter (exact; Volta and newer);
- ``IntegratedPowerEnergy``: sampled power integrated by the trapezoid rule over every read
  (so it gets better the more often anything reads it: batch begin/end and sampler ticks);
- ``RaplEnergy``: a RAPL package counter, unwrapped at ``max_energy_range_uj``.

They are not thread-safe on their own; ``EnergyLedger`` serialises every read under its lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from wattserve.telemetry.nvml_gpu import NvmlGpu
from wattserve.telemetry.rapl import RaplDomain, unwrap_delta_uj

Clock = Callable[[], float]

NVML_COUNTER = "nvml_counter"
NVML_POWER_INTEGRATED = "nvml_power_integrated"
RAPL = "rapl"
SIMULATED = "simulated"  # telemetry/simulated_gpu.py: a power model, never a measurement


class CumulativeEnergy(Protocol):
    device: str  # e.g. "gpu0", "package-0"
    label: str  # the exporter's gpu/domain label value, e.g. "0", "package-0"
    source: str  # NVML_COUNTER | NVML_POWER_INTEGRATED | RAPL | SIMULATED

    def read_joules(self) -> float: ...


class CounterEnergy:
    """Joules from the GPU counter since the first read; one NVML call per read."""

    source = NVML_COUNTER

    def __init__(self, gpu: NvmlGpu):
        self.gpu = gpu
        self.device = f"gpu{gpu.index}"
        self.label = gpu.label
        self._last_mj: int | None = None
        self._total_mj = 0

    def read_joules(self) -> float:
        raw = self.gpu.read_energy_mj()
        if self._last_mj is not None:
            # A smaller value means the counter restarted (driver reload): count on from 0.
            self._total_mj += raw - self._last_mj if raw >= self._last_mj else raw
        self._last_mj = raw
        return self._total_mj / 1000.0


class IntegratedPowerEnergy:
    """Joules from sampled power (trapezoid rule between consecutive reads)."""

    source = NVML_POWER_INTEGRATED

    def __init__(
        self,
        device: str,
        label: str,
        read_power_w: Callable[[], float],
        clock: Clock = time.monotonic,
    ):
        self.device = device
        self.label = label
        self._read_power_w = read_power_w
        self._clock = clock
        self._last: tuple[float, float] | None = None  # (t, watts)
        self._joules = 0.0

    @classmethod
    def for_gpu(cls, gpu: NvmlGpu, clock: Clock = time.monotonic) -> IntegratedPowerEnergy:
        return cls(f"gpu{gpu.index}", gpu.label, gpu.read_power_w, clock)

    def read_joules(self) -> float:
        watts = self._read_power_w()
        now = self._clock()
        if self._last is not None:
            t0, w0 = self._last
            self._joules += 0.5 * (w0 + watts) * max(0.0, now - t0)
        self._last = (now, watts)
        return self._joules


class RaplEnergy:
    """Joules from a RAPL package counter since the first read, wraparound corrected."""

    source = RAPL

    def __init__(self, domain: RaplDomain):
        self.domain = domain
        self.device = domain.name
        self.label = domain.name
        self._last_uj: int | None = None
        self._total_uj = 0

    def read_joules(self) -> float:
        raw = self.domain.read_uj()
        if self._last_uj is not None:
            self._total_uj += unwrap_delta_uj(self._last_uj, raw, self.domain.max_energy_range_uj)
        self._last_uj = raw
        return self._total_uj / 1e6
