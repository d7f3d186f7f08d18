"""Pick the batcher named by ``WATTSERVE_BATCHER``; nothing else changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchers.base import Batcher, BatcherConfig
from batchers.continuous import ContinuousBatcher
from batchers.dynamic import DynamicBatcher, DynamicConfig
from batchers.static import StaticBatcher
from engines.base import Engine


def build_batcher(settings: Any, engines: Sequence[Engine], **hooks: Any) -> Batcher:
    """``settings`` is a server.settings.Settings; ``hooks`` go to the Batcher (metrics, ...)."""
    common = {
        "max_batch_size": settings.max_batch_size,
        "max_queue_size": settings.max_queue_size,
        "priority_levels": settings.priority_levels,
    }
    if settings.batcher == "static":
        return StaticBatcher(engines, BatcherConfig(**common), **hooks)
    if settings.batcher == "continuous":
        return ContinuousBatcher(engines, BatcherConfig(**common), **hooks)
    if settings.batcher == "dynamic":
        engine_sizes = getattr(engines[0], "batch_sizes", None)
        config = DynamicConfig(
            **common,
            max_queue_delay_s=settings.max_queue_delay_ms / 1000.0,
            preferred_batch_sizes=tuple(settings.preferred_batch_sizes),
            allowed_sizes=tuple(engine_sizes) if settings.batch_sizes_only and engine_sizes else None,
        )
        return DynamicBatcher(engines, config, **hooks)
    raise ValueError(f"unknown batcher {settings.batcher!r}")
