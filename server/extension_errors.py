"""Refusals of Triton's server extensions (shared memory, trace, logging): Triton's message
and error kind, answered with the HTTP status and gRPC code Triton gives that kind."""

from __future__ import annotations

# Triton's TRITONSERVER_Error codes -> HTTP status (http_server.cc HttpCodeFromError) and
# gRPC status code name.
HTTP_STATUS = {"invalid": 400, "exists": 400, "not_found": 404, "unsupported": 501, "internal": 500}
GRPC_CODE = {"invalid": "INVALID_ARGUMENT", "exists": "ALREADY_EXISTS", "not_found": "NOT_FOUND",
             "unsupported": "UNIMPLEMENTED", "internal": "INTERNAL"}  # fmt: skip


class ExtensionError(ValueError):
    """A ValueError, so the admission path answers it like any bad request, with ``status``."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.kind]

    @property
    def grpc_code(self) -> str:
        return GRPC_CODE[self.kind]
