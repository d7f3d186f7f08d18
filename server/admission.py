"""Admission: the one path every front end takes (lookup, readiness and queue room, decode,
validate, submit), and body reading within limits.

``admit`` knows no HTTP: a front end passes how to decode its request for the chosen model
(HTTP reads the body within the limits below and parses it; a gRPC front end would convert
its protobuf) and, optionally, how to submit (HTTP wraps it in a gone-client watcher).
Refusals are ``Refused`` exceptions carrying the status a front end maps to its answer.
Everything that can refuse a request without its body is decided before the body is read,
and never more than the limits allow is read, so a refused request costs a few bytes and
memory stays bounded by the limits rather than by the load.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from starlette.formparsers import MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.types import Scope
from wattserve.batchers.status import Status
from wattserve.batchers.types import ClientGone, RequestError, Result, WorkItem
from wattserve.server.codec import BINARY_HEADER_RAW, BadRequest, InferRequest
from wattserve.server.model_set import ModelSet, ModelState, UnknownModel
from wattserve.server.runtime import ModelRuntime

log = logging.getLogger("wattserve.admission")

# The CORS-safelisted request types: a web page may POST them cross-origin without a
# preflight, so a local server that computed them could be driven by any page.
BROWSER_SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")


class BodyBudget:
    """Request-body bytes being read or parsed at once, over all requests.

    A request reserves its declared length (or, chunked, each chunk as it arrives) and
    releases it when its answer is sent; past the budget new requests are refused with 503
    before their body is read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def try_reserve(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)


class BudgetExceeded(BadRequest):
    def __init__(self) -> None:
        super().__init__(
            "server is reading too many request bodies at once; retry shortly", Status.UNAVAILABLE
        )


def inference_headers(scope: Scope) -> tuple[str, str | None, str | None]:
    """Content-Type, Content-Length and Inference-Header-Content-Length (each the first
    given, or ""/None), in one pass over the raw header list: three Starlette header
    lookups were ~150 Python opcodes of each identity request."""
    content_type = length = binary = None
    for name, value in scope["headers"]:  # ASGI header names are lowercase
        if name == b"content-type":
            if content_type is None:
                content_type = value.decode("latin-1")
        elif name == b"content-length":
            if length is None:
                length = value.decode("latin-1")
        elif name == BINARY_HEADER_RAW and binary is None:
            binary = value.decode("latin-1")
    return content_type or "", length, binary


def check_content_type(content_type: str) -> None:
    """Inference takes JSON or octet-stream (or an unnamed type, as some clients send)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in BROWSER_SIMPLE_TYPES:
        raise BadRequest(
            f"content type {media!r} is not accepted for inference; send application/json "
            "or application/octet-stream",
            Status.UNSUPPORTED_MEDIA,
        )


async def read_reserved_body(
    request: Request, declared: str | None, limit: int, budget: BodyBudget
) -> tuple[bytes, int]:
    """Read the whole body within ``limit`` (413) and the shared ``budget`` (503), given the
    request's Content-Length (``declared``). Returns the body and the bytes it reserved,
    which the caller gives back (``budget.release``) once it is done with the body."""
    held = 0
    try:
        if declared is not None and declared.isdigit():
            size = int(declared)
            if size > limit:
                raise BadRequest(f"body of {declared} bytes exceeds the {limit}-byte limit", Status.TOO_LARGE)
            if not budget.try_reserve(size):
                raise BudgetExceeded()
            held = size
            return await _body(request), held
        chunks: list[bytes] = []
        async for chunk in _stream(request, limit):
            if not budget.try_reserve(len(chunk)):
                raise BudgetExceeded()
            held += len(chunk)
            chunks.append(chunk)
        return b"".join(chunks), held
    except BaseException:
        budget.release(held)
        raise


async def read_upload(request: Request, limit: int) -> bytes:
    """Image bytes from a multipart form (field 'file') or from the raw body, counted
    against ``limit`` as they stream in (chunked uploads included)."""
    content_type = request.headers.get("content-type", "")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"body of {declared} bytes exceeds the {limit}-byte limit", Status.TOO_LARGE)
    if not content_type.startswith("multipart/form-data"):
        return b"".join([chunk async for chunk in _stream(request, limit)])
    parser = MultiPartParser(request.headers, _stream(request, limit), max_files=1, max_fields=4)
    try:
        form = await parser.parse()
    except BadRequest:
        raise
    except Exception as exc:  # starlette's MultiPartException and friends: malformed form
        raise BadRequest(f"malformed multipart upload: {exc}") from None
    try:
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise BadRequest("multipart upload needs a file field named 'file'")
        return await upload.read()
    finally:
        await form.close()


async def _stream(request: Request, limit: int) -> AsyncIterator[bytes]:
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BadRequest(f"body exceeds the {limit}-byte limit", Status.TOO_LARGE)
            yield chunk
    except ClientDisconnect:
        raise ClientGone("client disconnected during the upload") from None


async def _body(request: Request) -> bytes:
    """The whole body, straight from ``receive`` (the server stops at Content-Length).

    Not ``Request.body()``: its async generator and ``aclosing`` were ~130 Python opcodes
    of each identity request, for a body that almost always comes in one message. Nothing
    reads this request's stream again (the gone-client watch only awaits the disconnect)."""
    receive = request.receive
    chunks: list[bytes] = []
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        elif kind == "http.disconnect":
            raise ClientGone("client disconnected during the upload")


