"""Refusals of Triton's server extensions (shared memory, trace, logging): Triton's message
and error kind. The kind is one of the neutral status kinds (``batchers/status.py``); each
front end answers it through its one table (``server/http/status.HTTP_STATUS``,
``server/grpc/service.GRPC_CODES``)."""

from __future__ import annotations

from wattserve.batchers.status import Status

KINDS = {
    "invalid": Status.INVALID_ARG,
    "exists": Status.ALREADY_EXISTS,
    "not_found": Status.NOT_FOUND,
    "unsupported": Status.UNSUPPORTED,
    "internal": Status.INTERNAL,
}


class ExtensionError(ValueError):
    """A ValueError, so the admission path answers it like any bad request, with ``status``."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def status(self) -> Status:
        return KINDS[self.kind]
