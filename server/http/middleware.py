"""The last resort for an unexpected exception: a JSON 500 with ``Connection: close``
instead of Starlette's plain-text 500 on a connection that then closes unannounced.

The connection headers every answer carries (``Keep-Alive: timeout=N``, and ``Connection:
close`` once a SIGTERM drain begins) are uvicorn's default headers, set in
``server.lifecycle`` at no per-request cost (a middleware here cost ~10% of the identity
model's throughput).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response


async def internal_error(request: Request, exc: Exception) -> Response:
    """Starlette logs the exception after sending this (ServerErrorMiddleware re-raises)."""
    return Response(orjson.dumps({"error": "internal server error"}), status_code=500,
                    media_type="application/json", headers={"connection": "close"})  # fmt: skip


async def http_error(request: Request, exc: Exception) -> Response:
    """A routing or framework refusal (unknown route 404, wrong method 405) in the server's
    own error shape, ``{"error": ...}``, as every other answer has it, not ``{"detail": ...}``."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "error"
    headers = getattr(exc, "headers", None)
    return Response(orjson.dumps({"error": str(detail)}), status_code=status, media_type="application/json",
                    headers=headers)  # fmt: skip


async def invalid_parameters(request: Request, exc: Exception) -> Response:
    """A query or path parameter the route's declaration refuses: INVALID_ARG (400), with
    what was wrong, in the server's error shape."""
    errors: list[dict[str, Any]] = getattr(exc, "errors", lambda: [])()
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors]
    return Response(orjson.dumps({"error": "; ".join(parts) or "invalid request"}), status_code=400,
                    media_type="application/json")  # fmt: skip
