"""Triton's shared-memory extensions over HTTP: ``/v2/systemsharedmemory/...`` and
``/v2/cudasharedmemory/...`` (register, unregister, status), answered as Triton answers:
a JSON array of regions for status, an empty 200 for register and unregister, and
``{"error": ...}`` with Triton's message and status for a refusal."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from wattserve.server.extensions.shared_memory import SharedMemoryRegistry, ShmError
from wattserve.server.http.routes.common import error_response, json_response
from wattserve.server.http.status import HTTP_STATUS

MAX_REGISTER_BODY = 64 * 1024  # a register request is a few fields


def shared_memory_router(shm: SharedMemoryRegistry) -> APIRouter:
    router = APIRouter()

    def answer(call: Callable[[], Any]) -> Response:
        try:
            result = call()
        except ShmError as exc:
            return error_response(str(exc), HTTP_STATUS[exc.status])
        if result is None:
            return Response(b"", status_code=200, media_type="application/json")
        return json_response(result)

    for prefix, kind in (("/v2/systemsharedmemory", "system"), ("/v2/cudasharedmemory", "cuda")):
        _add_kind(router, prefix, kind, shm, answer)
    return router


def _add_kind(
    router: APIRouter, prefix: str, kind: str, shm: SharedMemoryRegistry, answer: Callable[..., Response]
) -> None:
    async def status(name: str | None = None) -> Response:
        return answer(lambda: shm.status(kind, name))

    async def register(name: str, request: Request) -> Response:
        try:
            doc = await _body(request)
        except ShmError as exc:
            return error_response(str(exc), HTTP_STATUS[exc.status])
        if kind == "system":
            return answer(lambda: _register_system(shm, name, doc))
        return answer(lambda: _register_cuda(shm, name, doc))

    async def unregister(name: str) -> Response:
        return answer(lambda: shm.unregister(name, kind))

    async def unregister_all() -> Response:
        return answer(lambda: shm.unregister_all(kind))

    router.add_api_route(prefix + "/status", status, methods=["GET"])
    router.add_api_route(prefix + "/region/{name}/status", status, methods=["GET"])
    router.add_api_route(prefix + "/region/{name}/register", register, methods=["POST"])
    router.add_api_route(prefix + "/region/{name}/unregister", unregister, methods=["POST"])
    router.add_api_route(prefix + "/unregister", unregister_all, methods=["POST"])


async def _body(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_REGISTER_BODY:
        raise ShmError(f"register request body exceeds {MAX_REGISTER_BODY} bytes")
    body = await request.body()
    if len(body) > MAX_REGISTER_BODY:
        raise ShmError(f"register request body exceeds {MAX_REGISTER_BODY} bytes")
    try:
        doc = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise ShmError(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict):
        raise ShmError("shared memory register request must be a JSON object")
    return doc


def _register_system(shm: SharedMemoryRegistry, name: str, doc: dict[str, Any]) -> None:
    shm.check_allowed()  # Triton: a disabled server refuses before reading the body
    if "key" not in doc:
        raise ShmError("Shared memory register request has no 'key' field")
    if "byte_size" not in doc:
        raise ShmError("Shared memory register request has no 'byte_size' field")
    shm.register_system(name, doc["key"], doc.get("offset", 0), doc["byte_size"])


def _register_cuda(shm: SharedMemoryRegistry, name: str, doc: dict[str, Any]) -> None:
    shm.check_allowed()
    raw = doc.get("raw_handle")
    if not isinstance(raw, dict) or not isinstance(raw.get("b64"), str):
        raise ShmError("Shared memory register request has no 'raw_handle' field")
    try:
        handle = base64.b64decode(raw["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise ShmError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t") from None
    for field in ("byte_size", "device_id"):
        if field not in doc:
            raise ShmError(f"Shared memory register request has no '{field}' field")
    shm.register_cuda(name, handle, doc["device_id"], doc["byte_size"])


__all__ = ["shared_memory_router"]
