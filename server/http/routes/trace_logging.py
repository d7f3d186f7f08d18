"""Triton's trace and logging extensions over HTTP: ``/v2/trace/setting``,
``/v2/models/{m}/trace/setting`` and ``/v2/logging`` (GET reads, POST updates and reads)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from wattserve.server.extensions.errors import ExtensionError
from wattserve.server.extensions.trace_logging import LogSettings, TraceSettings, check_model_ready
from wattserve.server.http.routes.common import error_response, json_response
from wattserve.server.http.status import HTTP_STATUS
from wattserve.server.models.model_set import ModelSet

MAX_SETTINGS_BODY = 64 * 1024


def trace_logging_router(models: ModelSet, trace: TraceSettings, log: LogSettings) -> APIRouter:
    router = APIRouter()

    async def trace_setting(request: Request, name: str | None = None) -> Response:
        try:
            if name is not None:
                check_model_ready(models, name)
            if request.method == "POST":
                return json_response(trace.update(name, await _json_object(request, "trace")))
            return json_response(trace.get(name))
        except ExtensionError as exc:
            return error_response(str(exc), HTTP_STATUS[exc.status])

    async def logging_setting(request: Request) -> Response:
        try:
            if request.method == "POST":
                return json_response(log.update(await _json_object(request, "dynamic logging")))
            return json_response(log.get())
        except ExtensionError as exc:
            return error_response(str(exc), HTTP_STATUS[exc.status])

    for method in ("GET", "POST"):  # one route each: distinct OpenAPI operation ids
        router.add_api_route("/v2/trace/setting", trace_setting, methods=[method])
        router.add_api_route("/v2/models/{name}/trace/setting", trace_setting, methods=[method])
        router.add_api_route("/v2/logging", logging_setting, methods=[method])
    return router


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_SETTINGS_BODY:
        raise ExtensionError(f"{what} request body exceeds {MAX_SETTINGS_BODY} bytes")
    body = await request.body()
    if len(body) > MAX_SETTINGS_BODY:
        raise ExtensionError(f"{what} request body exceeds {MAX_SETTINGS_BODY} bytes")
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise ExtensionError(f"failed to parse the request JSON buffer for {what}: {exc}") from None
    if not isinstance(doc, dict):
        raise ExtensionError(f"{what} request must be a JSON object")
    return doc


__all__ = ["trace_logging_router"]
