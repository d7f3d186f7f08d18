"""What it takes to serve one model version: its configuration, how to build an engine, its shape.

Two sources make plans: the process settings (zero-config: one built-in model) and a
Triton-layout model repository (``server.models.repository``). The model set turns each plan
into a ``ModelRuntime``; nothing downstream knows which source a plan came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from wattserve.engines.base import Engine
from wattserve.engines.config import EngineConfig
from wattserve.engines.registry import build_lm_engine
from wattserve.server.models.serving_config import ServingConfig
from wattserve.server.settings import Settings

EngineFactory = Callable[[EngineConfig], Engine]  # one engine instance (on ``config.device``)


@dataclass
class ModelPlan:
    name: str  # the KServe / Triton model name
    version: str
    serving: ServingConfig  # this model's own (engine, batching, queue policy, devices, ...)
    engine_factory: EngineFactory
    batching: bool = True  # False: Triton's max_batch_size 0, request shapes carry no batch axis
    platform: str | None = None  # as configured (Triton platform/backend), for metadata
    warnings: list[str] = field(default_factory=list)  # config fields not honoured, etc.
    config: Any = None  # the parsed ModelConfig, when the plan came from a repository


class ModelSource(Protocol):
    """Where the model set finds models (and finds them again on a load request)."""

    def names(self) -> list[str]: ...

    def plans(self, name: str) -> list[ModelPlan]:
        """Every version of ``name`` to serve; raises KeyError (unknown) or ValueError (why
        it cannot be served, naming the file and field)."""
        ...


class SettingsSource:
    """Zero-config: the one model ``settings.model`` names, built by ``engine_factory``."""

    def __init__(self, settings: Settings, engine_factory: EngineFactory) -> None:
        self.settings = settings
        self.engine_factory = engine_factory

    def names(self) -> list[str]:
        return [self.settings.served_model]

    def plans(self, name: str) -> list[ModelPlan]:
        if name != self.settings.served_model:
            raise KeyError(name)
        factory = self.engine_factory
        folder = self.settings.lm_model
        if folder is not None:  # a Hugging Face causal-LM folder (`--model PATH`)
            factory = partial(build_lm_engine, path=folder, name=name)
        return [ModelPlan(name, "1", ServingConfig.from_settings(self.settings), factory)]
