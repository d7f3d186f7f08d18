"""The energy ledger (every metered device's counter, read under one lock) and the meter.

The engine worker thread calls ``meter.begin()`` right before ``engine.infer(batch)`` and
``meter.end(mark)`` right after it (the engine returns numpy, so device work has finished).
Both read the meter's devices once, so window boundaries near a batch are sharp; the energy
poller and the sampler read every device in between. Each reading goes to that device's
``DeviceWindows`` (telemetry/windows.py), which books every counter joule as busy (divided
among the batches that ran in the window) or idle. A batch's figure is final one counter step
after it ended; ``end`` returns its ``BatchSpan``, and ``TelemetryService.record_batch``
observes it in the energy histograms when it is.

A meter covers the devices its engine runs on: one GPU for a CUDA engine, the RAPL packages
(or nothing) for a CPU engine, so a CPU engine on a GPU host is never charged GPU energy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from wattserve.telemetry.cumulative import (
    NVML_COUNTER,
    NVML_POWER_INTEGRATED,
    RAPL,
    SIMULATED,
    Clock,
    CumulativeEnergy,
)
from wattserve.telemetry.windows import BatchSpan, DeviceWindows

log = logging.getLogger(__name__)


@dataclass
class DeviceAccount:
    """One metered device: its reader, its windows, and whether it answers."""

    energy: CumulativeEnergy
    windows: DeviceWindows
    ok: bool = True  # False while reads fail
    errors: int = 0


@dataclass(frozen=True)
class AccountSnapshot:
    device: str
    source: str
    label: str
    busy: float
    idle: float
    ok: bool
    update_period_s: float | None
    idle_power_w: float | None


class EnergyLedger:
    """Serialises reads of the metered devices and feeds them to their windows.

    A device whose read fails keeps its last reading; when it answers again, the gap is one
    long window booked like any other. A batch during which its device failed to answer at
    start or end gets no figure (its share of the window goes to idle).
    """

    def __init__(self, energies: Sequence[CumulativeEnergy], clock: Clock = time.monotonic):
        if not energies:
            raise ValueError("an energy ledger needs at least one device")
        self._lock = threading.Lock()
        self._clock = clock
        self._accounts = [DeviceAccount(e, DeviceWindows(e.device, e.source)) for e in energies]

    @property
    def sources(self) -> list[str]:
        return [a.energy.source for a in self._accounts]

    @property
    def devices(self) -> list[str]:
        return [a.energy.device for a in self._accounts]

    def index_of(self, device: str) -> int:
        return self.devices.index(device)

    def windows(self, index: int) -> DeviceWindows:
        return self._accounts[index].windows

    def _read(self, indices: Sequence[int] | None) -> tuple[list[bool], list[BatchSpan]]:
        """Read the devices; returns which answered, and the batches that became final."""
        answered: list[bool] = []
        finished: list[BatchSpan] = []
        for i in range(len(self._accounts)) if indices is None else indices:
            account = self._accounts[i]
            try:
                value = account.energy.read_joules()
            except Exception as exc:  # NVMLError, OSError: the device, not us
                if account.ok:
                    log.warning("energy read of %s failed: %s", account.energy.device, exc)
                account.ok = False
                account.errors += 1
                answered.append(False)
                continue
            if not account.ok:
                log.warning("energy read of %s works again", account.energy.device)
            account.ok = True
            finished += account.windows.observe(self._clock(), value)
            answered.append(True)
        return answered, finished

    def tick(self) -> None:
        """Read every device (the poller's and the sampler's reads)."""
        with self._lock:
            _, finished = self._read(None)
        _report(finished)

    def open_span(self, indices: Sequence[int], source: str) -> BatchSpan:
        """A batch starts on these devices now."""
        with self._lock:
            answered, finished = self._read(indices)
            span = BatchSpan([self._accounts[i].energy.device for i in indices], source, self._clock())
            for i, ok in zip(indices, answered, strict=True):
                windows = self._accounts[i].windows
                if ok:
                    windows.add(span)
                else:
                    windows.fail(span)
        _report([*finished, span])
        return span

    def close_span(self, indices: Sequence[int], span: BatchSpan) -> None:
        """The batch stopped executing now."""
        with self._lock:
            span.end = self._clock()
            answered, finished = self._read(indices)
            for i, ok in zip(indices, answered, strict=True):
                if not ok:
                    self._accounts[i].windows.fail(span)
        _report([*finished, span])

    def snapshot(self) -> list[AccountSnapshot]:
        with self._lock:
            return [
                AccountSnapshot(
                    a.energy.device,
                    a.energy.source,
                    a.energy.label,
                    a.windows.busy,
                    a.windows.idle,
                    a.ok,
                    a.windows.update_period_s,
                    a.windows.idle_power_w,
                )
                for a in self._accounts
            ]


def _report(spans: Sequence[BatchSpan]) -> None:
    for span in spans:
        span._maybe_report()


def combined_source(sources: Sequence[str]) -> str:
    """The label of a sum: the counter only when every device used its counter."""
    if all(s == NVML_COUNTER for s in sources):
        return NVML_COUNTER
    if all(s == RAPL for s in sources):
        return RAPL
    if all(s == SIMULATED for s in sources):
        return SIMULATED
    return NVML_POWER_INTEGRATED


class EnergyMeter:
    """Energy of batches on some of the ledger's devices (those one engine runs on).

    ``end`` must be called exactly once for every ``begin`` (in a ``finally``, also when the
    batch failed). It returns the batch's ``BatchSpan``, whose figure is final later.
    """

    def __init__(self, ledger: EnergyLedger, devices: Sequence[str] | None = None):
        self.ledger = ledger
        names = ledger.devices if devices is None else list(devices)
        self._indices = [ledger.index_of(d) for d in names]
        if not self._indices:
            raise ValueError("an energy meter needs at least one device")
        self.source = combined_source([ledger.sources[i] for i in self._indices])

    @property
    def devices(self) -> list[str]:
        return [self.ledger.devices[i] for i in self._indices]

    def begin(self) -> BatchSpan:
        return self.ledger.open_span(self._indices, self.source)

    def end(self, mark: object) -> BatchSpan:
        if not isinstance(mark, BatchSpan):
            raise TypeError("end() takes the object begin() returned")
        if mark.end is not None:
            raise RuntimeError("end() called twice for one begin()")
        self.ledger.close_span(self._indices, mark)
        return mark
