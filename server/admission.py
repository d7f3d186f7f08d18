"""The one admission path every front end uses: lookup, readiness, decode, validate, submit.

It knows no HTTP: a front end passes how to decode its request for the chosen model (HTTP
reads and parses the body; a gRPC front end would convert its protobuf) and, optionally,
how to submit (HTTP wraps it in a gone-client watcher). Refusals are ``Refused``
exceptions carrying the status a front end maps to its own error answer. The model is
chosen and its readiness checked before the body is read, so a request for an unknown,
loading or draining model costs no body read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from batchers.types import RequestError, Result, WorkItem
from server.codec import BadRequest, InferRequest
from server.model_set import ModelSet, ModelState, UnknownModel
from server.runtime import ModelRuntime


class Refused(Exception):
    """A request answered without a result: ``status`` (HTTP numbering) and why."""

    def __init__(self, message: str, status: int, retry_after: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@dataclass(slots=True)
class Admitted:
    runtime: ModelRuntime
    request: InferRequest
    results: list[Result]


Decode = Callable[[ModelRuntime], Awaitable[InferRequest]]
Submit = Callable[[ModelRuntime, list[WorkItem]], Awaitable[list[Result]]]


def select(models: ModelSet, name: str, version: str | None) -> ModelRuntime:
    """The runtime that will serve ``name``/``version``, or Refused (404 unknown, 503 loading
    or draining, 400 failed/unloaded with the reason)."""
    try:
        entry = models.lookup(name, version)
    except UnknownModel as exc:
        raise Refused(str(exc), 404) from None
    runtime = entry.runtime
    if entry.state is ModelState.READY and runtime is not None and runtime.ready:
        return runtime
    if runtime is not None and runtime.draining:
        runtime.metrics.outcome["draining"].inc()
        raise Refused(f"model {name!r} is draining; retry elsewhere", 503, retry_after=True)
    if models.draining:
        raise Refused("server is draining; retry elsewhere", 503, retry_after=True)
    if entry.state in (ModelState.LOADING, ModelState.UNLOADING):
        raise Refused(f"model {name!r} is {entry.state.value.lower()}", 503, retry_after=True)
    raise Refused(f"model {name!r} is not available: {entry.reason or entry.state.value}", 400)


async def admit(
    models: ModelSet, name: str, version: str | None, decode: Decode, submit: Submit | None = None
) -> Admitted:
    """Lookup, readiness, decode + validate (400s before any queue), submit, answer."""
    runtime = select(models, name, version)
    try:
        request = await decode(runtime)
        items = [runtime.make_item(i, request.priority, request.timeout_us) for i in request.items]
    except (BadRequest, ValueError) as exc:
        runtime.metrics.outcome["bad_request"].inc()
        raise Refused(str(exc), getattr(exc, "status", 400)) from None
    try:
        results = await (submit(runtime, items) if submit is not None else runtime.infer(items))
    except RequestError as exc:
        raise Refused(str(exc), exc.status_code, exc.retry_after) from None
    return Admitted(runtime, request, results)
