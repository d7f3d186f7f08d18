"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` (one JSON
answer) and ``/generate_stream`` (Server-Sent Events, one ``data: {...}`` per response).

The body is one JSON object whose keys name the model's inputs (a value or a flat list;
Triton's shape rule below); other keys, and the keys of a nested ``parameters`` object that
are not inputs, are the request's parameters (what a Python model's
``request.parameters()`` answers). The answer holds ``id`` (when given), ``model_name``,
``model_version`` and each output by name (one element: the value itself; else a flat list).

A decoupled model (``model_transaction_policy { decoupled: true }``) streams each response
it sends as one event; any other model answers one event. Errors before the request reaches
its model are JSON answers with their status; after, an event ``data: {"error": ...}`` (the
HTTP status set by the first event, as Triton does). ``/generate`` wants exactly one response.
Same admission path as infer: lookup, readiness, limits, the model's own batcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from wattserve.batchers.status import Status
from wattserve.engines.base import Engine, TensorSpec
from wattserve.server.core.admission import Refused, admit
from wattserve.server.core.bytes_tensors import BYTES, bytes_to_json
from wattserve.server.core.decoupled import ResponseStream, is_decoupled
from wattserve.server.core.request import (
    BadRequest,
    InferRequest,
    assemble_request,
    check_tensor_header,
    output_arrays,
)
from wattserve.server.core.token_stream import token_sink
from wattserve.server.http.routes.body import read_upload
from wattserve.server.http.routes.common import (
    error_response,
    refusal_response,
    timing_headers,
    watching_submit,
)
from wattserve.server.http.status import HTTP_STATUS
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.settings import Settings

SSE_MEDIA = "text/event-stream; charset=utf-8"
ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                "generates various number of responses")  # fmt: skip
PARAMETERS = "parameters"

# (outputs or None, error or None, final)
Event = tuple[dict[str, np.ndarray] | None, BaseException | None, bool]


# ---------------------------------------------------------------------------- request


