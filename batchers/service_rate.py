"""How fast the engine instances drain the queue, learned from the batches they run.

Used to bound the queue by time as well as by count: a request is refused at admission
when the work already queued would take longer than a bound at the best rate the engine
can reach. That rate is optimistic on purpose: a refusal must mean "even at full batches
this queue cannot be served in time", never "light load ran small batches". Until a
full batch has been measured, a full batch is assumed to take as long as the largest
batch seen so far (true of GPUs, optimistic for CPUs); under overload full batches run
at once and the measured figure takes over.
"""

from __future__ import annotations

from wattserve.batchers.size_ewma import SizeEwma


class ServiceRate:
    """Per batch size, an EWMA of compute seconds; the best items/second it implies."""

    def __init__(self, instances: int, max_batch_size: int, alpha: float = 0.2) -> None:
        self.instances = max(1, instances)
        self.max_batch_size = max(1, max_batch_size)
        self._seconds = SizeEwma(alpha)
        self.best_items_per_s = 0.0  # per instance; 0 until a batch was measured

    def observe(self, size: int, seconds: float) -> None:
        if size <= 0 or seconds <= 0:
            return
        self._seconds.update(size, seconds)
        measured = max(n / t for n, t in self._seconds.items())
        full = self.max_batch_size
        if full not in self._seconds:  # extrapolate: a full batch as long as the largest seen
            largest = max(self._seconds)
            measured = max(measured, full / self._seconds[largest])
        self.best_items_per_s = measured

    def wait_s(self, queued: int) -> float:
        """Seconds the instances need to compute ``queued`` items (0 when nothing is known)."""
        if self.best_items_per_s <= 0:
            return 0.0
        return queued / (self.best_items_per_s * self.instances)
