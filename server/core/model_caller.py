"""The in-process door as engines see it: a protocol-free callable for their own threads.

A Python model's BLS call (``pb_utils.InferenceRequest.exec``) runs on its instance's engine
thread; the model it calls is served by the event loop (admission, its batcher). The caller
hops to the loop with ``asyncio.run_coroutine_threadsafe`` and hands back a
``concurrent.futures.Future`` the engine thread may wait on (``exec``) or wrap for its own
coroutine (``async_exec``). Never called from the loop's own thread: it would wait on itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
from wattserve.engines.request_engines import ModelCaller
from wattserve.server.core.inprocess import infer_in_process
from wattserve.server.model_set import ModelSet


def model_caller(models: Callable[[], ModelSet], loop: asyncio.AbstractEventLoop) -> ModelCaller:
    """``models``: the server's model set (late-bound: the set is built after its runtimes'
    factory); ``loop``: the loop that serves it."""

    def call(
        name: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str] | None,
        version: str | None,
        request_id: str | None,
        timeout_us: int | None,
    ) -> Future[dict[str, np.ndarray]]:
        coro = infer_in_process(models(), name, inputs, version=version, outputs=outputs,
                                request_id=request_id, timeout_us=timeout_us)  # fmt: skip
        return asyncio.run_coroutine_threadsafe(coro, loop)

    return call
