"""The FastAPI app factory: KServe v2 routes, the image endpoint, /metrics, lifespan.

Routes are thin: parse and validate (4xx before any queue), hand work items to the
runtime's batcher, encode the answer. Large JSON bodies are decoded off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.routing import Route

from batchers.types import RequestError, Result, WorkItem
from engines.registry import build_engine
from server.admission import BodyBudget, check_content_type, read_upload, reserved_body
from server.codec import BINARY_HEADER, BadRequest, encode_infer_response, parse_infer_request
from server.lifecycle import IdleTrimmer
from server.metrics import ServingMetrics
from server.middleware import ConnectionHeaders
from server.runtime import EngineFactory, ModelRuntime
from server.schemas import ErrorBody, InferRequestBody, InferResponseBody
from server.security import AccessControl, parse_restricted_api
from server.settings import Settings
from telemetry import TelemetryService

log = logging.getLogger("wattserve.server")

OFFLOAD_DECODE_BYTES = 256 * 1024  # bodies above this are decoded on a worker thread
DRAIN_UNREAD_BODY_BYTES = 64 * 1024  # a refused request's unread body up to this is read, not cut off
WATCH_AFTER_S = 0.02  # answers slower than this get a task watching for a gone client
VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "schedule_policy", "model_configuration", "classification"]


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json",
                    headers=headers)  # fmt: skip


def error_response(message: str, status: int, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return json_response({"error": message}, status, headers)


def create_app(settings: Settings | None = None, *, engine_factory: EngineFactory = build_engine) -> FastAPI:
    """Build the app for one served model; nothing global, so tests can build many."""
    settings = settings or Settings()
    metrics = ServingMetrics(settings.model, settings.batcher)
    telemetry = TelemetryService(settings, metrics.registry)  # same registry: one /metrics
    runtime = ModelRuntime(settings, engine_factory, metrics)
    body_budget = BodyBudget(settings.max_inflight_body_bytes)
    restrictions = parse_restricted_api(settings.restricted_api)  # a bad value fails at start
    trimmer = IdleTrimmer(runtime, settings.idle_trim_s) if settings.tune_malloc else None

    def record_batch(batch_size: int, energy: Any) -> None:
        telemetry.record_batch(settings.model, settings.batcher, batch_size, energy)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(telemetry.start)  # NVML init and cost measurement off the loop
        # the meter follows the engine's device (its GPU; RAPL or nothing for a CPU engine)
        runtime.batcher_hooks.update(energy_meter_for=telemetry.meter_for, on_batch=record_batch)
        try:
            await runtime.start()
            if trimmer is not None:
                trimmer.start()
            yield
        finally:
            if trimmer is not None:
                trimmer.stop()
            await runtime.stop()
            await asyncio.to_thread(telemetry.stop)

    app = FastAPI(title="wattserve", version=VERSION, lifespan=lifespan)
    app.add_middleware(
        ConnectionHeaders, keep_alive_s=settings.keep_alive_s, draining=lambda: runtime.draining
    )
    if restrictions or settings.api_token:
        app.add_middleware(AccessControl, restrictions=restrictions, api_token=settings.api_token)
    app.state.settings = settings
    app.state.runtime = runtime
    app.state.telemetry = telemetry
    app.state.metrics = metrics
    model_name = settings.model

    def model_or_404(name: str, version: str | None) -> Response | None:
        if name != model_name:
            return error_response(f"unknown model {name!r}; this server serves {model_name!r}", 404)
        if version not in (None, "", "1"):
            return error_response(f"model {name!r} has no version {version!r} (only '1')", 404)
        return None

    # ----------------------------------------------------------------- health and metadata
    @app.get("/v2")
    async def server_metadata() -> Response:
        return json_response({"name": "wattserve", "version": VERSION, "extensions": EXTENSIONS})

    @app.get("/v2/health/live")
    async def live() -> Response:
        return json_response({"live": True})

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return json_response({"ready": runtime.ready}, 200 if runtime.ready else 503)

    async def model_metadata(name: str, version: str | None = None) -> Response:
        if (missing := model_or_404(name, version)) is not None:
            return missing
        engine = runtime.engine
        if engine is None:
            return error_response(f"model {name!r} is loading", 503, settings.retry_after_s)
        return json_response({
            "name": name,
            "versions": ["1"],
            "platform": engine.platform,
            "inputs": [s.metadata() for s in engine.inputs],
            "outputs": [s.metadata() for s in engine.outputs],
        })  # fmt: skip

    async def model_ready(name: str, version: str | None = None) -> Response:
        if (missing := model_or_404(name, version)) is not None:
            return missing
        return json_response({"name": name, "ready": runtime.ready}, 200 if runtime.ready else 503)

    async def model_config(name: str, version: str | None = None) -> Response:
        """Triton's model-configuration extension, so Triton tooling can read the batching."""
        if (missing := model_or_404(name, version)) is not None:
            return missing
        engine = runtime.engine
        if engine is None:
            return error_response(f"model {name!r} is loading", 503, settings.retry_after_s)
        return json_response(_triton_config(settings, engine))

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.add_api_route(prefix, model_metadata, methods=["GET"])
        app.add_api_route(prefix + "/ready", model_ready, methods=["GET"])
        app.add_api_route(prefix + "/config", model_config, methods=["GET"])

    # ----------------------------------------------------------------- inference
    async def infer(request: Request) -> Response:
        name = request.path_params["name"]
        version = request.path_params.get("version")
        if (missing := model_or_404(name, version)) is not None:
            metrics.outcome["bad_request"].inc()
            return missing
        if (refused := _refuse_if_not_serving(runtime, settings, request)) is not None:
            return refused
        engine = runtime.engine
        assert engine is not None
        try:  # everything that can refuse the request is decided before its body is read
            check_content_type(request)
            async with reserved_body(request, settings.max_body_bytes, body_budget) as held:
                body = held[0]
                header_length = request.headers.get(BINARY_HEADER)
                args = (body, header_length, engine.inputs, engine.outputs, settings.max_batch_size)
                if len(body) > OFFLOAD_DECODE_BYTES:
                    parsed = await asyncio.to_thread(parse_infer_request, *args)
                else:
                    parsed = parse_infer_request(*args)
                del body, held, args  # the parsed arrays are what stays in memory
            items = [runtime.make_item(i, parsed.priority, parsed.timeout_us) for i in parsed.items]
        except (BadRequest, ValueError) as exc:
            status = getattr(exc, "status", 400)
            metrics.outcome["queue_full" if status == 503 else "bad_request"].inc()
            answer = error_response(str(exc), status, settings.retry_after_s if status == 503 else None)
            if status in (413, 503):  # refused before its body was read: do not drain it
                answer.headers["connection"] = "close"
            return answer
        except RequestError as exc:  # the client left during the upload
            metrics.outcome[exc.outcome].inc()
            return error_response(str(exc), exc.status_code)
        outcome = await answer_or_disconnect(request, runtime, items)
        if isinstance(outcome, Response):
            return outcome
        payload, extra = encode_infer_response(name, parsed, [r.outputs for r in outcome], engine.outputs)
        media = "application/octet-stream" if extra else "application/json"
        return Response(payload, media_type=media, headers={**extra, **timing_headers(outcome)})

    # The hot path is a plain Starlette route, first in the table: FastAPI's parameter
    # machinery cost ~100 us a request here, more than the identity model's whole budget.
    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.router.routes.insert(0, Route(path, infer, methods=["POST"]))
    _document_infer_route(app)

    @app.post("/v2/models/{name}/classify")
    async def classify(name: str, request: Request, top_k: int = 5) -> Response:
        """Upload a JPEG/PNG (multipart field 'file', or the raw body); get the top-k classes."""
        from server.images import preprocess_image
        from server.images import top_k as best_classes

        if (missing := model_or_404(name, None)) is not None:
            return missing
        engine = runtime.engine
        if engine is None or [s.name for s in engine.inputs] != ["input"]:
            metrics.outcome["bad_request"].inc()
            return error_response(f"model {name!r} takes tensors, not images", 400)
        if (refused := _refuse_if_not_serving(runtime, settings, request)) is not None:
            return refused
        if not 1 <= top_k <= 1000:
            return error_response("top_k must be within 1..1000", 400)
        try:
            data = await read_upload(request, settings.max_body_bytes)
            tensor = await asyncio.to_thread(preprocess_image, data, name, settings.max_image_pixels)
            expected = tuple(engine.inputs[0].shape)
            if tensor.shape != expected:
                raise BadRequest(f"preprocessed image is {tensor.shape}, model expects {expected}")
            item = runtime.make_item({"input": tensor}, 0, None)
        except BadRequest as exc:
            metrics.outcome["bad_request"].inc()
            return error_response(str(exc), exc.status)
        except RequestError as exc:  # the client left during the upload
            metrics.outcome[exc.outcome].inc()
            return error_response(str(exc), exc.status_code)
        outcome = await answer_or_disconnect(request, runtime, [item])
        if isinstance(outcome, Response):
            return outcome
        logits = next(iter(outcome[0].outputs.values()))
        classes = best_classes(logits, name, top_k)
        return json_response({"model_name": name, "top_k": classes}, headers=timing_headers(outcome))

    from server.diffusion_routes import router as diffusion_router  # GET .../generate -> PNG

    app.include_router(diffusion_router)

    # ----------------------------------------------------------------- metrics
    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _refuse_if_not_serving(
    runtime: ModelRuntime, settings: Settings, request: Request | None = None
) -> Response | None:
    """Draining, not ready, or no room in the queue (by count or by time): answered before
    the body is read, so a refused request costs the server almost nothing. A large unread
    body is not drained either: the answer closes the connection."""
    refusal: Response | None = None
    if runtime.draining:
        runtime.metrics.outcome["draining"].inc()
        refusal = error_response("server is draining; retry elsewhere", 503, settings.retry_after_s)
    elif not runtime.ready or runtime.batcher is None:
        refusal = error_response("model is not ready yet", 503, settings.retry_after_s)
    else:
        try:
            runtime.batcher.check_admission()
        except RequestError as exc:
            runtime.metrics.outcome[exc.outcome].inc()
            refusal = error_response(str(exc), exc.status_code, settings.retry_after_s)
    if refusal is not None and request is not None:
        declared = request.headers.get("content-length", "")
        if not declared.isdigit() or int(declared) > DRAIN_UNREAD_BODY_BYTES:
            refusal.headers["connection"] = "close"
    return refusal


