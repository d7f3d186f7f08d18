"""sequence_oldest: Triton's sequence batcher, the ``oldest`` strategy.

Up to ``max_candidate_sequences`` sequences per model instance are live at once (the others
wait for one to end, in start order), each pinned to its slot's instance; each has at most
one request queued or running, as with ``direct`` (``batchers.sequence``, whose lanes this
strategy shares). An instance's queue therefore holds the oldest request of each of its
candidate sequences, and its batches are formed from it exactly as the dynamic batcher forms
them (``batchers.dynamic``; Triton's ``OldestSequenceBatch`` has a dynamic batcher per
instance): a preferred size at once, else what is there after ``max_queue_delay``, oldest
first.

Triton's ``TRITONSERVER_DELAY_SCHEDULER`` hook holds this strategy where Triton's does, in
its dynamic batcher: until an instance's queue (its candidate sequences' oldest requests)
holds that many; the backlog's count (``TRITONSERVER_BACKLOG_DELAY_SCHEDULER``) is not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.dynamic import DynamicBatcher, DynamicConfig
from wattserve.batchers.policy import Decision, QueueView, Wait
from wattserve.batchers.sequence import HELD, SequenceBatcher, SequenceConfig
from wattserve.engines.base import Engine


@dataclass
class OldestConfig(SequenceConfig, DynamicConfig):
    """The sequence batcher's (slots: the candidate sequences) and the dynamic batcher's."""


class OldestSequenceBatcher(SequenceBatcher, DynamicBatcher):
    name = "sequence_oldest"
    slot_rows = False  # Triton's oldest batches through its dynamic batcher: no slot rows, and
    # a batch is the run of one shape at the head (not direct's every request of that shape)
    summary = (
        "Triton's sequence batcher (oldest): candidate sequences' oldest requests, batched as dynamic does"
    )
    config: OldestConfig

    def __init__(self, engines: Sequence[Engine], config: OldestConfig, **hooks: Any) -> None:
        super().__init__(engines, config, **hooks)

    @classmethod
    def config_from(cls, spec: BatchingSpec, engine: Engine) -> OldestConfig:
        sequence = SequenceBatcher.config_from(spec, engine)
        dynamic = DynamicBatcher.config_from(spec, engine)
        return OldestConfig(**{**vars(dynamic), **vars(sequence)})

    def decide(self, view: QueueView, now: float) -> Decision:
        """The dynamic batcher's decision over the candidate sequences' oldest requests."""
        if self._holding and self.held(view):
            return Wait(None, note=HELD)
        return DynamicBatcher.decide(self, view, now)

    def held(self, view: QueueView) -> bool:
        """The delay hook holds until the instance's queue holds its count (Triton's dynamic
        batcher, one per instance)."""
        return not view.closing and len(view.queue) < self.config.delay.queued
