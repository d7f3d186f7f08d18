"""One model version's configuration, typed, built once; each layer gets its own part.

A ``ServingConfig`` is made from the process settings (zero-config: the one built-in model)
or from a repository model's config.pbtxt over those settings (``server.models.repository.plan``),
and nothing downstream knows which. The runtime hands ``engine`` (one copy per instance
device) to the engine factory and ``batching`` to the batcher registry; it keeps the queue
policy, warm-up and drain for itself. ``policy`` names the batcher that will run (the
registry's ``running_policy``: ``continuous`` on a step engine runs ``iteration``), so the
metrics say what runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.rate_limiter import InstanceLimits
from wattserve.batchers.registry import running_policy
from wattserve.engines.config import EngineConfig
from wattserve.engines.registry import MODELS
from wattserve.server.settings import Settings


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's queue policy and priorities, applied when a request becomes a work item."""

    default_priority: int = 1  # the level of a priority-0 request (Triton: the lowest)
    default_timeout_ms: float | None = None  # None: no deadline unless the request sets one
    allow_timeout_override: bool = True
    timeout_action: str = "reject"  # or "delay": an expired request runs after the on-time ones
    max_queue_size: int = 0  # a level's own bound (priority_queue_policy); 0: only the model's
    # Triton's priority_queue_policy: a level's own policy, in place of this one for its requests
    levels: Mapping[int, QueuePolicy] = field(default_factory=dict)

    def at(self, level: int) -> QueuePolicy:
        """The policy of requests at priority ``level``."""
        return self.levels.get(level, self)


@dataclass(frozen=True)
class ServingConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    batching: BatchingSpec = field(default_factory=BatchingSpec)
    queue: QueuePolicy = field(default_factory=QueuePolicy)
    devices: tuple[str, ...] = ("auto",)  # one per engine instance
    steps: bool = False  # the engine is a step engine (diffusion): policies mean iteration-level
    check_values: bool = False  # reject NaN/Inf in float inputs (400)
    warmup: bool = True
    drain_timeout_s: float = 30.0
    preserve_ordering: bool = False  # Triton's dynamic_batching.preserve_ordering: answers in arrival order
    response_cache: bool = (
        False  # Triton's response_cache.enable: uses the server's cache, if one is configured
    )
    # a stateful model's sequence_batching (server/models/repository/sequence_config.py
    # SequenceModelSpec): the runtime fills each request's control inputs from it
    sequence: Any = None
    # each instance's group's rate_limiter (batchers.rate_limiter.InstanceLimits or None), one per
    # device; empty: no group sets one. Used only with --rate-limit execution_count.
    rate_limits: tuple[InstanceLimits | None, ...] = ()

    @property
    def policy(self) -> str:
        """The batcher that runs (what metrics and /config name)."""
        return running_policy(self.batching.batcher, self.steps)

    @property
    def max_batch_size(self) -> int:
        return self.batching.max_batch_size

    @classmethod
    def from_settings(
        cls, settings: Settings, devices: Sequence[str] | None = None, *, steps: bool | None = None
    ) -> ServingConfig:
        """The model ``settings.model`` as the settings configure it; ``devices``: one per
        instance (default: ``settings.device``, ``settings.instances`` times); ``steps``:
        whether its engine is a step engine (default: the built-in model's own say)."""
        if steps is None:
            builtin = MODELS.get(settings.model)
            steps = (builtin is not None and builtin.steps) or settings.lm_model is not None
        engine = settings.engine_config()
        if settings.lm_model is not None:  # a language-model folder: served under its own name
            engine = replace(engine, model=settings.served_model)
        return cls(
            engine=engine,
            batching=settings.batching_spec(),
            queue=QueuePolicy(
                default_priority=settings.effective_default_priority,
                default_timeout_ms=settings.default_timeout_ms,
                allow_timeout_override=settings.allow_timeout_override,
                timeout_action=settings.timeout_action,
            ),
            devices=tuple(devices) if devices else (settings.device,) * settings.instances,
            steps=steps,
            check_values=settings.check_values,
            warmup=settings.warmup,
            drain_timeout_s=settings.drain_timeout_s,
        )
