"""Pure-ASGI middleware: connection headers every answer needs, and the last resort for
an unexpected exception. Pure ASGI (no BaseHTTPMiddleware) because it sits on the hot path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

log = logging.getLogger("wattserve.server")

Scope = dict[str, Any]
Message = dict[str, Any]


class ConnectionHeaders:
    """Adds ``Keep-Alive: timeout=N`` (a hint below the server's own idle timeout, so a
    client stops reusing a connection before the server closes it) and, while draining,
    ``Connection: close`` (so no client reuses a connection the server is about to close).

    An exception that escapes the app becomes a JSON 500 with ``Connection: close``
    instead of uvicorn's plain-text 500 on a connection that then closes unannounced."""

    def __init__(self, app: Any, keep_alive_s: int, draining: Callable[[], bool]) -> None:
        self.app = app
        self.keep_alive = b"timeout=%d" % max(1, keep_alive_s - 1)
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", ()))
                if self.draining():
                    headers.append((b"connection", b"close"))
                else:
                    headers.append((b"keep-alive", self.keep_alive))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise  # the answer is half sent: uvicorn closes the connection
            body = orjson.dumps({"error": "internal server error"})
            await send({
                "type": "http.response.start",
                "status": 500,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body)), (b"connection", b"close")],
            })  # fmt: skip
            await send({"type": "http.response.body", "body": body})
