"""continuous for one-shot engines: whatever is queued goes the moment an instance is free.

No timer: a batch is as large as the queue that built up while the previous batch ran
(up to max_batch_size rows, whole requests of one shape). The iteration-level variant for
step engines lives in ``batchers/iteration.py``.
"""

from __future__ import annotations

from wattserve.batchers.base import RequestBatcher
from wattserve.batchers.policy import Decision, Dispatch, QueueView


class ContinuousBatcher(RequestBatcher):
    name = "continuous"
    summary = "whatever is queued when an instance is free, no timer; iteration on a step engine"

    def decide(self, view: QueueView, now: float) -> Decision:
        return Dispatch(self.config.max_batch_size)  # asked only with something queued
