"""A simulated GPU (``WATTSERVE_SIMULATED_GPU``): NVML answered from a power model that the
engines' real busy time drives, so the whole energy path runs where no GPU is lent.

Every engine (CPU and identity included) is metered as if its batches ran on this device:
the energy meter marks the device busy around each batch (``SimulatedEnergyMeter``), the
batch's size arrives with its record (``TelemetryService.record_batch``), and the device's
counter integrates the power model over that real time. The real NVML layer
(``telemetry/nvml_gpu.py``), sampler, poller, window attribution and metrics read it through
the same pynvml surface as the test double (``telemetry/nvml_double.py``).

Nothing it produces can pass for a measurement: its energy and power series carry
``source="simulated"``, its GPU label is ``simulated<N>`` (so utilization and memory series
say so too), its name says "Simulated", and RAPL is not metered beside it.

The power model (``PowerModel``): the device draws ``idle_watts`` when no batch runs; while a
batch of ``n`` rows runs it draws ``batch_watts(n) = min(max_watts, idle_watts + busy_watts +
watts_per_item * n ** item_exponent)`` (concurrent batches add their parts above idle). Over
a period with busy fraction ``f`` at batch size ``n`` the mean is ``watts(n, f) = idle_watts +
f * (batch_watts(n) - idle_watts)``. Its counter steps every ``counter_update_period_s`` and
its ``nvmlDeviceGetPowerUsage`` is the mean over the last ``power_average_window_s``.
"""

from __future__ import annotations

import json
import math
import threading
import time
import tomllib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from wattserve.telemetry.cumulative import SIMULATED, CounterEnergy
from wattserve.telemetry.energy import EnergyLedger, EnergyMeter
from wattserve.telemetry.nvml_double import NvmlSurface
from wattserve.telemetry.nvml_gpu import NvmlGpu
from wattserve.telemetry.windows import BatchSpan, union_length

SIZE_WAIT_S = 0.05  # a counter step waits this long at most for an ended batch's size
MAX_PENDING = 10_000  # spans kept waiting for their size (a batch never reported: dropped)


@dataclass(frozen=True)
class PowerModel:
    """Idle and busy power of the simulated device (watts), its counter's cadence."""

    name: str = "default"
    idle_watts: float = 70.0
    busy_watts: float = 150.0  # above idle while any batch runs
    watts_per_item: float = 6.0  # above that, per row of the batch (times n ** item_exponent)
    item_exponent: float = 1.0
    max_watts: float = 700.0  # the power limit
    counter_update_period_s: float = 0.05
    power_average_window_s: float = 1.0

    def batch_watts(self, size: int) -> float:
        """Power while one batch of ``size`` rows runs."""
        raw = self.idle_watts + self.busy_watts + self.watts_per_item * max(1, size) ** self.item_exponent
        return min(self.max_watts, raw)

    def watts(self, size: int, busy_fraction: float) -> float:
        """Mean power over a period that is ``busy_fraction`` busy at batch ``size``."""
        f = min(1.0, max(0.0, busy_fraction))
        return self.idle_watts + f * (self.batch_watts(size) - self.idle_watts)

    def validate(self) -> PowerModel:
        if self.idle_watts < 0 or self.busy_watts < 0 or self.watts_per_item < 0:
            raise ValueError("power model watts must be >= 0")
        if self.max_watts <= self.idle_watts:
            raise ValueError("power model max_watts must exceed idle_watts")
        if self.counter_update_period_s <= 0 or self.power_average_window_s <= 0:
            raise ValueError("power model periods must be > 0")
        if self.item_exponent <= 0:
            raise ValueError("power model item_exponent must be > 0")
        return self


# Built-in models by name. "superlinear": power grows with the square of the batch, so joules
# per item are least at a middling batch while seconds per item keep falling with size.
BUILTIN_MODELS: dict[str, PowerModel] = {
    "default": PowerModel(),
    "superlinear": PowerModel(
        name="superlinear", idle_watts=60.0, busy_watts=40.0, watts_per_item=2.5, item_exponent=2.0
    ),
}


