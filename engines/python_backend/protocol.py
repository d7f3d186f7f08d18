"""What the server and a Python model's worker process say to each other (channel.py frames).

Server -> worker: ``("init", id, PythonModelFile, device, instance)``, ``("execute", id,
Layout, [RequestMeta, ...])``, ``("finalize", id)``, replies, and a BLS stream's events
``("bls_event", stream, Layout | None, error | None, final)``.

Worker -> server: ``("hello", pid)`` once it runs, replies, a decoupled model's responses
``("response", key, Layout | None, error | None, final)``, and the calls it needs the server
for: ``("cancelled", id, key, which)``, ``("metric", id, op, args)``, ``("bls", id, model,
Layout, outputs, version, request_id, timeout_us)``, ``("bls_stream", stream, ...)``.

An execute's tensors share one segment per direction, each named ``"<request index>\\0<tensor
name>"``; ``split`` takes them apart again. Errors cross as ``(what, message, status)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from wattserve.batchers.status import Status
from wattserve.batchers.types import SequenceTag
from wattserve.engines.python_backend.custom_metrics import MetricError
from wattserve.engines.python_backend.engine import ModelFailed

SEP = "\0"
ErrorPayload = tuple[str, str, str]


@dataclass(frozen=True)
class RequestMeta:
    """One request of an execute, as the worker sees it (its tensors are in the segment)."""

    key: str  # the server's handle for this request (cancellation, responses)
    id: str | None
    outputs: list[str] | None
    parameters: dict[str, Any] | str | None
    streamed: bool  # it has a response sink (a decoupled model's stream)
    sequence: SequenceTag | None = None  # a stateful model's: its correlation ID and flags


@dataclass
class WorkerContext:
    """The request context ``PythonModelEngine`` reads, rebuilt in the worker."""

    id: str | None
    outputs: list[str] | None
    parameters: dict[str, Any] | str | None
    response_sink: Callable[..., None] | None
    response_cancelled: Callable[[], bool] | None
    sequence: SequenceTag | None = None


def joined(per_request: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {
        f"{i}{SEP}{name}": value for i, tensors in enumerate(per_request) for name, value in tensors.items()
    }


def split(tensors: Mapping[str, np.ndarray], count: int) -> list[dict[str, np.ndarray]]:
    out: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    for key, value in tensors.items():
        index, _, name = key.partition(SEP)
        out[int(index)][name] = value
    return out


def encode_error(exc: BaseException) -> ErrorPayload:
    if isinstance(exc, MetricError):
        return ("metric", str(exc), Status.INTERNAL.value)
    status = getattr(exc, "status", None)
    return ("request", str(exc), status.value if isinstance(status, Status) else Status.INTERNAL.value)


def decode_error(payload: ErrorPayload) -> BaseException:
    what, message, status = payload
    if what == "metric":
        return MetricError(message)
    try:
        kind = Status(status)
    except ValueError:
        kind = Status.INTERNAL
    return ModelFailed(message, kind)
