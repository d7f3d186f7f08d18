"""static(N): dispatch only full batches of N rows; flush the partial batch on drain."""

from __future__ import annotations

from wattserve.batchers.base import RequestBatcher
from wattserve.batchers.types import WorkItem


class StaticBatcher(RequestBatcher):
    """A lone request waits until N rows are queued (that is the policy being measured);
    its own deadline still bounds the wait. Requests are whole, so a batch goes short of N
    when the next request would overflow it or has another shape (the batch cannot grow)."""

    name = "static"
    summary = "only full batches of max_batch_size rows, the partial one flushed on drain"

    def ready_size(self) -> int | None:
        n = self.config.max_batch_size
        queue = self.queue
        if queue.regular:
            return n if queue.rows >= n else None
        head = queue.head(n)
        return n if head.closed or queue.rows > head.rows or head.rows >= n else None

    async def form_batch(self) -> list[WorkItem] | None:
        n = self.config.max_batch_size
        while True:
            if self.ready_size() is not None:
                return self.take(n)
            if self.closing:
                return self.take(n) if len(self.queue) else None
            await self.wait_for_change(wake_at_depth=n)  # a full batch, or drain
