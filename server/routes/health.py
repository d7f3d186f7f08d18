"""Server and model metadata, readiness, configuration, statistics, and ``/metrics``.

Readiness answers say why: a model that failed to load answers 400 with its load error, a
loading or draining one 503 with Retry-After.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from wattserve.batchers.status import Status
from wattserve.server.admission import Refused, select
from wattserve.server.model_set import ModelSet, ModelState, UnknownModel
from wattserve.server.repository.plan import config_datatype
from wattserve.server.routes.common import error_response, json_response, refusal_response
from wattserve.server.runtime import ModelRuntime
from wattserve.server.settings import Settings

VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "schedule_policy", "model_configuration", "classification",
              "model_repository", "statistics", "system_shared_memory", "trace", "logging"]  # fmt: skip


def health_router(models: ModelSet, settings: Settings, registry: CollectorRegistry) -> APIRouter:
    router = APIRouter()
    retry_after_s = settings.retry_after_s

    @router.get("/v2")
    async def server_metadata() -> Response:
        return json_response({"name": "wattserve", "version": VERSION, "extensions": EXTENSIONS})

    @router.get("/v2/health/live")
    async def live() -> Response:
        return json_response({"live": True})

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        return json_response({"ready": models.ready}, 200 if models.ready else 503)

    # before /v2/models/{name}, which would take "stats" for a model name
    @router.get("/v2/models/stats")
    async def all_stats() -> Response:
        return json_response({"model_stats": [stats_doc(r) for r in models.runtimes()]})

    async def model_stats(name: str, version: str | None = None) -> Response:
        try:
            entry = models.lookup(name, version)
        except UnknownModel as exc:
            return error_response(str(exc), 404)
        if entry.runtime is None:
            return error_response(f"model {name!r} is not available: {entry.reason}", 400)
        return json_response({"model_stats": [stats_doc(entry.runtime)]})

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


def serving_runtime(models: ModelSet, name: str, version: str | None) -> ModelRuntime:
    """A loaded runtime (metadata needs its engine), ready or not."""
    try:
        entry = models.lookup(name, version)
    except UnknownModel as exc:
        raise Refused(str(exc), Status.NOT_FOUND) from None
    if entry.runtime is not None and entry.runtime.engine is not None:
        return entry.runtime
    return select(models, name, version)  # raises the refusal that says why


def metadata_doc(models: ModelSet, runtime: ModelRuntime) -> dict[str, Any]:
    """KServe v2 model metadata (HTTP's JSON, and the fields of gRPC's ModelMetadataResponse)."""
    engine = runtime.engine
    assert engine is not None
    batched = runtime.batching
    name = runtime.name
    versions = [e.version for e in models.entries() if e.name == name and e.state is ModelState.READY]
    return {
        "name": name,
        "versions": versions,
        "platform": runtime.platform or engine.platform,
        "inputs": [s.metadata(batched) for s in engine.inputs],
        "outputs": [s.metadata(batched) for s in engine.outputs],
    }


def stats_doc(runtime: ModelRuntime) -> dict[str, Any]:
    rejected = runtime.metrics.count("bad_request")
    return runtime.metrics.statistics.triton(runtime.name, runtime.version, rejected)


def triton_config(runtime: ModelRuntime) -> dict[str, Any]:
    """The effective configuration in Triton's JSON form (what wattserve actually applies)."""
    settings, engine = runtime.settings, runtime.engine
    assert engine is not None

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "data_type": config_datatype(s.datatype), "dims": list(s.shape)} for s in specs
        ]

    config: dict[str, Any] = {
        "name": runtime.name,
        "platform": runtime.platform or engine.platform,
        "max_batch_size": settings.max_batch_size if runtime.batching else 0,
        "input": tensors(engine.inputs),
        "output": tensors(engine.outputs),
        "instance_group": [
            {"count": len(runtime.devices), "kind": "KIND_GPU" if "cuda" in engine.device else "KIND_CPU"}
        ],
        "parameters": {
            "batcher": {"string_value": settings.batcher},
            "wattserve_batcher": {"string_value": settings.batcher},
        },
    }
    if settings.batcher == "dynamic":
        config["dynamic_batching"] = {
            "preferred_batch_size": list(settings.preferred_batch_sizes),
            "max_queue_delay_microseconds": int(settings.max_queue_delay_ms * 1000),
            "priority_levels": settings.priority_levels,
            "default_priority_level": settings.effective_default_priority,
            "default_queue_policy": {
                "max_queue_size": settings.max_queue_size,
                "default_timeout_microseconds": int((settings.default_timeout_ms or 0) * 1000),
                "allow_timeout_override": settings.allow_timeout_override,
            },
        }
    return config
