"""Triton's model-repository extension: index, load, unload.

What a client may change follows the model control mode (``ModelSet.mode``, Triton's
``--model-control-mode``): in ``none`` (the default) and ``poll``, load and unload answer
503 with Triton's message; in ``explicit`` a load re-reads the model's directory (a reload
drains and frees the running versions first) and an unload stops accepting for that model,
answers every request it accepted, then frees its engines. A load may carry Triton's
overrides: ``parameters.config`` (a JSON ModelConfig) and ``file:<path>`` model files as
base64 strings (``server.models.repository.override``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from wattserve.server.http.routes.common import error_response, json_response
from wattserve.server.models.model_set import (
    ModelControlRefused,
    ModelLoadError,
    ModelSet,
    UnknownModel,
    load_failure,
)
from wattserve.server.models.repository.override import (
    FILE_PREFIX,
    LoadOverride,
    OverrideError,
    parse_override,
)

SMALL_BODY = 1 << 20  # index and unload bodies are small JSON objects


def repository_router(models: ModelSet, max_load_bytes: int = 64 << 20) -> APIRouter:
    """``max_load_bytes``: the largest load body (it may carry model files, base64)."""
    router = APIRouter()

    @router.post("/v2/repository/index")
    async def index(request: Request) -> Response:
        body = await _json_body(request, SMALL_BODY)
        if isinstance(body, Response):
            return body
        return json_response(models.index(ready_only=bool(body.get("ready", False))))

    @router.post("/v2/repository/models/{name}/load")
    async def load(name: str, request: Request) -> Response:
        try:
            models.check_control()  # before reading a body that may hold model files
        except ModelControlRefused as exc:
            return error_response(str(exc), 503)
        body = await _json_body(request, max_load_bytes)
        if isinstance(body, Response):
            return body
        try:
            override = http_override(name, body.get("parameters"))
        except OverrideError as exc:
            return error_response(str(exc), 400)
        try:
            entries = await models.load(name, override)
        except ModelControlRefused as exc:
            return error_response(str(exc), 503)
        except UnknownModel as exc:
            return error_response(str(exc), 404)
        except ModelLoadError as exc:
            return error_response(str(exc), 503)
        failure = load_failure(name, entries)
        if failure:
            return error_response(failure, 400)
        return json_response({})

    @router.post("/v2/repository/models/{name}/unload")
    async def unload(name: str, request: Request) -> Response:
        body = await _json_body(request, SMALL_BODY)
        if isinstance(body, Response):
            return body
        try:
            await models.unload(name)
        except ModelControlRefused as exc:
            return error_response(str(exc), 503)
        except UnknownModel as exc:
            return error_response(str(exc), 404)
        return json_response({})

    return router


def http_override(name: str, parameters: Any) -> LoadOverride | None:
    """The override an HTTP load's ``parameters`` carry (files as base64 strings)."""
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise OverrideError("'parameters' must be a JSON object")
    files = {}
    for key, value in parameters.items():
        if not key.startswith(FILE_PREFIX):
            continue
        if not isinstance(value, str):
            raise OverrideError(f"parameter {key!r} must be the file's contents as a base64 string")
        try:
            files[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise OverrideError(f"parameter {key!r} is not valid base64") from None
    return parse_override(name, parameters.get("config"), files)


async def _json_body(request: Request, limit: int) -> dict | Response:
    raw = await request.body()
    if len(raw) > limit:
        return error_response(f"repository request body over {limit} bytes", 413)
    if not raw.strip():
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return error_response(f"malformed JSON: {exc}", 400)
    if not isinstance(doc, dict):
        return error_response("request body must be a JSON object", 400)
    return doc
