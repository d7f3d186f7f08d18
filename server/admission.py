"""Admission and body reading: decide before the body is read, and never read more than
the limits allow, so a refused request costs a few bytes and memory stays bounded by the
limits rather than by the load.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.formparsers import MultiPartParser
from starlette.requests import ClientDisconnect, Request

from batchers.types import ClientGone
from server.codec import BadRequest

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
        super().__init__("server is reading too many request bodies at once; retry shortly", 503)


def check_content_type(request: Request) -> None:
    """Inference takes JSON or octet-stream (or an unnamed type, as some clients send)."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media in BROWSER_SIMPLE_TYPES:
        raise BadRequest(
            f"content type {media!r} is not accepted for inference; send application/json "
            "or application/octet-stream",
            415,
        )


@contextlib.asynccontextmanager
async def reserved_body(request: Request, limit: int, budget: BodyBudget) -> AsyncIterator[list[bytes]]:
    """Read the whole body within ``limit`` (413) and the shared ``budget`` (503); the
    reservation is held until the block exits. Yields a one-element list with the body."""
    held = 0
    try:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit():
            size = int(declared)
            if size > limit:
                raise BadRequest(f"body of {declared} bytes exceeds the {limit}-byte limit", 413)
            if not budget.try_reserve(size):
                raise BudgetExceeded()
            held = size
            body = await _body(request)
        else:
            chunks: list[bytes] = []
            async for chunk in _stream(request, limit):
                if not budget.try_reserve(len(chunk)):
                    raise BudgetExceeded()
                held += len(chunk)
                chunks.append(chunk)
            body = b"".join(chunks)
        yield [body]
    finally:
        budget.release(held)


async def read_upload(request: Request, limit: int) -> bytes:
    """Image bytes from a multipart form (field 'file') or from the raw body, counted
    against ``limit`` as they stream in (chunked uploads included)."""
    content_type = request.headers.get("content-type", "")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"body of {declared} bytes exceeds the {limit}-byte limit", 413)
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
                raise BadRequest(f"body exceeds the {limit}-byte limit", 413)
            yield chunk
    except ClientDisconnect:
        raise ClientGone("client disconnected during the upload") from None


async def _body(request: Request) -> bytes:
    try:
        return await request.body()  # the server stops at Content-Length
    except ClientDisconnect:
        raise ClientGone("client disconnected during the upload") from None