async def answer_or_disconnect(
    request: Request, runtime: ModelRuntime, items: list[WorkItem]
) -> list[Result] | Response:
    """Await the answer; if the client goes away first, cancel its items (never computed
    if still queued). Request errors become their HTTP answers.

    The disconnect watcher starts only after ``WATCH_AFTER_S``: most answers come sooner,
    and a watcher task per request costs more than the identity model's whole budget.
    """
    loop = asyncio.get_running_loop()
    watcher: list[asyncio.Task[None]] = []

    def start_watching() -> None:
        watcher.append(loop.create_task(_cancel_on_disconnect(request.receive, runtime, items)))

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        return await runtime.infer(items)
    except RequestError as exc:
        retry = runtime.settings.retry_after_s if exc.retry_after else None
        return error_response(str(exc), exc.status_code, retry)
    finally:
        timer.cancel()
        for task in watcher:
            task.cancel()


async def _cancel_on_disconnect(
    receive: Callable[[], Awaitable[dict[str, Any]]], runtime: ModelRuntime, items: list[WorkItem]
) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            runtime.cancel(items)
            return


def timing_headers(results: list[Result]) -> dict[str, str]:
    """Batching made visible: worst queue and compute time over the request's rows."""
    first = results[0]
    if len(results) == 1:
        queue_s, compute_s, size, energy = (first.queue_time_s, first.compute_time_s,
                                            first.batch_size, first.energy_j)  # fmt: skip
    else:
        queue_s = max(r.queue_time_s for r in results)
        compute_s = max(r.compute_time_s for r in results)
        size = max(r.batch_size for r in results)
        shares = [r.energy_j for r in results]
        energy = None if None in shares else sum(shares)  # type: ignore[arg-type]
    headers = {
        "X-Queue-Time-Ms": f"{queue_s * 1e3:.3f}",
        "X-Compute-Time-Ms": f"{compute_s * 1e3:.3f}",
        "X-Batch-Size": str(size),
    }
    if energy is not None:
        headers["X-Energy-Joules"] = f"{energy:.6f}"
    return headers


