"""Decoupled models' responses (Triton's ``model_transaction_policy { decoupled: true }``):
any number of answers to one request, then a final flag, sent from an engine thread (or a
thread the model started) while the front end streams them to the client.

A front end that streams (gRPC ModelStreamInfer) sets a ``ResponseStream``'s ``sink`` as
the request's ``response_sink`` (and its ``is_cancelled`` as the request's
``response_cancelled``) before the request is queued; the engine calls the sink from its
threads, and the stream hands each response to the front end's ``emit`` on the event loop,
in the order sent. ``finished`` is set after the final flag; ``cancel`` when the client goes
before it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

# (outputs or None, error or None, final) -> None, on the event loop
Emit = Callable[[dict[str, np.ndarray] | None, BaseException | None, bool], None]


def is_decoupled(config: Any) -> bool:
    """Whether a runtime's config (a ModelConfig, or None for a built-in) is decoupled."""
    return bool(config is not None and config.model_transaction_policy.decoupled)


class ResponseStream:
    """The thread-safe bridge from a decoupled model's response sender to a front end."""

    def __init__(self, loop: asyncio.AbstractEventLoop, emit: Emit) -> None:
        self._loop = loop
        self._emit = emit
        self.finished = asyncio.Event()
        self._cancelled = False

    def cancel(self) -> None:
        """The client has gone (its stream or connection closed before the final flag):
        the model's response sender answers ``is_cancelled()`` True from now on."""
        self._cancelled = True

    def is_cancelled(self) -> bool:
        """Any thread (the request's ``response_cancelled``)."""
        return self._cancelled

    def sink(self, outputs: dict[str, np.ndarray] | None, error: BaseException | None, final: bool) -> None:
        """Any thread: one response (outputs or an error, or neither with the final flag)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: the server stopped, nobody reads
            self._loop.call_soon_threadsafe(self._deliver, outputs, error, final)

    def _deliver(
        self, outputs: dict[str, np.ndarray] | None, error: BaseException | None, final: bool
    ) -> None:
        try:
            self._emit(outputs, error, final)
        finally:
            if final:
                self.finished.set()
