"""The HTTP front end's body reading: the inference headers in one pass, the content-type
check, the whole body within the body limit (413) and the shared in-flight body budget
(503, ``server.core.decode.BodyBudget``), and multipart uploads. Starlette's request lives
here and in the routes, never in ``server.core``.

Never more than the limits allow is read, so memory stays bounded by the limits rather
than by the load; a client leaving mid-upload is ``ClientGone`` (499).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.formparsers import MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.types import Scope
from wattserve.batchers.status import Status
from wattserve.batchers.types import ClientGone
from wattserve.server.core.decode import BodyBudget, BudgetExceeded
from wattserve.server.core.request import BadRequest
from wattserve.server.http.codec import BINARY_HEADER_RAW

# The CORS-safelisted request types: a web page may POST them cross-origin without a
# preflight, so a local server that computed them could be driven by any page.
BROWSER_SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")


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
    if content_type == "application/json":  # what nearly every request says: no parsing
        return
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


async def _stream(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
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
