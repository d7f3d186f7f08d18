"""The energy poller: reads every metered device's counter often enough to place its steps.

A stepwise counter (NVML on Hopper: every ~20-100 ms) tells when it stepped only to within
the gap between two reads; the sampler's 100 ms would blur every window edge by up to a whole
step. This thread reads only the energy counters (one NVML call per GPU, ~10-50 us) every
``interval_s``, chosen from the measured update period (a tenth of it, 2-20 ms).
"""

from __future__ import annotations

import logging
import threading
import time

from wattserve.telemetry.energy import EnergyLedger

log = logging.getLogger(__name__)

MIN_POLL_S = 0.002
MAX_POLL_S = 0.02


def poll_interval(update_period_s: float | None) -> float:
    """A tenth of the counter's update period, within [2 ms, 20 ms] (10 ms when unknown)."""
    if update_period_s is None:
        return 0.01
    return min(MAX_POLL_S, max(MIN_POLL_S, update_period_s / 10.0))


class EnergyPoller:
    def __init__(self, ledger: EnergyLedger, interval_s: float):
        self.ledger = ledger
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> None:
        try:
            self.ledger.tick()
        except Exception:  # a bug here must not kill the thread that keeps windows closing
            log.exception("energy poll failed")

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="wattserve-energy-poll", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.poll_once()
            next_at += self.interval_s
            if next_at < time.monotonic():
                next_at = time.monotonic()
