"""Every batching policy, found by its own ``name``; ``build_batcher`` builds the one named.

``WATTSERVE_BATCHER`` (or a repository model's ``batcher`` parameter) names a policy; the
names are the classes' own ``name`` attributes, and the settings and the study schema
take their list of valid names from here (``BatcherName``), so adding a policy is adding
its class to ``POLICIES``. ``running_policy`` is the one place that says which policy a
name runs on an engine; the server labels metrics and ``/config`` with its answer.

One explicit mapping, on purpose: on a step engine (diffusion), ``continuous`` means
iteration-level batching (``ON_STEP_ENGINES``), as the design defines continuous batching
for iterative models: the batch is re-formed before every model call. Every other name
keeps its meaning on every engine, so static and dynamic batch whole diffusion requests,
for comparison; ``iteration`` may also be named directly. ``sequence`` and ``sequence_oldest``
are what a repository model with ``sequence_batching`` runs, whatever else is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from wattserve.batchers.adaptive import AdaptiveBatcher
from wattserve.batchers.aimd import AimdBatcher
from wattserve.batchers.base import Batcher
from wattserve.batchers.clock import REAL_CLOCK, Clock
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.continuous import ContinuousBatcher
from wattserve.batchers.dynamic import DynamicBatcher
from wattserve.batchers.engine_thread import EngineThread
from wattserve.batchers.iteration import IterationBatcher
from wattserve.batchers.observers import BatchObserver
from wattserve.batchers.sequence import SequenceBatcher
from wattserve.batchers.sequence_oldest import OldestSequenceBatcher
from wattserve.batchers.single import SingleBatcher
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
        SingleBatcher,
        SequenceBatcher,
        OldestSequenceBatcher,
    )
}
BATCHER_NAMES: tuple[str, ...] = tuple(POLICIES)
# For pydantic, which reads the valid names at run time; mypy wants the values written out
# (valid-type), and writing them twice is what POLICIES exists to avoid.
BatcherName = Literal[BATCHER_NAMES]  # type: ignore[valid-type]

# name -> the policy it means on a step engine (see the module docstring)
ON_STEP_ENGINES: dict[str, str] = {ContinuousBatcher.name: IterationBatcher.name}


def running_policy(name: str, step_engine: bool) -> str:
    """The name of the policy that runs when ``name`` is asked for on a step engine (or
    not): ``ON_STEP_ENGINES`` applied."""
    return ON_STEP_ENGINES.get(name, name) if step_engine else name


def policy_for(name: str, engine: Any) -> type[Batcher]:
    """The policy class ``name`` picks for ``engine`` (``ON_STEP_ENGINES`` applied)."""
    step_engine = isinstance(engine, StepEngine)
    name = running_policy(name, step_engine)
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown batcher {name!r}; one of {', '.join(BATCHER_NAMES)}")
    if cls.step_engines_only and not step_engine:
        raise ValueError(f"the {name} batcher needs a step engine (diffusion); {engine.name!r} is not one")
    return cls


def build_batcher(
    spec: BatchingSpec,
    engines: Sequence[Engine],
    observer: BatchObserver | None = None,
    threads: Sequence[EngineThread] | None = None,
    clock: Clock = REAL_CLOCK,
) -> Batcher:
    """The batcher ``spec.batcher`` names, over ``engines`` (one per instance, each run on
    its own thread from ``threads`` when given), its config made by the policy from ``spec``
    (the model's batching spec) and its engine, reporting to ``observer``, on ``clock``."""
    cls = policy_for(spec.batcher, engines[0])
    return cls(engines, cls.config_from(spec, engines[0]), observer=observer, threads=threads, clock=clock)


def batcher_help() -> str:
    """One line per policy, for the settings' description of ``batcher``."""
    return "; ".join(f"{name} ({cls.summary})" for name, cls in POLICIES.items()) + "."
