"""Every HTTP request a front end does not answer itself goes to the core's own HTTP server.

Model control, metadata, statistics, /metrics, shared-memory registration, trace and log
settings, generate and OpenAI streams, image routes, and inferences that use the core's
state (shared-memory tensors, classification): the core answers them as a single-process
server would, over a Unix socket, so the server looks like one to its clients whatever
the number of front ends. Responses stream back as they come (server-sent events too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from wattserve.server.http.routes.common import error_response

# Hop-by-hop headers (RFC 9110 7.6.1) are the connection's own, not forwarded either way.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)


class CoreHttp:
    """The core's HTTP server, reached over its Unix socket."""

    def __init__(self, path: str, retry_after_s: int) -> None:
        self.path = path
        self.retry_after_s = retry_after_s
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.UnixConnector(path=self.path, limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def unavailable(self) -> Response:
        return error_response("the engine core is not available; retry", 503, self.retry_after_s)

    async def forward(self, request: Request, body: bytes | None = None) -> Response:
        """Send ``request`` to the core, its body given when already read, else streamed as
        it arrives (the front end holds none of it, and the core's route judges it: a body
        over its limit is refused in that route's words and status, as by one process);
        stream the core's answer back."""
        headers = [(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP]
        if body is not None:  # read already: its length is the one sent
            headers = [(k, v) for k, v in headers if k != "content-length"]
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        data: bytes | AsyncIterator[bytes] | None = body
        if body is None and (
            request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
        ):
            data = _relayed(request)
        try:
            upstream = await self.session().request(
                request.method, f"http://core{target}", headers=headers, data=data, allow_redirects=False
            )
        except (aiohttp.ClientConnectionError, OSError, ClientDisconnect):
            return self.unavailable()
        answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.content.iter_any():
                    yield chunk
            finally:
                upstream.release()

        return StreamingResponse(stream(), upstream.status, answer_headers)


async def _relayed(request: Request) -> AsyncIterator[bytes]:
    """The request's body chunk by chunk, as the client sends it."""
    async for chunk in request.stream():
        if chunk:
            yield chunk
