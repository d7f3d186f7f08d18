"""Process-level concerns: graceful drain on SIGTERM, and glibc's allocator."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import signal
import socket
import time
from types import FrameType
from typing import Any, Protocol

import uvicorn
from wattserve.server.settings import Settings

log = logging.getLogger("wattserve.lifecycle")

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc refuses larger on 64-bit (HEAP_MAX_SIZE / 2)


def tune_malloc() -> bool:
    """Stop glibc from handing big batch buffers back to the OS after every call.

    By default every large tensor is a fresh mmap (or a trimmed heap top), so each batch
    page-faults its whole working set again. Raising the mmap threshold alone is not
    enough: glibc caps it at 32 MiB, and mobilenet_v2's activations at batch 16+ are larger.
    So: no mmap for allocations, one arena (engine threads otherwise get mmap'ed thread
    heaps that are trimmed too), and high trim/top-pad. Measured on mobilenet_v2, engine
    thread, 2 vCPU: minor faults per call at batch 32 went 238k (default) -> 114k
    (threshold only) -> 0, and batch 32 ran 53 -> 121 img/s. Call it before any thread
    starts. Returns False where glibc's mallopt is not available.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX),
        (M_MMAP_MAX, 0),
        (M_ARENA_MAX, 1),
        (M_TRIM_THRESHOLD, 1 << 30),
        (M_TOP_PAD, 64 * 1024 * 1024),
    )
    ok = all(mallopt(param, value) == 1 for param, value in settings)
    log.info("glibc malloc tuned (no mmap, one arena, no trimming): %s", ok)
    return ok


def freeze_heap() -> None:
    """Take every object alive now out of the cyclic collector's reach (``gc.freeze``).

    A loaded model leaves about a million long-lived objects (torch, the model's modules), and
    each full collection walked all of them: on the identity model at 16 connections that was
    a 60-77 ms event-loop stall about once a second, which set the p99 (65 ms against 13.5 ms
    frozen, same machine). Called once every model of a start, load or unload is settled; the
    unfreeze first lets a collection reclaim what an unloaded model left in cycles (a folded
    torch.fx graph is one), at the cost of one full collection per model change.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class Drainable(Protocol):
    """What SIGTERM drains: the model set (every model)."""

    async def drain(self, grace_s: float = 0.0) -> None: ...


def malloc_trim() -> bool:
    """Hand free heap pages back to the OS (glibc); False where there is no malloc_trim."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0))
    except (OSError, AttributeError):
        return False


class BatchActivity(Protocol):
    """What the idle trimmer reads: requests accepted and not answered, and when the last
    batch ended (``time.monotonic()``); the model set's ``ModelSetActivity`` sums them."""

    @property
    def inflight(self) -> int: ...

    @property
    def last_batch_at(self) -> float: ...


class IdleTrimmer:
    """After ``idle_s`` without a batch, give freed memory back once (``malloc_trim``).

    ``tune_malloc`` turns glibc's own trimming off so that batches do not page-fault their
    working set again; without this, the memory of an overload spike is kept for good.
    Trimming only when idle keeps both: no faults under load, memory back after it."""

    def __init__(self, activity: BatchActivity, idle_s: float, poll_s: float = 1.0) -> None:
        self.activity = activity
        self.idle_s = idle_s
        self.poll_s = min(poll_s, idle_s) if idle_s > 0 else poll_s
        self.trims = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.idle_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="idle-trimmer")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        trimmed_after = -1.0  # the last batch time that a trim already followed
        while True:
            await asyncio.sleep(self.poll_s)
            activity = self.activity
            if activity.inflight:
                continue
            last = activity.last_batch_at
            if last != trimmed_after and time.monotonic() - last >= self.idle_s:
                trimmed_after = last
                if await asyncio.to_thread(malloc_trim):
                    self.trims += 1
                    log.debug("idle for %.0fs: freed memory returned to the OS", self.idle_s)


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains the models before the server stops.

    Drain: ready -> false and new requests get 503 at once, every accepted request is
    answered, then uvicorn shuts down as usual. A second signal forces exit.
    """

    def __init__(self, config: uvicorn.Config, runtime: Drainable, drain_grace_s: float = 0.0) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.drain_grace_s = drain_grace_s
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
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

    def announce_draining(self) -> None:
        """From now on every answer says ``Connection: close`` (and no keep-alive hint), so
        no client reuses a connection this server is about to close."""
        close = [(b"connection", b"close")]
        self.config.encoded_headers = [
            h for h in self.config.encoded_headers if h[0] != b"keep-alive"
        ] + close
        state = self.server_state
        state.default_headers = [h for h in state.default_headers if h[0] != b"keep-alive"] + close

    async def _drain_then_exit(self) -> None:
        self.announce_draining()
        try:
            await self.runtime.drain(self.drain_grace_s)
        finally:
            log.info("drained; shutting down")
            self.should_exit = True


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The one uvicorn configuration of a wattserve server (the CLI's and the tests')."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "access_log": False,  # per-request logging costs more than the identity model's work
        "loop": "auto",  # uvloop where installed
        "http": http_protocol(settings, getattr(app.state, "metrics", None)),
        "timeout_keep_alive": settings.keep_alive_s,
        # a hint below the server's own idle timeout, so a client stops reusing a connection
        # before the server closes it; replaced by Connection: close once a drain begins
        "headers": [("keep-alive", f"timeout={max(1, settings.keep_alive_s - 1)}")],
        "timeout_graceful_shutdown": settings.drain_timeout_s,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "lifespan": "on",
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def http_protocol(settings: Settings, metrics: Any) -> type | str:
    """uvicorn's httptools protocol with the header deadline, header size and connection
    caps (server.http_protocol); plain h11 (with its own header cap) without httptools."""
    from wattserve.server.http_protocol import GuardLimits, guarded_protocol, raise_open_file_limit

    soft, _hard = raise_open_file_limit()
    max_connections = min(settings.max_connections, max(16, soft - 64))  # fds for files, threads
    if max_connections < settings.max_connections:
        log.warning("open-file limit %d caps connections at %d (max_connections=%d)",
                    soft, max_connections, settings.max_connections)  # fmt: skip
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    limits = GuardLimits(
        header_timeout_s=settings.header_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        max_connections=max_connections,
        retry_after_s=settings.retry_after_s,
        counter=getattr(metrics, "connections_refused", None),
    )
    return guarded_protocol(limits)
