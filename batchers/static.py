"""static(N): dispatch only full batches of N rows; flush the partial batch on drain."""

from __future__ import annotations

from wattserve.batchers.base import RequestBatcher
from wattserve.batchers.policy import Decision, Dispatch, QueueView, Wait


class StaticBatcher(RequestBatcher):
    """A lone request waits until N rows are queued (that is the policy being measured);
    its own deadline still bounds the wait. Requests are whole, so a batch goes short of N
    when the next request would overflow it or has another shape (the batch cannot grow)."""

    name = "static"
    summary = "only full batches of max_batch_size rows, the partial one flushed on drain"

    def decide(self, view: QueueView, now: float) -> Decision:
        n = self.config.max_batch_size
        queue = view.queue
        if queue.regular:
            full = queue.rows >= n
        else:
            head = queue.head(n)
            full = head.closed or queue.rows > head.rows or head.rows >= n
        if full:
            return Dispatch(n)
        if view.closing:  # the partial batch, flushed
            return Dispatch(n, complete=False)
        return Wait(wake_at_depth=n)  # a full batch, or drain