def _loads(body: bytes, inputs: set[str]) -> dict[str, Any]:
    """The JSON object, refusing an input given twice in Triton's words (json keeps the last)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for key, value in items:
            if key in doc and key in inputs:
                raise BadRequest(f"input '{key}' already exists in request")
            doc[key] = value
        return doc

    try:
        doc = json.loads(body or b"{}", object_pairs_hook=pairs)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, BadRequest):
            raise
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("generate request body must be a JSON object")
    return doc


def triton_shape(spec: TensorSpec, batched: bool, count: int) -> list[int]:
    """Triton's rule for a value without a shape: fixed dimensions take their share of the
    ``count`` elements, the innermost -1 the rest, other -1 dimensions 1 (the batch axis of a
    batching model is a -1)."""
    dims = [-1, *spec.shape] if batched else list(spec.shape)
    remaining = count
    for d in reversed(dims):
        if d != -1:
            if d == 0 or remaining % d:
                raise BadRequest(
                    f"The schema can not convert input '{spec.name}' to tensor with proper shape"
                )
            remaining //= d
    for i in range(len(dims) - 1, -1, -1):
        if dims[i] == -1:
            dims[i], remaining = remaining, 1
    if remaining != 1:
        raise BadRequest(f"The schema can not convert input '{spec.name}' to tensor with proper shape")
    return dims


def _tensor(spec: TensorSpec, value: Any, batched: bool) -> tuple[np.ndarray, list[int]]:
    values = value if isinstance(value, list) else [value]
    if spec.datatype == BYTES:
        if not all(isinstance(v, str) for v in values):
            raise BadRequest("attempt to access JSON non-string as string")
        flat = np.empty(len(values), dtype=object)
        flat[:] = [v.encode() for v in values]
    elif spec.datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise BadRequest("attempt to access JSON non-boolean as boolean")
        flat = np.array(values, dtype=np.bool_)
    else:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise BadRequest(f"input '{spec.name}': attempt to access JSON non-number as {spec.datatype}")
        try:
            flat = np.array(values, dtype=spec.dtype)
        except (OverflowError, ValueError):
            raise BadRequest(f"input '{spec.name}': a value does not fit {spec.datatype}") from None
    shape = triton_shape(spec, batched, len(values))
    return flat.reshape(shape), shape


def parse_generate(body: bytes, runtime: ModelRuntime, engine: Engine) -> InferRequest:
    """A generate body -> one InferRequest checked as infer checks one (400s in Triton's words
    where Triton has them)."""
    by_name = {spec.name: spec for spec in engine.inputs}
    doc = _loads(body, set(by_name))
    max_batch = runtime.request_max_batch
    batched = max_batch > 0
    arrays: dict[str, np.ndarray] = {}
    parameters: dict[str, Any] = {}
    request_id = doc.pop("id", None)
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    nested = doc.pop(PARAMETERS, None)
    if nested is not None and not isinstance(nested, dict):
        raise BadRequest(f"Expected JSON object for keyword: '{PARAMETERS}'")
    for source in (doc, nested or {}):
        for key, value in source.items():
            spec = by_name.get(key)
            if spec is None:
                parameters[key] = value
                continue
            if key in arrays:
                raise BadRequest(f"input '{key}' already exists in request")
            array, shape = _tensor(spec, value, batched)
            check_tensor_header(shape, spec.datatype, spec, max_batch)
            arrays[key] = array
    required = [n for n, spec in by_name.items() if not spec.optional]
    if any(n not in arrays for n in required):
        raise BadRequest(f"expected {len(required)} inputs but got {len(arrays)} inputs for model "
                         f"'{runtime.name}'")  # fmt: skip
    return assemble_request(request_id or None, arrays, {batched}, by_name, parameters, None, engine.outputs)


# ---------------------------------------------------------------------------- response


def _json_value(datatype: str, value: np.ndarray) -> Any:
    data: list[Any] = bytes_to_json(value) if datatype == BYTES else value.ravel().tolist()
    return data[0] if len(data) == 1 else data


def response_doc(name: str, version: str, request: InferRequest, outputs: dict[str, np.ndarray],
                 specs: Any) -> dict[str, Any]:  # fmt: skip
    doc: dict[str, Any] = {}
    if request.id:
        doc["id"] = request.id
    doc["model_name"], doc["model_version"] = name, version
    for out_name, datatype, value in output_arrays(request, outputs, specs):
        if datatype == "BF16":
            value = value.astype(np.float32)
        doc[out_name] = _json_value(datatype, value)
    return doc


def _dumps(doc: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:  # NaN/Inf are fine for orjson; this is a value orjson has no form for
        return json.dumps(doc, default=str).encode()


def _error_of(exc: BaseException) -> tuple[str, int]:
    status = getattr(exc, "status", Status.INTERNAL)
    return str(exc), HTTP_STATUS.get(status, 500) if isinstance(status, Status) else 500


def token_events(loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Event], state: dict[str, Any]) -> Any:
    """A language model's token sink (engine thread) -> one streamed event per piece of text
    (``server.core.token_stream``, shared with gRPC streaming)."""

    def deliver(outputs: dict[str, np.ndarray], final: bool) -> None:
        state["streamed"] = True
        events.put_nowait((outputs, None, False))  # the end comes when the request is answered

    return token_sink(loop, deliver)


# ---------------------------------------------------------------------------- routes


def generate_routes(models: ModelSet, settings: Settings) -> list[Route]:
    retry_after_s = settings.retry_after_s

    async def handle(request: Request, streaming: bool) -> Response:
        params = request.path_params
        name = params["name"]
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        state: dict[str, Any] = {"submitted": False, "decoupled": False}

        async def decode(runtime: ModelRuntime, source: Request) -> tuple[InferRequest, Engine]:
            engine = runtime.engine
            if engine is None:
                raise BadRequest(f"model '{name}' is unloading", Status.UNAVAILABLE)
            body = await read_upload(source, settings.max_body_bytes)
            decoded = parse_generate(body, runtime, engine)
            if is_decoupled(runtime.config):
                stream = ResponseStream(loop, lambda o, e, f: events.put_nowait((o, e, f)))
                decoded.response_sink = stream.sink
                decoded.response_cancelled = stream.is_cancelled
                state.update(decoupled=True, stream=stream)
            elif streaming and getattr(engine, "streams_tokens", False):  # a language model
                decoded.token_sink = token_events(loop, events, state)
            state.update(runtime=runtime, request=decoded, engine=engine)
            return decoded, engine

        async def submit(runtime: ModelRuntime, item: Any, source: Request) -> Any:
            state["submitted"] = True
            return await watching_submit(runtime, item, source)

        task = asyncio.ensure_future(admit(models, name, params.get("version"), decode, request, submit))

        def finished(done: asyncio.Future[Any]) -> None:
            exc = (
                Refused("the request was cancelled", Status.CANCELLED)
                if done.cancelled()
                else done.exception()
            )
            if exc is not None:
                events.put_nowait((None, exc, True))
            elif state.get("streamed"):  # its text went out token by token: the end alone
                events.put_nowait((None, None, True))
            elif not state["decoupled"]:
                events.put_nowait((done.result().result.outputs, None, True))

        task.add_done_callback(finished)
        first = await events.get()
        outputs, error, final = first
        if error is not None and not state["submitted"]:
            assert isinstance(error, Refused)
            return refusal_response(error, retry_after_s, request)
        runtime, decoded, engine = state["runtime"], state["request"], state["engine"]

        def event_doc(outputs: dict[str, np.ndarray] | None, error: BaseException | None) -> dict[str, Any]:
            if error is not None:
                return {"error": str(error)}
            assert outputs is not None
            return response_doc(name, runtime.version, decoded, outputs, engine.outputs)

        if not streaming:
            answers = [first] if outputs is not None or error is not None else []
            while not final:
                event = await events.get()
                final = event[2]
                if event[0] is not None or event[1] is not None:
                    answers.append(event)
            if len(answers) != 1:
                return error_response(ONE_RESPONSE, 400)
            outputs, error, _ = answers[0]
            if error is not None:
                message, status = _error_of(error)
                return error_response(message, status)
            headers = None if state["decoupled"] or not task.done() else timing_headers(task.result().result)
            return Response(_dumps(event_doc(outputs, None)), media_type="application/json", headers=headers)

        status = _error_of(error)[1] if error is not None else 200

        async def sse() -> AsyncIterator[bytes]:
            event: Event = first
            try:
                while True:
                    if event[0] is not None or event[1] is not None:
                        yield b"data: " + _dumps(event_doc(event[0], event[1])) + b"\n\n"
                    if event[2]:
                        return
                    event = await events.get()
            finally:
                if not event[2] and "stream" in state:  # the client left before the final flag
                    state["stream"].cancel()
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task

        return StreamingResponse(sse(), status_code=status, media_type=SSE_MEDIA)

    async def generate(request: Request) -> Response:
        return await handle(request, streaming=False)

    async def generate_stream(request: Request) -> Response:
        return await handle(request, streaming=True)

    routes = []
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes.append(Route(f"{base}/generate", generate, methods=["POST"]))
        routes.append(Route(f"{base}/generate_stream", generate_stream, methods=["POST"]))
    return routes
