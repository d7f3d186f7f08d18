"""static(N): dispatch only full batches of N; flush the partial batch on drain."""

from __future__ import annotations

from wattserve.batchers.base import RequestBatcher
from wattserve.batchers.types import WorkItem


class StaticBatcher(RequestBatcher):
    """A lone request waits for N-1 others (that is the policy being measured); its own
    deadline still bounds the wait."""

    name = "static"
    summary = "only full batches of max_batch_size, the partial one flushed on drain"

    def ready_size(self, queued: int) -> int | None:
        n = self.config.max_batch_size
        return n if queued >= n else None

    async def form_batch(self) -> list[WorkItem] | None:
        n = self.config.max_batch_size
        while True:
            if len(self.queue) >= n:
                return self.take(n)
            if self.closing:
                return self.take(n) if len(self.queue) else None
            await self.wait_for_change(wake_at_depth=n)  # a full batch, or drain
