"""Admission: the one path every front end takes (lookup, readiness and queue room, decode,
validate, submit), with no protocol in it.

A front end passes its decoder (``server.core.decode.InferenceDecoder`` for inference: HTTP
reads its body within its limits, gRPC hands over its protobuf) and the request it came
with, and optionally how to submit (HTTP wraps it in a gone-client watcher). Refusals are
``Refused`` exceptions carrying a neutral status kind that each front end maps to its
answer. Everything that can refuse a request without its body is decided before the
decoder runs, so a refused request costs a few bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from wattserve.batchers.status import Status
from wattserve.batchers.types import RequestError, Result, WorkItem
from wattserve.engines.base import Engine
from wattserve.server.core.request import BadRequest, InferRequest
from wattserve.server.models.model_set import ModelSet, ModelState, UnknownModel
from wattserve.server.models.runtime import ModelRuntime


class Refused(Exception):
    """A request answered without a result: its status kind (each front end maps it) and why.

    ``body_unread``: refused before (all of) its body was read, so an HTTP front end closes
    the connection rather than draining a large body it will not use. ``outcome``: the
    model's outcome counter it was counted under, if any (a caller answering several
    requests with it counts the others)."""

    def __init__(
        self, message: str, status: Status, retry_after: bool = False, body_unread: bool = False,
        outcome: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.body_unread = body_unread
        self.outcome = outcome


class ModelUnavailable(Refused):
    """The model failed to load or was unloaded: INVALID_ARG (HTTP's 400, as Triton's HTTP
    answers), though not the request's fault, so gRPC inference answers UNAVAILABLE."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Status.INVALID_ARG, body_unread=True)


@dataclass(slots=True)
class Admitted:
    """An answered request: the runtime that served it, the engine it was decoded for (its
    output specs encode the answer; an unload may clear ``runtime.engine`` meanwhile; None
    for a decoder that needed none), the decoded request and its result."""

    runtime: ModelRuntime
    engine: Engine | None
    request: InferRequest
    result: Result


# A front end's decoder: (runtime, the front end's request) -> the decoded request and the
# engine whose specs it was decoded against. Refused, BadRequest or ValueError refuse it.
Decode = Callable[[ModelRuntime, Any], Awaitable[tuple[InferRequest, Engine | None]]]
# How to submit the decoded item: (runtime, item, the front end's request) -> its result.
Submit = Callable[[ModelRuntime, WorkItem, Any], Awaitable[Result]]


def select(models: ModelSet, name: str, version: str | None) -> ModelRuntime:
    """The runtime that will serve ``name``/``version``, or Refused: NOT_FOUND unknown;
    UNAVAILABLE + Retry-After while loading, draining or without queue room (by count or
    measured time); ModelUnavailable (INVALID_ARG) with the reason for a model that failed
    to load or was unloaded."""
    try:
        entry = models.lookup(name, version)
    except UnknownModel as exc:
        raise Refused(str(exc), Status.NOT_FOUND, body_unread=True) from None
    runtime = entry.runtime
    if runtime is not None and runtime.draining:
        runtime.metrics.outcome["draining"].inc()
        message = f"model {name!r} is draining; retry elsewhere"
        raise Refused(message, Status.UNAVAILABLE, True, True, "draining")
    if (
        entry.state is ModelState.READY
        and runtime is not None
        and runtime.ready
        and runtime.batcher is not None
    ):
        try:
            runtime.batcher.check_admission()
        except RequestError as exc:
            runtime.metrics.outcome[exc.outcome].inc()
            raise Refused(str(exc), exc.status, True, True, exc.outcome) from None
        return runtime
    if models.draining:
        raise Refused("server is draining; retry elsewhere", Status.UNAVAILABLE, True, True)
    if entry.state in (ModelState.LOADING, ModelState.UNLOADING):
        raise Refused(f"model {name!r} is {entry.state.value.lower()}", Status.UNAVAILABLE, True, True)
    raise ModelUnavailable(f"model {name!r} is not available: {entry.reason or entry.state.value}")


async def admit(
    models: ModelSet,
    name: str,
    version: str | None,
    decode: Decode,
    source: Any,
    submit: Submit | None = None,
    runtime: ModelRuntime | None = None,
) -> Admitted:
    """Lookup, readiness and room, decode + validate (4xx before any queue), submit, answer.
    ``source``: the front end's request, handed to its ``decode`` and ``submit``. ``runtime``:
    the one ``select`` already gave this request (gRPC selects from the wire header, before
    parsing), so it is looked up and its room checked once."""
    if runtime is None:
        runtime = select(models, name, version)
    try:
        request, engine = await decode(runtime, source)
        item = runtime.make_item(request)
    except (BadRequest, ValueError) as exc:
        status = getattr(exc, "status", Status.INVALID_ARG)
        busy = status is Status.UNAVAILABLE
        runtime.metrics.outcome["queue_full" if busy else "bad_request"].inc()
        unread = busy or status is Status.TOO_LARGE
        raise Refused(str(exc), status, retry_after=busy, body_unread=unread) from None
    except RequestError as exc:  # the client left during the upload
        runtime.metrics.outcome[exc.outcome].inc()
        raise Refused(str(exc), exc.status, exc.retry_after) from None
    try:
        result = await (submit(runtime, item, source) if submit is not None else runtime.infer(item))
    except RequestError as exc:
        raise Refused(str(exc), exc.status, exc.retry_after) from None
    return Admitted(runtime, engine, request, result)


# The timing every inference answer carries (HTTP headers, gRPC trailing metadata).
TIMING_NAMES = ("x-queue-time-ms", "x-compute-time-ms", "x-batch-size")


def timing_values(result: Result) -> tuple[str, str, str]:
    """Batching made visible: queue and compute time (ms) and the batch's rows, formatted
    as ``TIMING_NAMES`` carry them."""
    return f"{result.queue_time_s * 1e3:.3f}", f"{result.compute_time_s * 1e3:.3f}", str(result.batch_size)
