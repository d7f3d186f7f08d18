"""How fast the engine instances drain the queue, learned from the batches they run.

Used to bound the queue by time as well as by count: a request is refused at admission
when the work already queued would take longer than a bound at the best rate measured.
The best (not the mean) rate is used on purpose: a refusal must mean "even at full
batches this queue cannot be served in time", never "light load ran small batches".
"""

from __future__ import annotations


class ServiceRate:
    """Per batch size, an EWMA of compute seconds; the best items/second over sizes."""

    def __init__(self, instances: int, alpha: float = 0.2) -> None:
        self.instances = max(1, instances)
        self.alpha = alpha
        self._seconds: dict[int, float] = {}
        self.best_items_per_s = 0.0  # per instance; 0 until a batch was measured

    def observe(self, size: int, seconds: float) -> None:
        if size <= 0 or seconds <= 0:
            return
        old = self._seconds.get(size)
        new = seconds if old is None else old + self.alpha * (seconds - old)
        self._seconds[size] = new
        self.best_items_per_s = max(n / t for n, t in self._seconds.items())

    def wait_s(self, queued: int) -> float:
        """Seconds the instances need to compute ``queued`` items (0 when nothing is known)."""
        if self.best_items_per_s <= 0:
            return 0.0
        return queued / (self.best_items_per_s * self.instances)
