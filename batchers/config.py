"""The batching part of a model's configuration: what the user asked of batching.

The server builds one ``BatchingSpec`` per model (from its settings, or a repository model's
``dynamic_batching`` and parameters) and the registry hands it to the policy ``batcher``
names; each policy reads its own fields in ``config_from`` and turns them, with what its
engine can do, into its own config (``BatcherConfig`` and subclasses), which is what runs
and what ``/config`` reports. Field names are the settings' names (``WATTSERVE_<NAME>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchingSpec:
    batcher: str = "dynamic"  # a policy name (batchers/registry.py POLICIES)
    # every policy
    max_batch_size: int = 8
    max_queue_size: int = 256
    priority_levels: int = 1
    max_queue_wait_s: float = 3.0  # refuse when the queue holds more seconds of work; 0 = off
    # dynamic
    max_queue_delay_ms: float = 5.0
    preferred_batch_sizes: Sequence[int] = ()
    batch_sizes_only: bool = False
    # adaptive, aimd
    slo_ms: float = 100.0
    slo_percentile: float = 99.0
    slo_headroom_ms: float | None = None
    slo_reject: bool = False
    slo_late_last: bool = True  # adaptive: requests past saving run after the rest
    adaptive_unit: str = "auto"  # adaptive: "seconds" never decides in joules; "auto"/"joules" once metered
