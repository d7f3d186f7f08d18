"""Per-batch energy, and the ledger that books every joule as busy or idle.

The engine worker thread calls ``meter.begin()`` right before ``engine.infer(batch)`` and
``meter.end(mark)`` right after it (the engine returns numpy, so CUDA work has finished). Each
call reads every metered device once (one NVML call per GPU for the energy counter) under the
ledger's lock, and the ledger books the energy since the previous read, by anyone (another
batch, the sampler thread), as *busy* when at least one batch was executing and *idle*
otherwise. Busy + idle is exactly the devices' energy, even when engine instances overlap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from telemetry.cumulative import NVML_COUNTER, NVML_POWER_INTEGRATED, RAPL, CumulativeEnergy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchEnergy:
    """Energy over one batch's execution window, summed over the metered devices."""

    joules: float
    source: str  # "nvml_counter" | "nvml_power_integrated" | "rapl"


@dataclass
class DeviceAccount:
    """One metered device's running totals (joules since the service started)."""

    energy: CumulativeEnergy
    last: float | None = None  # the last successful cumulative reading
    busy: float = 0.0
    idle: float = 0.0
    ok: bool = True  # False while reads fail
    errors: int = 0

    @property
    def total(self) -> float:
        return self.busy + self.idle


@dataclass(frozen=True)
class AccountSnapshot:
    device: str
    source: str
    label: str
    busy: float
    idle: float
    ok: bool


class EnergyLedger:
    """Serialises reads of the metered devices and books their energy busy or idle.

    A device whose read fails keeps its last reading; when it answers again, the energy of
    the gap is booked by the state at that moment (documented in docs/telemetry.md).
    """

    def __init__(self, energies: Sequence[CumulativeEnergy]):
        if not energies:
            raise ValueError("an energy ledger needs at least one device")
        self._lock = threading.Lock()
        self._accounts = [DeviceAccount(e) for e in energies]
        self._active = 0

    @property
    def sources(self) -> list[str]:
        return [a.energy.source for a in self._accounts]

    @property
    def devices(self) -> list[str]:
        return [a.energy.device for a in self._accounts]

    def _read_all(self) -> list[float | None]:
        readings: list[float | None] = []
        for account in self._accounts:
            try:
                value = account.energy.read_joules()
            except Exception as exc:  # NVMLError, OSError: the device, not us
                if account.ok:
                    log.warning("energy read of %s failed: %s", account.energy.device, exc)
                account.ok = False
                account.errors += 1
                readings.append(None)
                continue
            if not account.ok:
                log.warning("energy read of %s works again", account.energy.device)
            account.ok = True
            if account.last is not None:
                delta = max(0.0, value - account.last)
                if self._active:
                    account.busy += delta
                else:
                    account.idle += delta
            account.last = value
            readings.append(value)
        return readings

    def enter(self) -> list[float | None]:
        """A batch starts executing now."""
        with self._lock:
            readings = self._read_all()
            self._active += 1
            return readings

    def leave(self) -> list[float | None]:
        """A batch stopped executing now."""
        with self._lock:
            readings = self._read_all()
            self._active = max(0, self._active - 1)
            return readings

    def tick(self) -> list[float | None]:
        """A read with no state change (the sampler's), so busy/idle stay current."""
        with self._lock:
            return self._read_all()

    def snapshot(self) -> list[AccountSnapshot]:
        with self._lock:
            return [
                AccountSnapshot(
                    a.energy.device,
                    a.energy.source,
                    a.energy.label,
                    a.busy,
                    a.idle,
                    a.ok,
                )
                for a in self._accounts
            ]


def combined_source(sources: Sequence[str]) -> str:
    """The label of a sum: the counter only when every device used its counter."""
    if all(s == NVML_COUNTER for s in sources):
        return NVML_COUNTER
    if all(s == RAPL for s in sources):
        return RAPL
    return NVML_POWER_INTEGRATED


class _Mark:
    __slots__ = ("ended", "readings")

    def __init__(self, readings: list[float | None]):
        self.readings = readings
        self.ended = False


class EnergyMeter:
    """Energy of one batch: the delta of every metered device's reading across the batch.

    ``end`` must be called exactly once for every ``begin`` (in a ``finally``, also when the
    batch failed), so the busy/idle books stay balanced.
    """

    def __init__(self, ledger: EnergyLedger):
        self.ledger = ledger
        self.source = combined_source(ledger.sources)

    @property
    def devices(self) -> list[str]:
        return self.ledger.devices

    def begin(self) -> object:
        return _Mark(self.ledger.enter())

    def end(self, mark: object) -> BatchEnergy | None:
        if not isinstance(mark, _Mark):
            raise TypeError("end() takes the object begin() returned")
        if mark.ended:
            raise RuntimeError("end() called twice for one begin()")
        mark.ended = True
        after = self.ledger.leave()
        if any(v is None for v in mark.readings) or any(v is None for v in after):
            return None  # a device did not answer: no partial (understated) figure
        joules = sum(a - b for a, b in zip(after, mark.readings, strict=False))  # type: ignore[operator]
        return BatchEnergy(joules=max(0.0, joules), source=self.source)
