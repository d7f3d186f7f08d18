"""The HTTP front end's one table: a status kind -> the HTTP status it answers with.

Triton's own mapping (``HttpCodeFromError`` in its HTTP server) where Triton has the kind:
INVALID_ARG, ALREADY_EXISTS and the rest 400, NOT_FOUND 404, UNAVAILABLE 503,
UNSUPPORTED 501, INTERNAL 500. The transport kinds get their HTTP meaning; a client that
went away gets nginx's 499 (nobody reads it, but logs and metrics do).
"""

from __future__ import annotations

from wattserve.batchers.status import Status

HTTP_STATUS: dict[Status, int] = {
    Status.INVALID_ARG: 400,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
    Status.INTERNAL: 500,
    Status.CANCELLED: 499,
    Status.ALREADY_EXISTS: 400,
    Status.TOO_LARGE: 413,
    Status.UNSUPPORTED_MEDIA: 415,
    Status.UNAUTHENTICATED: 401,
    Status.PERMISSION_DENIED: 403,
}