def _triton_config(settings: Settings, engine: Any) -> dict[str, Any]:
    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": s.name, "data_type": f"TYPE_{s.datatype}", "dims": list(s.shape)} for s in specs]

    config: dict[str, Any] = {
        "name": settings.model,
        "platform": engine.platform,
        "max_batch_size": settings.max_batch_size,
        "input": tensors(engine.inputs),
        "output": tensors(engine.outputs),
        "instance_group": [{"count": settings.instances,
                            "kind": "KIND_GPU" if "cuda" in engine.device else "KIND_CPU"}],
        "parameters": {"wattserve_batcher": {"string_value": settings.batcher}},
    }  # fmt: skip
    if settings.batcher == "dynamic":
        config["dynamic_batching"] = {
            "preferred_batch_size": list(settings.preferred_batch_sizes),
            "max_queue_delay_microseconds": int(settings.max_queue_delay_ms * 1000),
            "priority_levels": settings.priority_levels,
            "default_priority_level": settings.effective_default_priority,
            "default_queue_policy": {
                "max_queue_size": settings.max_queue_size,
                "default_timeout_microseconds": int((settings.default_timeout_ms or 0) * 1000),
            },
        }
    return config


def _document_infer_route(app: FastAPI) -> None:
    """Describe the Starlette infer route in /openapi.json: FastAPI routes with the same
    paths, appended after it, so they are documented but never matched."""
    errors = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 413, 415, 503, 504)}

    async def infer_doc(name: str, body: InferRequestBody) -> InferResponseBody:  # pragma: no cover
        """KServe v2 inference: JSON tensors, or the binary tensor extension
        (Inference-Header-Content-Length). Answered by the Starlette route above."""
        raise AssertionError("documentation only; the Starlette route answers")

    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.add_api_route(path, infer_doc, methods=["POST"], responses=errors,  # type: ignore[arg-type]
                          response_model=InferResponseBody, summary="Infer")  # fmt: skip
