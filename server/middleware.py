"""The last resort for an unexpected exception: a JSON 500 with ``Connection: close``
instead of Starlette's plain-text 500 on a connection that then closes unannounced.

The connection headers every answer carries (``Keep-Alive: timeout=N``, and ``Connection:
close`` once a SIGTERM drain begins) are uvicorn's default headers, set in
``server.lifecycle`` at no per-request cost (a middleware here cost ~10% of the identity
model's throughput).
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response


async def internal_error(request: Request, exc: Exception) -> Response:
    """Starlette logs the exception after sending this (ServerErrorMiddleware re-raises)."""
    return Response(orjson.dumps({"error": "internal server error"}), status_code=500,
                    media_type="application/json", headers={"connection": "close"})  # fmt: skip