# ---------------------------------------------------------------------------- the admission path


class Refused(Exception):
    """A request answered without a result: its status kind (each front end maps it) and why.

    ``body_unread``: refused before (all of) its body was read, so an HTTP front end closes
    the connection rather than draining a large body it will not use."""

    def __init__(
        self, message: str, status: Status, retry_after: bool = False, body_unread: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.body_unread = body_unread


@dataclass(slots=True)
class Admitted:
    runtime: ModelRuntime
    request: InferRequest
    result: Result


Decode = Callable[[ModelRuntime], Awaitable[InferRequest]]
Submit = Callable[[ModelRuntime, WorkItem], Awaitable[Result]]


def select(models: ModelSet, name: str, version: str | None) -> ModelRuntime:
    """The runtime that will serve ``name``/``version``, or Refused: NOT_FOUND unknown;
    UNAVAILABLE + Retry-After while loading, draining or without queue room (by count or
    measured time); INVALID_ARG with the reason for a model that failed to load or was
    unloaded."""
    try:
        entry = models.lookup(name, version)
    except UnknownModel as exc:
        raise Refused(str(exc), Status.NOT_FOUND, body_unread=True) from None
    runtime = entry.runtime
    if runtime is not None and runtime.draining:
        runtime.metrics.outcome["draining"].inc()
        raise Refused(f"model {name!r} is draining; retry elsewhere", Status.UNAVAILABLE, True, True)
    if (
        entry.state is ModelState.READY
        and runtime is not None
        and runtime.ready
        and runtime.batcher is not None
    ):
        try:
            runtime.batcher.check_admission()
        except RequestError as exc:
            runtime.metrics.outcome[exc.outcome].inc()
            raise Refused(str(exc), exc.status, True, True) from None
        return runtime
    if models.draining:
        raise Refused("server is draining; retry elsewhere", Status.UNAVAILABLE, True, True)
    if entry.state in (ModelState.LOADING, ModelState.UNLOADING):
        raise Refused(f"model {name!r} is {entry.state.value.lower()}", Status.UNAVAILABLE, True, True)
    raise Refused(
        f"model {name!r} is not available: {entry.reason or entry.state.value}",
        Status.INVALID_ARG,
        body_unread=True,
    )


async def admit(
    models: ModelSet, name: str, version: str | None, decode: Decode, submit: Submit | None = None
) -> Admitted:
    """Lookup, readiness and room, decode + validate (4xx before any queue), submit, answer."""
    runtime = select(models, name, version)
    try:
        request = await decode(runtime)
        item = runtime.make_item(request)
    except (BadRequest, ValueError) as exc:
        status = getattr(exc, "status", Status.INVALID_ARG)
        busy = status is Status.UNAVAILABLE
        runtime.metrics.outcome["queue_full" if busy else "bad_request"].inc()
        unread = busy or status is Status.TOO_LARGE
        raise Refused(str(exc), status, retry_after=busy, body_unread=unread) from None
    except RequestError as exc:  # the client left during the upload
        runtime.metrics.outcome[exc.outcome].inc()
        raise Refused(str(exc), exc.status, exc.retry_after) from None
    try:
        result = await (submit(runtime, item) if submit is not None else runtime.infer(item))
    except RequestError as exc:
        raise Refused(str(exc), exc.status, exc.retry_after) from None
    return Admitted(runtime, request, result)
