"""continuous for one-shot engines: whatever is queued goes the moment an instance is free.

No timer: a batch is as large as the queue that built up while the previous batch ran
(up to max_batch_size rows, whole requests of one shape). The iteration-level variant for
step engines lives in ``batchers/iteration.py``.
"""

from __future__ import annotations

from wattserve.batchers.base import RequestBatcher
from wattserve.batchers.types import WorkItem


class ContinuousBatcher(RequestBatcher):
    name = "continuous"
    summary = "whatever is queued when an instance is free, no timer; iteration on a step engine"

    def ready_size(self) -> int | None:
        return self.config.max_batch_size if len(self.queue) else None

    async def form_batch(self) -> list[WorkItem] | None:
        while True:
            if len(self.queue):
                return self.take(self.config.max_batch_size)
            if self.closing:
                return None
            await self.wait_for_change()