def load_power_model(spec: str) -> PowerModel:
    """A built-in name, or a .toml/.json file of ``PowerModel`` fields. Raises ValueError with
    the reason (unknown name, missing file, unknown key, bad value)."""
    spec = spec.strip()
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec]
    path = Path(spec)
    if path.suffix.lower() not in (".toml", ".json"):
        raise ValueError(
            f"simulated GPU {spec!r}: not a built-in power model ({', '.join(BUILTIN_MODELS)}) "
            "nor a .toml/.json file"
        )
    try:
        text = path.read_text()
        data: Any = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"simulated GPU power model {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"simulated GPU power model {path}: a table of fields expected")
    known = {f.name for f in fields(PowerModel)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"simulated GPU power model {path}: unknown keys {unknown}; known: {sorted(known)}")
    values: dict[str, Any] = {"name": path.stem, **data}
    try:
        converted: dict[str, Any] = {k: (str(v) if k == "name" else float(v)) for k, v in values.items()}
        model = replace(PowerModel(), **converted)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"simulated GPU power model {path}: {exc}") from exc
    try:
        return model.validate()
    except ValueError as exc:
        raise ValueError(f"simulated GPU power model {path}: {exc}") from exc


class _Busy:
    """One batch on the device: [start, end) and its rows (None until reported)."""

    __slots__ = ("end", "size", "start")

    def __init__(self, start: float):
        self.start = start
        self.end: float | None = None
        self.size: int | None = None


class SimulatedGpu:
    """One simulated device: the ``NvmlDevice`` attributes, computed from busy intervals."""

    def __init__(self, model: PowerModel, index: int = 0, clock: Callable[[], float] = time.monotonic):
        self.model = model
        self.name = f"Simulated GPU (wattserve power model {model.name!r})"
        self.uuid = f"GPU-simulated-{index:04d}"
        self.calls: dict[str, int] = {}
        self.failing: int | None = None
        self.unsupported: set[str] = set()
        self.has_energy_counter = True
        self.has_instant_power = False  # one power series, source="simulated"
        self.average_power_w: float | None = None
        self.power_limit_w = model.max_watts
        self.memory_utilization = 0
        self.memory_used = 0
        self.memory_total = 80 * 2**30
        self.sm_clock_mhz = 1500
        self.temperature_c = 40
        self._clock = clock
        self._lock = threading.Lock()
        self._opened = self._settled_t = self._published_t = clock()
        self._settled_j = 0.0
        self._published_mj = 0.0
        self._open: list[_Busy] = []  # intervals not yet wholly inside the published counter
        self._recent: deque[_Busy] = deque()  # ended intervals of the averaging window
        self._last_size = 1

    # --- driven by the meter (engine threads) and the batch record (event loop) ---
    def busy_begin(self) -> _Busy:
        busy = _Busy(self._clock())
        with self._lock:
            self._open.append(busy)
        return busy

    def busy_end(self, busy: _Busy) -> None:
        with self._lock:
            busy.end = self._clock()
            self._recent.append(busy)

    def set_size(self, busy: _Busy, size: int) -> None:
        with self._lock:
            busy.size = max(1, int(size))
            self._last_size = busy.size

    # --- what NVML reads ---
    def _extra_w(self, busy: _Busy) -> float:
        return self.model.batch_watts(busy.size or self._last_size) - self.model.idle_watts

    def _settle(self, until: float) -> None:
        """Book energy up to ``until`` (idle plus every batch's part above it)."""
        t0 = self._settled_t
        joules = self.model.idle_watts * (until - t0)
        keep = []
        for busy in self._open:
            a, b = max(busy.start, t0), min(until if busy.end is None else busy.end, until)
            if b > a:
                joules += self._extra_w(busy) * (b - a)
            if busy.end is None or busy.end > until:
                keep.append(busy)
        self._open = keep
        self._settled_t, self._settled_j = until, self._settled_j + joules

    def counter_reading_mj(self) -> int:
        """The counter as of its last step; a step waits (at most SIZE_WAIT_S) for the size of
        a batch that ended before it, so the batch is charged at its own size."""
        now = self._clock()
        period = self.model.counter_update_period_s
        with self._lock:
            step = self._opened + math.floor((now - self._opened) / period) * period
            if step > self._published_t:
                waiting = any(
                    b.size is None and b.end is not None and b.end <= step and now - b.end < SIZE_WAIT_S
                    for b in self._open
                )
                if not waiting:
                    self._settle(step)
                    self._published_t, self._published_mj = step, self._settled_j * 1000.0
            return int(self._published_mj)

    def _busy_parts(self, start: float, now: float) -> tuple[float, float]:
        """(joules above idle, busy seconds) over [start, now]."""
        keep_s = self.model.power_average_window_s + 0.5  # what averages and utilization read
        while self._recent and self._recent[0].end is not None and self._recent[0].end < now - keep_s:
            self._recent.popleft()
        running = [b for b in self._open if b.end is None]
        extra, spans = 0.0, []
        for busy in [*self._recent, *running]:
            a, b = max(busy.start, start), min(now if busy.end is None else busy.end, now)
            if b > a:
                extra += self._extra_w(busy) * (b - a)
                spans.append((a, b))
        return extra, union_length(spans)

    @property
    def current_power_w(self) -> float:
        with self._lock:
            running = [b for b in self._open if b.end is None]
            return self.model.idle_watts + sum(self._extra_w(b) for b in running)

    def moving_average_w(self, now: float, window_s: float | None = None) -> float:
        window = window_s or self.model.power_average_window_s
        with self._lock:
            extra, _ = self._busy_parts(now - window, now)
        return self.model.idle_watts + extra / window

    @property
    def utilization(self) -> int:
        """Percent of the averaging window in which a batch ran (NVML's utilization.gpu)."""
        now, window = self._clock(), self.model.power_average_window_s
        with self._lock:
            _, busy = self._busy_parts(now - window, now)
        return round(100.0 * min(1.0, busy / window))


