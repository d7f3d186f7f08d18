"""The FastAPI app factory: the model set, the routers, the lifespan. Wiring only.

Routes live in ``server/routes/`` by concern and reach the models only through the
``ModelSet`` and the one admission path (``server.admission``); nothing there imports this
module, so there is no cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from engines.registry import build_engine
from server.metrics import ServingMetrics
from server.model_plan import EngineFactory, ModelPlan, ModelSource, SettingsSource
from server.model_set import ModelSet
from server.routes.health import VERSION, health_router
from server.routes.images import images_router
from server.routes.inference import inference_routes
from server.routes.repository import repository_router
from server.runtime import ModelRuntime
from server.settings import Settings
from telemetry import TelemetryService

log = logging.getLogger("wattserve.server")


def model_source(settings: Settings, engine_factory: EngineFactory) -> ModelSource:
    """A repository when one is configured, else the one built-in model the settings name."""
    if settings.model_repository is not None:
        from server.repository.plan import RepositorySource

        return RepositorySource(settings.model_repository, settings)
    return SettingsSource(settings, engine_factory)


def create_app(settings: Settings | None = None, *, engine_factory: EngineFactory = build_engine) -> FastAPI:
    """Build the app; nothing global, so tests can build many."""
    settings = settings or Settings()
    registry = CollectorRegistry()
    telemetry = TelemetryService(settings, registry)  # same registry: one /metrics

    def make_runtime(plan: ModelPlan) -> ModelRuntime:
        metrics = ServingMetrics(plan.name, plan.settings.batcher, registry)
        runtime = ModelRuntime(plan.settings, plan.engine_factory, metrics, name=plan.name,
                               version=plan.version, batching=plan.batching, devices=plan.devices,
                               platform=plan.platform, config=plan.config)  # fmt: skip

        def record_batch(batch_size: int, energy: Any) -> None:
            telemetry.record_batch(plan.name, plan.settings.batcher, batch_size, energy)

        # read by runtime.start(); the meter is None without a GPU or RAPL (nothing made up)
        runtime.batcher_hooks.update(energy_meter=telemetry.meter, on_batch=record_batch)
        return runtime

    # Zero-config serves one model: if it cannot load there is nothing to serve, so that
    # failure is fatal as before; a repository keeps serving the models that did load.
    strict = settings.strict or settings.model_repository is None
    models = ModelSet(model_source(settings, engine_factory), make_runtime, strict=strict)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(telemetry.start)  # NVML init and cost measurement off the loop
        for runtime in models.runtimes():  # made before telemetry started: give them its meter
            runtime.batcher_hooks["energy_meter"] = telemetry.meter
        try:
            await models.start()
            yield
        finally:
            await models.stop()
            await asyncio.to_thread(telemetry.stop)

    app = FastAPI(title="wattserve", version=VERSION, lifespan=lifespan)
    app.state.settings = settings
    app.state.models = models
    app.state.telemetry = telemetry
    app.state.registry = registry
    first = models.runtimes()[:1]  # the zero-config model, for tests and tools that want it
    app.state.runtime = first[0] if first else None
    app.state.metrics = first[0].metrics if first else None

    app.include_router(health_router(models, settings, registry))
    app.include_router(repository_router(models))
    app.include_router(images_router(models, settings))
    # The hot path: plain Starlette routes, first in the table.
    app.router.routes[0:0] = inference_routes(models, settings)
    return app
