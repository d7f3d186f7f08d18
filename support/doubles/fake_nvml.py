"""FakeNvml: a TEST DOUBLE of the slice of the ``pynvml`` module (nvidia-ml-py) wattserve uses.

This machine has no GPU, so the telemetry arithmetic is tested against simulated GPUs on a
simulated clock. The double models what the hardware does, or tests against it would prove
nothing:

- the GPU draws ``power_w`` while idle and ``busy_power_w`` while a test marks a kernel as
  running (``active > 0``); the true energy is integrated exactly over simulated time, and
  kept apart as busy/idle ground truth (``true_busy_j``, ``true_idle_j``);
- ``nvmlDeviceGetTotalEnergyConsumption`` is a stepwise counter: it shows the true energy as
  of its last update, updated every ``update_period_s`` (Hopper: ~20-100 ms; 0 = every read)
  and rounded down to ``quantum_mj``;
- ``nvmlDeviceGetPowerUsage`` is the 1 s moving average of true power (Ampere and newer);
- ``NVML_FI_DEV_POWER_INSTANT`` is the instantaneous power.

The pynvml surface (``telemetry/nvml_double.py``) reuses nvidia-ml-py's own pure-Python
pieces (constants, ``NVMLError`` classes, the ctypes field-value struct) so error handling and
field parsing run the real code paths; only the calls into libnvidia-ml.so are simulated. The
server's simulated GPU shares that surface; this double is never used outside tests.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import pynvml as _real
from wattserve.telemetry.nvml_double import (  # the surface's constants, re-exported for tests
    NVML_CLOCK_SM,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_FI_DEV_POWER_INSTANT,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    NVML_VALUE_TYPE_UNSIGNED_INT,
    NVMLError,
    NvmlSurface,
)

NVML_ERROR_GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_LIBRARY_NOT_FOUND = _real.NVML_ERROR_LIBRARY_NOT_FOUND

__all__ = [
    "NVML_CLOCK_SM",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_FI_DEV_POWER_INSTANT",
    "NVML_SUCCESS",
    "NVML_TEMPERATURE_GPU",
    "NVML_VALUE_TYPE_UNSIGNED_INT",
    "FakeGpu",
    "FakeNvml",
    "NVMLError",
]


@dataclass
class FakeGpu:
    """One simulated GPU. Power in watts; true energy integrates it exactly over fake time."""

    name: str = "Fake GPU (test double)"
    uuid: str = "GPU-00000000-fake"
    power_w: float = 100.0  # drawn while no kernel runs (and while one runs, unless busy_power_w)
    busy_power_w: float | None = None  # drawn while ``active > 0``
    active: int = 0  # kernels running now (tests raise/lower it around a batch)
    average_power_w: float | None = None  # forces nvmlDeviceGetPowerUsage (default: 1 s average)
    power_limit_w: float = 700.0
    energy_mj: float = 1_000_000.0  # true energy since "driver load" (set to 0: a driver reload)
    update_period_s: float = 0.0  # the counter's update period; 0: it follows every read
    quantum_mj: float = 1.0  # the counter's resolution
    update_phase_s: float = 0.0  # first update at this simulated time (then every period)
    has_energy_counter: bool = True
    has_instant_power: bool = True
    utilization: int = 50
    memory_utilization: int = 20
    memory_used: int = 10 * 2**30
    memory_total: int = 141 * 2**30
    sm_clock_mhz: int = 1980
    temperature_c: int = 45
    failing: int | None = None  # an NVML error code every call raises while set
    unsupported: set[str] = field(default_factory=set)  # calls answering NOT_SUPPORTED
    calls: dict[str, int] = field(default_factory=dict)
    true_busy_j: float = 0.0  # ground truth: energy drawn while a kernel ran
    true_idle_j: float = 0.0  # ground truth: energy drawn while none ran
    counter_mj: float | None = None  # the counter's last update (stepwise mode)
    history: list[tuple[float, float, float]] = field(default_factory=list)  # (t0, t1, watts)

    @property
    def current_power_w(self) -> float:
        if self.active > 0 and self.busy_power_w is not None:
            return self.busy_power_w
        return self.power_w

    def counter_reading_mj(self) -> int:
        """What nvmlDeviceGetTotalEnergyConsumption shows now."""
        shown = self.energy_mj if self.update_period_s <= 0 or self.counter_mj is None else self.counter_mj
        return int(math.floor(shown / self.quantum_mj) * self.quantum_mj)

    def moving_average_w(self, now: float, window_s: float = 1.0) -> float:
        """Mean true power over the last ``window_s`` (before the first segment: its power)."""
        if not self.history:
            return self.current_power_w
        start = now - window_s
        joules = max(0.0, self.history[0][0] - start) * self.history[0][2]
        for t0, t1, watts in self.history:
            joules += max(0.0, min(t1, now) - max(t0, start)) * watts
        return joules / window_s

    def run(self, t0: float, seconds: float) -> None:
        """Draw the current power over [t0, t0 + seconds]; the counter updates on schedule."""
        watts, end = self.current_power_w, t0 + seconds
        if self.update_period_s > 0 and self.counter_mj is None:
            self.counter_mj = self.energy_mj
        t = t0
        while t < end:
            step_end, updates = end, False
            if self.update_period_s > 0:
                k = math.floor((t - self.update_phase_s) / self.update_period_s + 1e-9) + 1
                next_update = self.update_phase_s + k * self.update_period_s
                if next_update <= end + 1e-12:
                    step_end, updates = min(next_update, end), True
            joules = watts * (step_end - t)
            self.energy_mj += joules * 1000.0
            if self.active > 0:
                self.true_busy_j += joules
            else:
                self.true_idle_j += joules
            if updates:
                self.counter_mj = self.energy_mj
            t = step_end
        if seconds > 0:
            self.history.append((t0, end, watts))
            while self.history and self.history[0][1] < end - 2.0:
                self.history.pop(0)


class FakeNvml(NvmlSurface):
    """Drop-in for ``import pynvml``: pass an instance where the code takes ``nvml=``.

    The pynvml surface itself is ``telemetry/nvml_double.py``'s (shared with the server's
    simulated GPU); this class adds the simulated clock tests advance."""

    def __init__(
        self, gpus: list[FakeGpu] | None = None, init_error: int | None = None, realtime: bool = False
    ):
        super().__init__(gpus if gpus is not None else [FakeGpu()], init_error)
        self.now = 0.0  # simulated seconds, advanced by advance() (or by real time, below)
        self.realtime = realtime  # every device call first lets the real time since then pass
        self._started_at = time.monotonic()
        self._lock = threading.Lock()

    # --- test controls ---
    def clock(self) -> float:
        """The simulated monotonic clock (pass as ``clock=`` to power integration)."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Let simulated time pass; every GPU draws its current power meanwhile."""
        with self._lock:
            for gpu in self.gpus:
                gpu.run(self.now, seconds)
            self.now += seconds

    def sleep(self, seconds: float) -> None:
        """A ``time.sleep`` stand-in on the simulated clock (pass as ``sleep=``)."""
        self.advance(seconds)

    def _before_call(self) -> None:
        if self.realtime:
            with self._lock:
                elapsed = time.monotonic() - self._started_at - self.now
            if elapsed > 0:
                self.advance(elapsed)
