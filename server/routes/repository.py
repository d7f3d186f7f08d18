"""Triton's model-repository extension: index, load, unload.

Every model is loaded at start-up; load and unload work at any time (Triton's explicit
mode with ``--load-model=*``). A load re-reads the model's directory (a reload drains and
frees the running versions first); an unload stops accepting for that model, answers
every request it accepted, then frees its engines.
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from wattserve.server.model_set import ModelLoadError, ModelSet, ModelState, UnknownModel
from wattserve.server.routes.common import error_response, json_response


def repository_router(models: ModelSet) -> APIRouter:
    router = APIRouter()

    @router.post("/v2/repository/index")
    async def index(request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        return json_response(models.index(ready_only=bool(body.get("ready", False))))

    @router.post("/v2/repository/models/{name}/load")
    async def load(name: str, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        if (body.get("parameters") or {}).get("config") is not None:
            return error_response("load with an overriding config is not supported; edit config.pbtxt", 400)
        try:
            entries = await models.load(name)
        except UnknownModel as exc:
            return error_response(str(exc), 404)
        except ModelLoadError as exc:
            return error_response(str(exc), 503)
        failed = [e for e in entries if e.state is not ModelState.READY]
        if failed:
            return error_response(f"failed to load {name!r}: " + "; ".join(e.reason for e in failed), 400)
        return json_response({})

    @router.post("/v2/repository/models/{name}/unload")
    async def unload(name: str, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        try:
            await models.unload(name)
        except UnknownModel as exc:
            return error_response(str(exc), 404)
        return json_response({})

    return router


async def _json_body(request: Request) -> dict | Response:
    raw = await request.body()
    if len(raw) > 1 << 20:
        return error_response("repository request bodies are small JSON objects", 413)
    if not raw.strip():
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return error_response(f"malformed JSON: {exc}", 400)
    if not isinstance(doc, dict):
        return error_response("request body must be a JSON object", 400)
    return doc
