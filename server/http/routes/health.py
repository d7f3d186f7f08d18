"""Server and model metadata, readiness, configuration, statistics, and ``/metrics``: the
documents of ``server.core.documents`` as JSON.

Readiness answers say why: a model that failed to load answers 400 with its load error, a
loading or draining one 503 with Retry-After.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from wattserve.server.core.admission import Refused
from wattserve.server.core.documents import (
    metadata_doc,
    server_doc,
    serving_runtime,
    statistics_doc,
    triton_config,
)
from wattserve.server.http.routes.common import error_response, json_response, refusal_response
from wattserve.server.models.model_set import ModelSet, ModelState, UnknownModel
from wattserve.server.settings import Settings


def health_router(models: ModelSet, settings: Settings, registry: CollectorRegistry) -> APIRouter:
    router = APIRouter()
    retry_after_s = settings.retry_after_s

    @router.get("/v2")
    async def server_metadata() -> Response:
        return json_response(server_doc())

    @router.get("/v2/health/live")
    async def live() -> Response:
        return json_response({"live": True})

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        return json_response({"ready": models.ready}, 200 if models.ready else 503)

    # before /v2/models/{name}, which would take "stats" for a model name
    @router.get("/v2/models/stats")
    async def all_stats() -> Response:
        return json_response(statistics_doc(models, None, None))

    async def model_stats(name: str, version: str | None = None) -> Response:
        try:
            return json_response(statistics_doc(models, name, version))
        except Refused as refused:
            return refusal_response(refused, retry_after_s)

    async def model_metadata(name: str, version: str | None = None) -> Response:
        try:
            runtime = serving_runtime(models, name, version)
        except Refused as refused:
            return refusal_response(refused, retry_after_s)
        return json_response(metadata_doc(models, runtime))

    async def model_ready(name: str, version: str | None = None) -> Response:
        try:
            entry = models.lookup(name, version)
        except UnknownModel as exc:
            return error_response(str(exc), 404)
        runtime = entry.runtime
        if entry.state is ModelState.READY and runtime is not None and runtime.ready:
            return json_response({"name": name, "ready": True})
        doc = {"name": name, "ready": False, "state": entry.state.value, "error": entry.reason}
        if entry.state is ModelState.UNAVAILABLE:
            return json_response(doc, 400)
        return json_response(doc, 503, {"Retry-After": str(retry_after_s)})

    async def model_config(name: str, version: str | None = None) -> Response:
        """Triton's model-configuration extension: the configuration as served."""
        try:
            runtime = serving_runtime(models, name, version)
        except Refused as refused:
            return refusal_response(refused, retry_after_s)
        return json_response(triton_config(runtime))

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        router.add_api_route(prefix, model_metadata, methods=["GET"])
        router.add_api_route(prefix + "/ready", model_ready, methods=["GET"])
        router.add_api_route(prefix + "/config", model_config, methods=["GET"])
        router.add_api_route(prefix + "/stats", model_stats, methods=["GET"])

    @router.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return router
