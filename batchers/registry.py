"""Every batching policy, found by its own ``name``; ``build_batcher`` builds the one named.

``WATTSERVE_BATCHER`` (or a repository model's ``batcher`` parameter) names a policy; the
names are the classes' own ``name`` attributes, and the settings and the study schema
take their list of valid names from here (``BatcherName``), so adding a policy is adding
its class to ``POLICIES``.

One explicit mapping, on purpose: on a step engine (diffusion), ``continuous`` means
iteration-level batching (``ON_STEP_ENGINES``), as the design defines continuous batching
for iterative models: the batch is re-formed before every model call. Every other name
keeps its meaning on every engine, so static and dynamic batch whole diffusion requests,
for comparison; ``iteration`` may also be named directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from wattserve.batchers.adaptive import AdaptiveBatcher
from wattserve.batchers.aimd import AimdBatcher
from wattserve.batchers.base import Batcher
from wattserve.batchers.continuous import ContinuousBatcher
from wattserve.batchers.dynamic import DynamicBatcher
from wattserve.batchers.iteration import IterationBatcher
from wattserve.batchers.observers import BatchObserver
from wattserve.batchers.static import StaticBatcher
from wattserve.engines.base import Engine, StepEngine

POLICIES: dict[str, type[Batcher]] = {
    cls.name: cls
    for cls in (
        StaticBatcher,
        DynamicBatcher,
        ContinuousBatcher,
        IterationBatcher,
        AdaptiveBatcher,
        AimdBatcher,
    )
}
BATCHER_NAMES: tuple[str, ...] = tuple(POLICIES)
# For pydantic, which reads the valid names at run time; mypy wants the values written out
# (valid-type), and writing them twice is what POLICIES exists to avoid.
BatcherName = Literal[BATCHER_NAMES]  # type: ignore[valid-type]

# name -> the policy it means on a step engine (see the module docstring)
ON_STEP_ENGINES: dict[str, str] = {ContinuousBatcher.name: IterationBatcher.name}


def policy_for(name: str, engine: Any) -> type[Batcher]:
    """The policy class ``name`` picks for ``engine`` (``ON_STEP_ENGINES`` applied)."""
    step_engine = isinstance(engine, StepEngine)
    if step_engine:
        name = ON_STEP_ENGINES.get(name, name)
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown batcher {name!r}; one of {', '.join(BATCHER_NAMES)}")
    if cls.step_engines_only and not step_engine:
        raise ValueError(f"the {name} batcher needs a step engine (diffusion); {engine.name!r} is not one")
    return cls


def build_batcher(
    settings: Any,
    engines: Sequence[Engine],
    observer: BatchObserver | None = None,
    threads: Sequence[ThreadPoolExecutor] | None = None,
) -> Batcher:
    """The batcher ``settings.batcher`` names, over ``engines`` (one per instance, each run
    on its own thread from ``threads`` when given), its config read from ``settings`` (a
    server Settings), reporting to ``observer``."""
    cls = policy_for(settings.batcher, engines[0])
    return cls(engines, cls.config_from(settings, engines[0]), observer=observer, threads=threads)


def batcher_help() -> str:
    """One line per policy, for the settings' description of ``batcher``."""
    return "; ".join(f"{name} ({cls.summary})" for name, cls in POLICIES.items()) + "."
