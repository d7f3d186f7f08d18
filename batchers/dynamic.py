"""dynamic: Triton's dynamic batcher, one knob one meaning; sizes count rows of whole
requests (Triton never splits a request).

- A batch goes at once when whole requests at the head of the queue add up to a
  preferred size (the largest such), or when they reach the largest preferred size (or
  max_batch_size when none is set) -- a lone request that large goes alone, at once.
- A batch also goes at once when it cannot grow: the next queued request has another
  shape (variable dimensions: only same-shape requests batch together) or would take it
  past the largest preferred size (Triton: a [3] request then a [7] one run at once, each
  alone; a [3] then a [4]: the 3 goes, the 4 waits out its own delay).
- Otherwise it goes when the oldest queued request has waited ``max_queue_delay``: then
  the head's requests (up to max_batch_size rows) are dispatched.
- With ``allowed_sizes`` (the engine's own batch sizes, when the user asks for only
  those), every batch has one of those sizes where whole requests allow it: the largest
  allowed size that fits; if even the smallest does not fit, the queued items go and the
  engine pads up.
Priorities and FIFO order come from the queue; deadlines and queue bounds from the base.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wattserve.batchers.base import BatcherConfig, RequestBatcher, common_config
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.policy import Decision, Dispatch, QueueView, Wait
from wattserve.batchers.queue import PriorityFifo
from wattserve.engines.base import Engine


@dataclass
class DynamicConfig(BatcherConfig):
    max_queue_delay_s: float = 0.005
    preferred_batch_sizes: Sequence[int] = field(default_factory=tuple)
    allowed_sizes: Sequence[int] | None = None


class DynamicBatcher(RequestBatcher):
    name = "dynamic"
    summary = "Triton's: a preferred size at once, else all after max_queue_delay_ms"
    config: DynamicConfig

    def __init__(self, engines: Sequence[Engine], config: DynamicConfig, **hooks: Any) -> None:
        super().__init__(engines, config, **hooks)
        cap = config.max_batch_size
        self._allowed = sorted({s for s in (config.allowed_sizes or ()) if 1 <= s <= cap})
        preferred = sorted({s for s in config.preferred_batch_sizes if 1 <= s <= cap})
        if self._allowed:
            preferred = [s for s in preferred if s in self._allowed]
            cap = self._allowed[-1]
        self._preferred = preferred
        self._cap = cap
        # Past this many rows the batch goes at once: Triton's largest preferred size
        self._limit = preferred[-1] if preferred else cap

    @classmethod
    def config_from(cls, spec: BatchingSpec, engine: Engine) -> DynamicConfig:
        """``batch_sizes_only`` limits batches to the engine's own sizes, when it has any."""
        engine_sizes = engine.batch_sizes
        return DynamicConfig(
            **common_config(spec),
            max_queue_delay_s=spec.max_queue_delay_ms / 1000.0,
            preferred_batch_sizes=tuple(spec.preferred_batch_sizes),
            allowed_sizes=tuple(engine_sizes) if spec.batch_sizes_only and engine_sizes else None,
        )

    def decide(self, view: QueueView, now: float) -> Decision:
        queue = view.queue
        size = self.size_now(queue)
        if size is not None:
            return Dispatch(size)
        oldest = queue.oldest_arrival()
        assert oldest is not None  # asked only with something queued
        left = oldest + self.config.max_queue_delay_s - now
        if left <= 0 or view.closing:
            return Dispatch(self.size_on_timeout(queue), complete=False)
        # Until the delay runs out, only reaching the next size that goes at once changes
        # the decision: sleep through the arrivals before it.
        return Wait(left, self.next_size_at_once(queue))

    def size_now(self, queue: PriorityFifo) -> int | None:
        """Batch size (rows) to dispatch immediately, or None to keep waiting (Triton's
        ``GetDynamicBatch``: an exact preferred size first, then a batch that cannot grow)."""
        head = queue.head(self._limit)
        if not head.rows:
            return None
        best = [s for s in self._preferred if head.reachable(s)]
        if best:
            return best[-1]
        if head.closed or head.rows >= self._limit or queue.rows > head.rows:
            # it cannot grow: the next request has another shape, or would take the batch
            # past the largest preferred size (Triton sends the pending batch then)
            return self._limit
        return None

    def next_size_at_once(self, queue: PriorityFifo) -> int:
        """The smallest queue depth (rows) above the current one that ``size_now``
        dispatches at once, for a queue of one-row requests."""
        queued = queue.rows
        return min([s for s in self._preferred if s > queued] + [self._limit])

    def size_on_timeout(self, queue: PriorityFifo) -> int:
        """Batch size once the oldest request has waited max_queue_delay (or on drain)."""
        n = queue.head(self._cap).rows
        if self._allowed:
            fitting = [s for s in self._allowed if s <= n]
            return fitting[-1] if fitting else n
        return self._cap
