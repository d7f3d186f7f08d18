"""Process-level concerns: graceful drain on SIGTERM, and glibc's allocator."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import signal
from types import FrameType

import uvicorn

from server.runtime import ModelRuntime

log = logging.getLogger("wattserve.lifecycle")

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc refuses larger on 64-bit (HEAP_MAX_SIZE / 2)


def tune_malloc() -> bool:
    """Stop glibc from returning big batch buffers to the OS after every call.

    With default thresholds every large tensor is a fresh mmap, so each batch page-faults
    its whole working set again (DESIGN.md measured mobilenet_v2 batch 32: ~950 ms -> ~310
    ms with high thresholds). Returns False where glibc's mallopt is not available.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
        and mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1
        and mallopt(M_TOP_PAD, 64 * 1024 * 1024) == 1
    )
    log.info("glibc malloc thresholds raised: %s", ok)
    return ok


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains the model before the server stops.

    Drain: ready -> false and new requests get 503 at once, every accepted request is
    answered, then uvicorn shuts down as usual. A second signal forces exit.
    """

    def __init__(self, config: uvicorn.Config, runtime: ModelRuntime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None or self._loop is None or self.should_exit:
            super().handle_exit(sig, frame)  # second signal: uvicorn's own (force) exit
            return
        log.info("%s: draining before shutdown", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self.runtime.drain()
        finally:
            log.info("drained; shutting down")
            self.should_exit = True