class SimulatedNvml(NvmlSurface):
    """``pynvml`` answered by simulated GPUs on the real monotonic clock."""

    def __init__(self, model: PowerModel, count: int = 1, clock: Callable[[], float] = time.monotonic):
        super().__init__([SimulatedGpu(model, i, clock) for i in range(count)])
        self.model = model
        self._clock = clock

    def clock(self) -> float:
        return self._clock()


class SimulatedNvmlGpu(NvmlGpu):
    """A simulated GPU as the exporter sees it: labelled ``simulated<N>``, power series
    ``source="simulated"``."""

    power_sources = (SIMULATED, SIMULATED)

    @property
    def label(self) -> str:
        return f"{SIMULATED}{self.index}"

    @property
    def device(self) -> SimulatedGpu:
        gpu: SimulatedGpu = self.nvml.gpus[self.index]
        return gpu


class SimulatedCounterEnergy(CounterEnergy):
    """The simulated GPU's counter, booked under ``source="simulated"``."""

    source = SIMULATED

    def __init__(self, gpu: NvmlGpu):
        super().__init__(gpu)
        self.device = f"{SIMULATED}-gpu{gpu.index}"


class SimulatedEnergyMeter(EnergyMeter):
    """The meter of every engine while the GPU is simulated: it marks the device busy around
    each batch (real time, the engine's worker thread) and hands it the batch's size when
    the batch is recorded (``set_size``)."""

    def __init__(self, ledger: EnergyLedger, devices: list[str], gpus: list[SimulatedGpu]):
        super().__init__(ledger, devices)
        self.gpus = gpus
        self._busy: dict[BatchSpan, list[_Busy]] = {}
        self._lock = threading.Lock()

    def begin(self) -> BatchSpan:
        marks = [g.busy_begin() for g in self.gpus]
        span = super().begin()
        with self._lock:
            self._busy[span] = marks
            while len(self._busy) > MAX_PENDING:  # never reported: forget (it counts at the last size)
                self._busy.pop(next(iter(self._busy)))
        return span

    def end(self, mark: object) -> BatchSpan:
        with self._lock:
            marks = self._busy.get(mark) if isinstance(mark, BatchSpan) else None
        for gpu, busy in zip(self.gpus, marks or [], strict=False):
            gpu.busy_end(busy)
        return super().end(mark)

    def set_size(self, span: object, size: int) -> None:
        """The batch's rows, from its record (after it ended)."""
        with self._lock:
            marks = self._busy.pop(span, None) if isinstance(span, BatchSpan) else None
        for gpu, busy in zip(self.gpus, marks or [], strict=False):
            gpu.set_size(busy, size)
