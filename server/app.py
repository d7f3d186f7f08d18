"""The FastAPI app factory: the model set, the routers, the guards, the lifespan. Wiring only.

Two front ends over one protocol-neutral core (``server/core/``: admission, decoding, the
documents both serve): HTTP routes in ``server/http/routes/`` by concern, gRPC in
``server/grpc/service.py``. Both reach the models only through the ``ModelSet`` and the
core; nothing there imports this module, so there is no cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from wattserve.batchers.rate_limiter import RateLimiter
from wattserve.engines.python_backend.custom_metrics import CustomMetrics, publishing_to
from wattserve.engines.registry import build_engine
from wattserve.server.core.decode import BodyBudget
from wattserve.server.core.documents import VERSION
from wattserve.server.core.model_caller import model_caller
from wattserve.server.extensions.classification import ClassLabels
from wattserve.server.extensions.cuda_ipc import CudaRuntimeIpc
from wattserve.server.extensions.shared_memory import SharedMemoryRegistry
from wattserve.server.extensions.trace_logging import LogSettings, TraceSettings
from wattserve.server.extensions.triton_metrics import TritonMetrics
from wattserve.server.http.fast_path import WattserveApp
from wattserve.server.http.middleware import http_error, internal_error, invalid_parameters
from wattserve.server.http.routes.generate import generate_routes
from wattserve.server.http.routes.health import health_router
from wattserve.server.http.routes.images import images_router
from wattserve.server.http.routes.inference import inference_routes
from wattserve.server.http.routes.openai import openai_routes
from wattserve.server.http.routes.repository import repository_router
from wattserve.server.http.routes.shared_memory import shared_memory_router
from wattserve.server.http.routes.trace_logging import trace_logging_router
from wattserve.server.http.schemas import ErrorBody, InferRequestBody, InferResponseBody
from wattserve.server.lifecycle import IdleTrimmer
from wattserve.server.models.metrics import ServingMetrics, server_metrics
from wattserve.server.models.model_set import ModelSet, ModelSetActivity
from wattserve.server.models.plan import EngineFactory, ModelPlan, ModelSource, SettingsSource
from wattserve.server.models.repository.poll import RepositoryPoller
from wattserve.server.models.response_cache import ResponseCache
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.security import AccessControl, parse_restricted_api
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService

if TYPE_CHECKING:
    from wattserve.server.grpc.service import GrpcFrontEnd
    from wattserve.server.split.core_service import CoreService

log = logging.getLogger("wattserve.server")


def model_source(settings: Settings, engine_factory: EngineFactory) -> ModelSource:
    """A repository when one is configured, else the one built-in model the settings name."""
    if settings.model_repository is not None:
        from wattserve.server.models.repository.plan import RepositorySource

        return RepositorySource(settings.model_repository, settings)
    return SettingsSource(settings, engine_factory)


def create_app(
    settings: Settings | None = None,
    *,
    engine_factory: EngineFactory = build_engine,
    core_channel: str | None = None,
    grpc_address: str | None = None,
) -> FastAPI:
    """Build the app; nothing global, so tests can build many.

    ``core_channel``: this app is the engine core behind front-end processes
    (``server.split``): they connect on this Unix socket path. ``grpc_address``: where gRPC
    listens instead of the settings' host and port (the core's own socket)."""
    settings = settings or Settings()
    registry = CollectorRegistry()
    telemetry = TelemetryService(settings.telemetry_config(), registry)  # same registry: one /metrics
    body_budget = BodyBudget(settings.max_inflight_body_bytes)
    custom_metrics = CustomMetrics()
    restrictions = parse_restricted_api(settings.restricted_api)  # a bad value fails at start
    # Triton's --cache-config: one response cache shared by the models that enable it
    if settings.response_cache_byte_size is not None:  # Triton's deprecated flag, and its warning
        size = settings.response_cache_byte_size
        log.warning("--response-cache-byte-size is deprecated: it makes the local cache of that size; the "
                    "equivalent is --cache-config=local,size=%d", size)  # fmt: skip
    cache_bytes = settings.cache_bytes
    cache = ResponseCache(cache_bytes) if cache_bytes else None
    # Triton's --rate-limit: one limiter whose resources every model's instances share
    limiter = RateLimiter(settings.rate_limit, settings.rate_limit_resource)

    def with_cache(runtime: ModelRuntime, plan: ModelPlan) -> ModelRuntime:
        if plan.serving.response_cache:
            runtime.response_cache = cache
            if cache is None:  # Triton: enabled on both sides or not used; said, not silent
                log.warning("%s: response_cache is enabled but no cache is configured (--cache-config "
                            "local,size=BYTES); served without one", plan.name)  # fmt: skip
        return runtime

    def make_runtime(plan: ModelPlan) -> ModelRuntime:
        if plan.platform == "ensemble":  # no engine or batcher: its steps use their models'
            from wattserve.server.models.ensemble import ensemble_runtime

            return with_cache(ensemble_runtime(plan, registry, lambda: models), plan)
        policy = plan.serving.policy  # the batcher that runs, e.g. iteration for continuous on diffusion
        metrics = ServingMetrics(plan.name, policy, registry)
        # label files (classification) are read once, at load, by the engine factory: a
        # missing one fails the load and names the file, as in Triton
        model_dir = settings.model_repository / plan.name if settings.model_repository else None
        labels = ClassLabels(plan.config, model_dir)
        factory = publishing_to(custom_metrics, labels.loading(plan.engine_factory))  # pb_utils.MetricFamily
        runtime = ModelRuntime(plan.serving, factory, metrics, name=plan.name,
                               version=plan.version, batching=plan.batching, platform=plan.platform,
                               config=plan.config)  # fmt: skip
        runtime.class_labels = labels
        with_cache(runtime, plan)

        def record_batch(batch_size: int, energy: Any) -> None:
            telemetry.record_batch(plan.name, policy, batch_size, energy)

        # read by runtime.start(), after telemetry started: the meter follows the engine's
        # device (its GPU; RAPL or nothing for a CPU engine; nothing is made up)
        runtime.batcher_hooks.update(energy_meter_for=telemetry.meter_for, on_batch=record_batch,
                                     on_cache_hit=telemetry.record_cached,
                                     rate_limiter=limiter)  # fmt: skip
        # Python models' BLS calls reach this server's models (server/core/model_caller.py)
        runtime.batcher_hooks["call_model"] = lambda loop: model_caller(lambda: models, loop)
        return runtime

    # Zero-config serves one model: if it cannot load there is nothing to serve, so that
    # failure is fatal as before; a repository keeps serving the models that did load.
    strict = settings.strict or settings.model_repository is None
    models = ModelSet(model_source(settings, engine_factory), make_runtime, strict=strict,
                      mode=settings.model_control_mode, startup=settings.load_model,
                      poll_s=settings.repository_poll_secs, poller=RepositoryPoller)  # fmt: skip
    # Triton's nv_* names, read at scrape time
    registry.register(TritonMetrics(models, telemetry, cache=cache))
    registry.register(custom_metrics)  # Python models' own families, read at scrape time
    trimmer = IdleTrimmer(ModelSetActivity(models), settings.idle_trim_s) if settings.tune_malloc else None
    # Triton's shared-memory, trace and logging extensions (one of each per app)
    shm = SharedMemoryRegistry(settings.allow_client_shm, cuda=CudaRuntimeIpc())
    trace, log_settings = TraceSettings(), LogSettings(settings.log_level)
    grpc_front = None
    if settings.grpc_port:  # same models, admission path and batchers as HTTP; same event loop
        from wattserve.server.grpc.service import GrpcFrontEnd

        grpc_front = GrpcFrontEnd(models, settings, body_budget, restrictions, shm=shm, trace=trace,
                                  log=log_settings, address=grpc_address)  # fmt: skip
    core = None
    if core_channel is not None:
        from wattserve.server.split.core_service import CoreService

        core = CoreService(models, core_channel, registry)

    app = WattserveApp(
        title="wattserve",
        version=VERSION,
        lifespan=_lifespan(models, telemetry, grpc_front, trimmer, settings, shm, core),
    )
    app.add_exception_handler(Exception, internal_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_parameters)
    if restrictions or settings.api_token:
        app.add_middleware(AccessControl, restrictions=restrictions, api_token=settings.api_token)
    _publish_state(app, settings, models, telemetry, registry, grpc_front)
    app.state.shared_memory = shm
    app.state.core_service = core  # the engine core's channel (None: no front-end processes)
    app.state.trace_settings, app.state.log_settings = trace, log_settings
    _add_routes(app, models, settings, registry, body_budget, shm)
    app.include_router(shared_memory_router(shm))
    app.include_router(trace_logging_router(models, trace, log_settings))
    return app


def _lifespan(
    models: ModelSet,
    telemetry: TelemetryService,
    grpc_front: GrpcFrontEnd | None,
    trimmer: IdleTrimmer | None,
    settings: Settings,
    shm: SharedMemoryRegistry,
    core: CoreService | None = None,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start: gRPC binds, the core's channel (front ends may connect while models load),
    telemetry, every model, gRPC serves, the trimmer. Stop: the reverse."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if grpc_front is not None:
            grpc_front.bind()  # a taken port fails start-up before any model loads
        if core is not None:
            await core.start()
        await asyncio.to_thread(telemetry.start)  # NVML init and cost measurement off the loop
        try:
            await models.start()
            if grpc_front is not None:
                await grpc_front.start()
            if trimmer is not None:
                trimmer.start()
            yield
        finally:
            if trimmer is not None:
                trimmer.stop()
            if grpc_front is not None:  # after a SIGTERM drain nothing is in flight: quick
                await grpc_front.stop(settings.drain_timeout_s)
            if core is not None:
                await core.stop()
            await models.stop()
            shm.close()  # after every request that could read or write a region
            await asyncio.to_thread(telemetry.stop)

    return lifespan


def _publish_state(
    app: FastAPI,
    settings: Settings,
    models: ModelSet,
    telemetry: TelemetryService,
    registry: CollectorRegistry,
    grpc_front: GrpcFrontEnd | None,
) -> None:
    """What tools, tests and ``wattserve serve`` read from ``app.state``."""
    app.state.settings = settings
    app.state.models = models
    app.state.telemetry = telemetry
    app.state.registry = registry
    app.state.grpc = grpc_front  # its bound port: app.state.grpc.port
    first = models.runtimes()[:1]  # the zero-config model, for tests and tools that want it
    app.state.runtime = first[0] if first else None
    # server-wide counters (refused connections) live on every ServingMetrics of the registry
    app.state.metrics = first[0].metrics if first else types.SimpleNamespace(**server_metrics(registry))


def _add_routes(
    app: WattserveApp,
    models: ModelSet,
    settings: Settings,
    registry: CollectorRegistry,
    body_budget: BodyBudget,
    shm: SharedMemoryRegistry,
) -> None:
    app.include_router(health_router(models, settings, registry))
    app.include_router(repository_router(models, settings.max_body_bytes))
    app.include_router(images_router(models, settings))
    app.router.routes.extend(generate_routes(models, settings))  # Triton's generate extension (POST)
    app.router.routes.extend(openai_routes(models, settings))  # /v1: OpenAI-compatible, language models
    # The hot path: plain Starlette routes, first in the table, and past the middleware
    # stack when the app has no middleware of its own (server.http.fast_path).
    infer_routes = inference_routes(models, settings, body_budget, shm)
    app.router.routes[0:0] = infer_routes
    app.fast_routes = infer_routes
    _document_infer_route(app)


def _document_infer_route(app: FastAPI) -> None:
    """Describe the Starlette infer route in /openapi.json: FastAPI routes with the same
    paths, appended after it, so they are documented but never matched."""
    codes = (400, 401, 403, 404, 413, 415, 503, 504)
    errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in codes}

    async def infer_doc(name: str, body: InferRequestBody) -> InferResponseBody:  # pragma: no cover
        """KServe v2 inference: JSON tensors, or the binary tensor extension
        (Inference-Header-Content-Length). Answered by the Starlette route above."""
        raise AssertionError("documentation only; the Starlette route answers")

    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.add_api_route(path, infer_doc, methods=["POST"], responses=errors,
                          response_model=InferResponseBody, summary="Infer")  # fmt: skip
