"""single: Triton's default scheduler, for a model whose config has no ``dynamic_batching``.

Triton batches across requests only when a config asks for it (``dynamic_batching``,
``sequence_batching``); otherwise each request is its own execution, whatever its rows,
on the next free instance. A repository model without ``dynamic_batching`` gets this
policy unless the user names a batcher (its ``parameters``, or ``WATTSERVE_BATCHER``).
"""

from __future__ import annotations

from wattserve.batchers.base import RequestBatcher
from wattserve.batchers.policy import Decision, Dispatch, QueueView


class SingleBatcher(RequestBatcher):
    name = "single"
    summary = "each request its own execution, no batching across requests: Triton's default scheduler"

    def decide(self, view: QueueView, now: float) -> Decision:
        return Dispatch(1)  # the head request whatever its rows; it cannot grow by waiting
