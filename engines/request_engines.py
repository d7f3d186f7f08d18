"""Capabilities of engines that serve requests rather than rows (Triton's Python backend).

A ``RunsRequests`` engine gets a batch as the list of its requests, each whole, with what
the front end knew of it (``context``: an object with ``id``, ``outputs`` and, for a
decoupled model's stream, ``response_sink`` and ``response_cancelled``) and a callable that
says whether its client has gone (``WorkItem.is_cancelled``), and answers each request on
its own: its outputs, or an exception that fails that request alone. A ``CallsModels`` engine is handed
the server's in-process door once it is built (BLS): engines never import server/.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

import numpy as np

# (model name, inputs, requested outputs, version, request id, timeout µs) -> a future of its
# outputs (batch axis first when that model batches); callable from any thread but the loop's.
ModelCaller = Callable[
    [str, dict[str, np.ndarray], list[str] | None, str | None, str | None, int | None],
    "Future[dict[str, np.ndarray]]",
]

# One request of a batch: its inputs (batch axis first), its context (see above), and
# whether its client has gone (True once cancelled: callable from the engine's thread).
RequestInput = tuple[Mapping[str, np.ndarray], Any, Callable[[], bool]]


@runtime_checkable
class RunsRequests(Protocol):
    """Called on the instance's engine thread instead of ``infer`` on stacked rows."""

    def run_requests(
        self, requests: Sequence[RequestInput]
    ) -> list[dict[str, np.ndarray] | BaseException]: ...


@runtime_checkable
class PadsRows(Protocol):
    """A ``RunsRequests`` engine whose model call may hold more rows than its requests (a
    stateful model's null requests in idle slots, Triton's direct sequence batcher): how
    many it runs for ``requests``, the batch size statistics count."""

    def rows_for(self, requests: Sequence[RequestInput]) -> int: ...


@runtime_checkable
class CallsModels(Protocol):
    """Takes the door to the server's other models (``ModelCaller``), once built."""

    def bind_models(self, call: ModelCaller) -> None: ...
