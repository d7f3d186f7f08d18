"""KServe v2 inference: ``POST /v2/models/{m}[/versions/{v}]/infer``, the hot path.

Plain Starlette routes (the app puts them first in its table): FastAPI's parameter
machinery cost ~100 us a request here, more than the identity model's whole budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from wattserve.server.core.admission import Admitted, Refused, admit, timing_values
from wattserve.server.core.decode import BodyBudget, InferenceDecoder
from wattserve.server.extensions.shared_memory import SharedMemoryRegistry, ShmError
from wattserve.server.http.codec import (
    BINARY_HEADER,
    BINARY_HEADER_RAW,
    InferBody,
    encode_infer_response,
    parse_infer_body,
)
from wattserve.server.http.routes.body import check_content_type, inference_headers, read_reserved_body
from wattserve.server.http.routes.common import error_response, refusal_response, watching_submit
from wattserve.server.http.status import HTTP_STATUS
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.settings import Settings

try:
    from wattserve.server.http.protocol import write_response_at_once
except ImportError:  # no httptools: uvicorn's h11 protocol serves, and a Response writes itself

    def write_response_at_once(
        send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes | memoryview
    ) -> bool:
        return False


class InferResponse(Response):
    """A 200 whose header list is built as bytes here: Starlette's Response encodes,
    lowercases and scans a dict of str headers on every answer (~190 of the ~3,500 Python
    opcodes per identity request)."""

    def __init__(self, body: bytes, media_type: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [*headers, (b"content-length", b"%d" % len(body)), (b"content-type", media_type)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Written to the connection in one go where the server is uvicorn's httptools
        protocol (``server.http.protocol.write_response_at_once``); as any Response elsewhere."""
        if not write_response_at_once(send, self.status_code, self.raw_headers, self.body):
            await super().__call__(scope, receive, send)


# How a front end admits one inference request: (the request, model name, version) -> its
# answer (``server.core.admission.admit`` in one process; the engine core's in a front-end
# process, ``server.split.frontend``). Raises Refused.
AdmitRequest = Callable[[Request, str, str | None], Awaitable[Admitted]]


def inference_routes(
    models: ModelSet, settings: Settings, body_budget: BodyBudget, shm: SharedMemoryRegistry | None = None
) -> list[Route]:
    max_body_bytes = settings.max_body_bytes

    async def read(runtime: ModelRuntime, request: Request) -> tuple[InferBody, int, int]:
        """The body within the limits (415, 413, 503 past the body budget), held in the budget."""
        content_type, declared, binary_length = inference_headers(request.scope)
        check_content_type(content_type)
        body, held = await read_reserved_body(request, declared, max_body_bytes, body_budget)
        return (body, binary_length), held, len(body)

    decode = InferenceDecoder(read, parse_infer_body, body_budget, shm)

    def admit_request(request: Request, name: str, version: str | None) -> Awaitable[Admitted]:
        return admit(models, name, version, decode, request, watching_submit)

    return infer_routes(admit_request, settings.retry_after_s, shm)


def infer_routes(
    admit_request: AdmitRequest, retry_after_s: int, shm: SharedMemoryRegistry | None = None
) -> list[Route]:
    """The two infer paths, answered by ``admit_request`` and encoded here (JSON or binary)."""

    async def infer(request: Request) -> Response:
        params = request.path_params
        name = params["name"]
        try:
            done = await admit_request(request, name, params.get("version"))
        except Refused as refused:
            return refusal_response(refused, retry_after_s, request)
        engine = done.engine
        assert engine is not None  # the inference decoder gives the engine it decoded for
        try:
            payload, extra = encode_infer_response(name, done.request, done.result.outputs,
                                                   engine.outputs, done.runtime.version, shm,
                                                   labels=done.runtime.class_labels)  # fmt: skip
        except ShmError as exc:  # an output region too small, or unregistered meanwhile
            return error_response(str(exc), HTTP_STATUS[exc.status])
        queue_ms, compute_ms, size = timing_values(done.result)
        headers = [(b"x-queue-time-ms", queue_ms.encode()), (b"x-compute-time-ms", compute_ms.encode()),
                   (b"x-batch-size", size.encode())]  # fmt: skip
        if extra:
            headers.append((BINARY_HEADER_RAW, extra[BINARY_HEADER].encode()))
            return InferResponse(payload, b"application/octet-stream", headers)
        return InferResponse(payload, b"application/json", headers)

    paths = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer")
    return [Route(path, infer, methods=["POST"]) for path in paths]
