"""Process-level concerns: graceful drain on SIGTERM, and glibc's allocator."""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import functools
import gc
import logging
import os
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
    mallopt = libc_function("mallopt")
    if mallopt is None:
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


@functools.cache
def libc_function(name: str) -> Any:
    """A C library function by name, looked up once (``find_library`` runs a subprocess);
    None where this libc has no such function (not glibc, or an older glibc)."""
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        return getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):
        return None


def malloc_trim() -> bool:
    """Hand free heap pages back to the OS (glibc); False where there is no malloc_trim."""
    trim = libc_function("malloc_trim")
    return False if trim is None else bool(trim(0))


class BatchActivity(Protocol):
    """What the idle trimmer reads: requests accepted and not answered, and when the last
    batch ended (``time.monotonic()``); the model set's ``ModelSetActivity`` sums them."""

    @property
    def inflight(self) -> int: ...

    @property
    def last_batch_at(self) -> float: ...


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")
    ]  # fmt: skip


@functools.cache
def _mallinfo2() -> Any:
    """glibc's mallinfo2 returning its struct; None without it (glibc < 2.33, another libc)."""
    fn = libc_function("mallinfo2")
    if fn is None:
        return None
    fn.restype = _Mallinfo2
    return fn


def heap_free_bytes() -> int | None:
    """Free bytes held in glibc's heap (``mallinfo2().fordblks``): what a trim could give
    back at most; None where there is no mallinfo2 (glibc < 2.33, another libc)."""
    fn = _mallinfo2()
    return None if fn is None else int(fn().fordblks)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """This process's resident memory (/proc/self/statm); None where there is no /proc."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class AfterPeakTrim:
    """When to trim while load goes on: the idle trim never comes under a steady load, so a
    burst's memory was kept for good (the 30-minute mixed soak: 1,040 -> 1,331 MB, held).

    Trim when (1) the queue has come back down from a peak (in flight now at most a quarter
    of the peak since the last trim): trimming during the burst would only make the next
    batches fault the pages in again; (2) the heap holds at least ``min_free`` free bytes and
    resident memory grew by at least ``min_free`` since the last trim: so a steady load,
    whose free memory is its own working set between batches, is not trimmed again and
    again; (3) ``min_interval_s`` has passed since the last trim. Pure (numbers in, a
    decision out), so the decision is tested on made-up figures."""

    def __init__(self, min_free: int = 48 * 2**20, min_interval_s: float = 20.0) -> None:
        self.min_free = min_free
        self.min_interval_s = min_interval_s
        self.peak = 0
        self.rss_floor: int | None = None  # resident memory just after the last trim (or first seen)
        self.last_trim_at = -1e18

    def observe(self, now: float, inflight: int, free: int | None, rss: int | None) -> bool:
        """One poll: True if a trim should run now (then call ``trimmed`` after it)."""
        self.peak = max(self.peak, inflight)
        if free is None or rss is None:
            return False
        if self.rss_floor is None or rss < self.rss_floor:
            self.rss_floor = rss
            return False
        return (
            inflight * 4 <= self.peak
            and free >= self.min_free
            and rss - self.rss_floor >= self.min_free
            and now - self.last_trim_at >= self.min_interval_s
        )

    def trimmed(self, now: float, inflight: int, rss: int | None) -> None:
        self.last_trim_at = now
        self.peak = inflight
        if rss is not None:
            self.rss_floor = rss


class IdleTrimmer:
    """Give freed memory back to the OS (``malloc_trim``, in a thread): once after
    ``idle_s`` without a batch, and while load goes on once a burst has passed
    (``AfterPeakTrim``).

    ``tune_malloc`` turns glibc's own trimming off so that batches do not page-fault their
    working set again; without this, the memory of an overload spike is kept for good.
    Trimming only when idle, or after a peak with much memory free, keeps both: no faults
    under a steady load, memory back after a burst."""

    def __init__(self, activity: BatchActivity, idle_s: float, poll_s: float = 1.0,
                 after_peak: AfterPeakTrim | None = None, heap_free: Any = heap_free_bytes,
                 rss: Any = rss_bytes) -> None:  # fmt: skip
        self.activity = activity
        self.idle_s = idle_s
        self.poll_s = min(poll_s, idle_s) if idle_s > 0 else poll_s
        self.after_peak = after_peak if after_peak is not None else AfterPeakTrim()
        self._heap_free = heap_free
        self._rss = rss
        self.trims = 0
        self.peak_trims = 0
        self.trim_seconds: collections.deque[float] = collections.deque(maxlen=100)  # each trim's own cost
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
        policy = self.after_peak
        while True:
            await asyncio.sleep(self.poll_s)
            activity = self.activity
            inflight = activity.inflight
            now = time.monotonic()
            rss = self._rss()
            floor = policy.rss_floor
            # mallinfo2 walks the heap's free lists under its lock: read only when it may matter
            grown = rss is not None and floor is not None and rss - floor >= policy.min_free
            if policy.observe(now, inflight, self._heap_free() if grown else 0, rss):
                before = self._rss()
                if await self._trim():
                    self.peak_trims += 1
                    after = self._rss()
                    policy.trimmed(time.monotonic(), activity.inflight, after)
                    log.info("after a peak: %.0f MB returned to the OS in %.0f ms",
                             ((before or 0) - (after or 0)) / 2**20, self.trim_seconds[-1] * 1e3)  # fmt: skip
                else:
                    policy.trimmed(time.monotonic(), activity.inflight, self._rss())
                continue
            if inflight:
                continue
            last = activity.last_batch_at
            if last != trimmed_after and now - last >= self.idle_s:
                trimmed_after = last
                if await self._trim():
                    self.trims += 1
                    policy.trimmed(time.monotonic(), 0, self._rss())
                    log.debug("idle for %.0fs: freed memory returned to the OS", self.idle_s)

    async def _trim(self) -> bool:
        started = time.perf_counter()
        ok = await asyncio.to_thread(malloc_trim)
        self.trim_seconds.append(time.perf_counter() - started)
        return ok


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
    caps (server.http.protocol); plain h11 (with its own header cap) without httptools."""
    from wattserve.server.http.protocol import GuardLimits, guarded_protocol, raise_open_file_limit

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
