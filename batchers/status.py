"""Status kinds every layer raises, and no layer numbers: each front end maps them once.

Triton's own error codes (``TRITONSERVER_ERROR_*``) are the model: the core says *what*
went wrong (an invalid argument, something unavailable for now, ...) and the HTTP and gRPC
front ends each translate that with one table (``server/http/status.py``,
``server/grpc/service.GRPC_CODES``). A few kinds that only a transport can cause (a body
over the size limit, a media type it does not take, a failed token check) are here too,
so that the same table shape covers them.
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    """Why a request got no result. Values are Triton's names where Triton has the kind."""

    INVALID_ARG = "INVALID_ARG"  # the client's request is wrong (shape, datatype, parameter)
    NOT_FOUND = "NOT_FOUND"  # unknown model, version, region, route
    UNAVAILABLE = "UNAVAILABLE"  # try again later: queue full, timeout expired, draining, loading
    UNSUPPORTED = "UNSUPPORTED"  # a valid request for something wattserve does not do
    INTERNAL = "INTERNAL"  # the server or the model failed
    CANCELLED = "CANCELLED"  # the client went away
    ALREADY_EXISTS = "ALREADY_EXISTS"  # e.g. a shared-memory region registered twice
    TOO_LARGE = "TOO_LARGE"  # a body or message over the configured limit
    UNSUPPORTED_MEDIA = "UNSUPPORTED_MEDIA"  # a content type inference does not take
    UNAUTHENTICATED = "UNAUTHENTICATED"  # missing or wrong bearer token
    PERMISSION_DENIED = "PERMISSION_DENIED"  # a restricted API without its header
