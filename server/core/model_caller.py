"""The in-process door as engines see it: a protocol-free callable for their own threads.

A Python model's BLS call (``pb_utils.InferenceRequest.exec``) runs on its instance's engine
thread; the model it calls is served by the event loop (admission, its batcher). The caller
hops to the loop with ``asyncio.run_coroutine_threadsafe`` and hands back a
``concurrent.futures.Future`` the engine thread may wait on (``exec``) or wrap for its own
coroutine (``async_exec``). Never called from the loop's own thread: it would wait on itself.

``InProcessCaller.stream`` is BLS's ``exec(decoupled=True)``: every response of a decoupled
model, in the order it sent them, as a blocking iterator for the calling thread (a model
that is not decoupled gives its one response).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
from wattserve.engines.base import Engine
from wattserve.engines.request_engines import ModelCaller
from wattserve.server.core.admission import admit
from wattserve.server.core.decoupled import is_decoupled
from wattserve.server.core.inprocess import infer_in_process, request_from_arrays
from wattserve.server.core.request import BadRequest, InferRequest
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.runtime import ModelRuntime

# (outputs or None, error or None, final): one response of a stream, as the caller sees it
StreamEvent = tuple[dict[str, np.ndarray] | None, BaseException | None, bool]


class InProcessCaller:
    """A ``ModelCaller`` (call it for one answer) that can also stream (``stream``)."""

    def __init__(self, models: Callable[[], ModelSet], loop: asyncio.AbstractEventLoop) -> None:
        self._models = models
        self._loop = loop

    def __call__(
        self,
        name: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str] | None,
        version: str | None,
        request_id: str | None,
        timeout_us: int | None,
    ) -> Future[dict[str, np.ndarray]]:
        coro = infer_in_process(self._models(), name, inputs, version=version, outputs=outputs,
                                request_id=request_id, timeout_us=timeout_us)  # fmt: skip
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stream(
        self,
        name: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str] | None,
        version: str | None,
        request_id: str | None,
        timeout_us: int | None,
    ) -> Iterator[StreamEvent]:
        """Every response of the call, the last one with ``final`` set; waits on this thread."""
        events: queue.SimpleQueue[StreamEvent] = queue.SimpleQueue()
        coro = _streamed(self._models(), name, inputs, outputs, version, request_id, timeout_us, events.put)
        asyncio.run_coroutine_threadsafe(coro, self._loop)
        while True:
            event = events.get()
            yield event
            if event[2]:
                return


async def _streamed(
    models: ModelSet,
    name: str,
    inputs: dict[str, np.ndarray],
    outputs: list[str] | None,
    version: str | None,
    request_id: str | None,
    timeout_us: int | None,
    put: Callable[[StreamEvent], None],
) -> None:
    """One in-process request whose responses go to ``put`` (from any thread): a decoupled
    model's through its response sink, any other model's one answer; a refusal or a failed
    execute as a final error."""
    decoded: list[InferRequest] = []
    decoupled = False

    def own_rows(result: dict[str, np.ndarray] | None, request: InferRequest) -> dict[str, np.ndarray] | None:
        if result is None or request.batched:
            return result
        return {n: v[0] for n, v in result.items()}

    async def decode(runtime: ModelRuntime, _source: Any) -> tuple[InferRequest, Engine]:
        nonlocal decoupled
        engine = runtime.engine
        if engine is None:
            raise BadRequest(f"model {name!r} is unloading")
        request = request_from_arrays(runtime, engine, inputs, outputs, request_id, 0, timeout_us)
        if is_decoupled(runtime.config):
            decoupled = True
            request.response_sink = lambda o, e, f: put((own_rows(o, request), e, f))
        decoded.append(request)
        return request, engine

    try:
        admitted = await admit(models, name, version, decode, None)
    except Exception as exc:
        put((None, exc, True))
        return
    if not decoupled:
        request = admitted.request
        wanted = request.outputs or list(admitted.result.outputs)
        produced = admitted.result.outputs  # a Python model may leave a requested output out
        put((own_rows({n: produced[n] for n in wanted if n in produced}, request), None, True))


def model_caller(models: Callable[[], ModelSet], loop: asyncio.AbstractEventLoop) -> ModelCaller:
    """``models``: the server's model set (late-bound: the set is built after its runtimes'
    factory); ``loop``: the loop that serves it."""
    return InProcessCaller(models, loop)
