"""Pick the batcher named by ``WATTSERVE_BATCHER``; nothing else changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wattserve.batchers.adaptive import AdaptiveBatcher, AdaptiveConfig
from wattserve.batchers.aimd import AimdBatcher, AimdConfig
from wattserve.batchers.base import Batcher, BatcherConfig
from wattserve.batchers.continuous import ContinuousBatcher
from wattserve.batchers.dynamic import DynamicBatcher, DynamicConfig
from wattserve.batchers.iteration import IterationBatcher
from wattserve.batchers.iteration_metrics import attach_iteration_metrics, iteration_metrics_for
from wattserve.batchers.static import StaticBatcher
from wattserve.engines.base import Engine, StepEngine


def build_batcher(settings: Any, engines: Sequence[Engine], **hooks: Any) -> Batcher:
    """``settings`` is a server.settings.Settings; ``hooks`` go to the Batcher (metrics, ...)."""
    common = {
        "max_batch_size": settings.max_batch_size,
        "max_queue_size": settings.max_queue_size,
        "priority_levels": settings.priority_levels,
        "max_queue_wait_s": settings.max_queue_wait_s,
    }
    step_engine = isinstance(engines[0], StepEngine)
    if step_engine and hooks.get("metrics") is not None:
        # Occupancy and step rate of every model call, whichever policy forms the batches.
        per_iteration = iteration_metrics_for(hooks["metrics"], settings.model, settings.batcher)
        attach_iteration_metrics(engines, per_iteration)
    if settings.batcher == "static":
        return StaticBatcher(engines, BatcherConfig(**common), **hooks)
    if settings.batcher == "continuous" and step_engine:
        return IterationBatcher(engines, BatcherConfig(**common), **hooks)  # type: ignore[arg-type]
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
    if settings.batcher == "adaptive":
        headroom = settings.slo_headroom_ms
        config = AdaptiveConfig(
            **common,
            slo_s=settings.slo_ms / 1000.0,
            percentile=settings.slo_percentile,
            headroom_s=None if headroom is None else headroom / 1000.0,
            reject_late=settings.slo_reject,
            model_name=settings.model,
        )
        return AdaptiveBatcher(engines, config, **hooks)
    if settings.batcher == "aimd":
        config_aimd = AimdConfig(
            **common,
            slo_s=settings.slo_ms / 1000.0,
            percentile=settings.slo_percentile,
            model_name=settings.model,
        )
        return AimdBatcher(engines, config_aimd, **hooks)
    raise ValueError(f"unknown batcher {settings.batcher!r}")
