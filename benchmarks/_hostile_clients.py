"""Clients for the reliability suite: an open-loop HTTP load (aiohttp), raw sockets that
misbehave on purpose (slow, idle, oversized, leaving mid-upload), and what the suite
watches on the server side (RSS, /metrics, the log). Every loop is bounded in count and
in time; everything talks to 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import aiohttp
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families


# ----------------------------------------------------------------------------- open-loop load
@dataclass
class Outcome:
    """One request: ``status`` None when no HTTP answer came (see ``error``)."""

    sent_at: float
    latency_s: float
    status: int | None = None
    retry_after: bool = False
    error: str | None = None  # refused (never connected) | reset | timeout | other
    queue_ms: float | None = None  # the server's own X-Queue-Time-Ms for an answered request
    detail: str | None = None  # for a lost answer: exception[errno], fresh/reused connection, stage


async def send(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
               timeout_s: float, sent_at: float) -> Outcome:  # fmt: skip
    start = time.monotonic()
    trace = types.SimpleNamespace(reused=None)  # set by the session's TraceConfig (``session``)
    stage = "before status"  # the answer's status line and headers not yet received
    try:
        async with session.post(url, data=body, headers=headers, trace_request_ctx=trace,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:  # fmt: skip
            stage = "mid-body"
            await response.read()
            queue = response.headers.get("X-Queue-Time-Ms")
            return Outcome(sent_at, time.monotonic() - start, response.status,
                           "Retry-After" in response.headers, queue_ms=float(queue) if queue else None)  # fmt: skip
    except aiohttp.ClientConnectorError:
        return Outcome(sent_at, time.monotonic() - start, error="refused")
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError,
            ConnectionResetError) as exc:  # fmt: skip
        return Outcome(sent_at, time.monotonic() - start, error="reset", detail=_detail(exc, trace, stage))
    except TimeoutError:
        return Outcome(sent_at, time.monotonic() - start, error="timeout")
    except aiohttp.ClientError as exc:
        return Outcome(sent_at, time.monotonic() - start, error=type(exc).__name__,
                       detail=_detail(exc, trace, stage))  # fmt: skip


def _detail(exc: BaseException, trace: types.SimpleNamespace, stage: str) -> str:
    """What kind of lost answer: the exception (and errno), whether the connection was a
    fresh one or reused from the pool (a keep-alive race can only hit a reused one), and
    whether any of the answer had arrived. E.g. 'ServerDisconnectedError reused before status'."""
    kind = type(exc).__name__
    errno = getattr(exc, "errno", None)
    if errno:
        kind += f"[{errno_name(errno)}]"
    conn = {True: "reused", False: "fresh", None: "conn?"}[trace.reused]
    return f"{kind} {conn} {stage}"


def errno_name(code: int) -> str:
    import errno as errno_module

    return errno_module.errorcode.get(code, str(code))


def _trace_config() -> aiohttp.TraceConfig:
    """Marks each request's ``trace_request_ctx.reused``: a pooled connection or a new one."""
    config = aiohttp.TraceConfig()

    async def reused(_session: object, ctx: types.SimpleNamespace, _params: object) -> None:
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx.reused = True

    async def created(_session: object, ctx: types.SimpleNamespace, _params: object) -> None:
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx.reused = False

    config.on_connection_reuseconn.append(reused)
    config.on_connection_create_end.append(created)
    return config


def session(limit: int = 0) -> aiohttp.ClientSession:
    """A keep-alive client like any other (pool unlimited: the load stays open-loop)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), trace_configs=[_trace_config()])


async def open_loop(url: str, body: bytes, headers: dict[str, str], rate: float, seconds: float,
                    timeout_s: float = 60.0,
                    during: Callable[[float], None] | None = None) -> list[Outcome]:  # fmt: skip
    """Send ``rate`` requests a second for ``seconds`` on schedule, whatever the answers
    do (open loop: a slow server does not slow the arrivals). ``during(elapsed)`` is called
    before each send (the drain probe sends SIGTERM from it)."""
    count = max(1, int(rate * seconds))
    async with session() as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for i in range(count):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if during is not None:
                during(loop.time() - start)
            tasks.append(
                asyncio.create_task(send(client, url, body, headers, timeout_s, loop.time() - start))
            )
        return list(await asyncio.gather(*tasks))


async def closed_loop_rate(url: str, body: bytes, headers: dict[str, str], concurrency: int,
                           seconds: float) -> float:  # fmt: skip
    """Answers a second with ``concurrency`` clients each waiting for its answer: capacity."""
    done = 0
    async with session() as client:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                outcome = await send(client, url, body, headers, 60.0, 0.0)
                done += outcome.status == 200

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - start)


def summarize(outcomes: list[Outcome]) -> dict:
    """Counts by status/error, Retry-After on 503s, and latency of the admitted (200)."""
    by: dict[str, int] = {}
    for o in outcomes:
        key = str(o.status) if o.status is not None else o.error or "?"
        by[key] = by.get(key, 0) + 1
    ok = np.array([o.latency_s for o in outcomes if o.status == 200]) * 1e3
    refused = [o for o in outcomes if o.status == 503]
    queued = np.array([o.queue_ms for o in outcomes if o.status == 200 and o.queue_ms is not None])
    return {
        "sent": len(outcomes),
        "by_status": dict(sorted(by.items())),
        "ok": len(ok),
        "503": len(refused),
        "503_without_retry_after": sum(not o.retry_after for o in refused),
        "5xx_other": sum(1 for o in outcomes if o.status and o.status >= 500 and o.status != 503),
        "no_answer": sum(1 for o in outcomes if o.status is None),
        "p50_ms": round(float(np.percentile(ok, 50)), 1) if len(ok) else None,
        "p99_ms": round(float(np.percentile(ok, 99)), 1) if len(ok) else None,
        "max_ms": round(float(ok.max()), 1) if len(ok) else None,
        "queue_p99_ms": round(float(np.percentile(queued, 99)), 1) if len(queued) else None,
    }


# ----------------------------------------------------------------------------- server side
class RssSampler:
    """Resident memory of a process, sampled on a thread every ``interval_s``."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.process = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now_mb(self) -> float:
        return self.process.memory_info().rss / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self.peak = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20


async def scrape(base_url: str) -> dict[str, float]:
    """/metrics as {'name{label=value,...}': value} for wattserve_* samples."""
    async with session() as client, client.get(base_url + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("wattserve_"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                                  if k not in ("model", "batcher"))  # fmt: skip
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def log_counts(text: str) -> dict[str, int]:
    return {
        "error_lines": len(re.findall(r"^.*\bERROR\b.*$", text, re.MULTILINE)),
        "traceback_lines": text.count("Traceback (most recent call last)"),
        "log_lines": text.count("\n"),
    }


# ----------------------------------------------------------------------------- raw sockets
@dataclass
class RawAnswer:
    status: int | None
    error: str | None
    elapsed_s: float
    bytes_sent: int
    head: bytes = b""


async def raw_request(host: str, port: int, head: bytes, body: Iterable[bytes] = (),
                      timeout_s: float = 30.0) -> RawAnswer:  # fmt: skip
    """Send ``head`` then the ``body`` pieces, stopping as soon as the server answers or
    hangs up; the status line's code, or why there was none."""
    start = time.monotonic()
    sent = 0
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (TimeoutError, OSError) as exc:
        return RawAnswer(None, f"connect: {type(exc).__name__}", time.monotonic() - start, 0)
    answer = asyncio.create_task(reader.read(4096))
    try:
        for piece in (head, *body):
            if answer.done() or time.monotonic() - start > timeout_s:
                break
            writer.write(piece)
            await writer.drain()
            sent += len(piece)
        data = await asyncio.wait_for(answer, max(0.1, timeout_s - (time.monotonic() - start)))
    except (ConnectionError, OSError) as exc:
        data = answer.result() if answer.done() and not answer.exception() else b""
        if not data:
            return RawAnswer(None, type(exc).__name__, time.monotonic() - start, sent)
    except TimeoutError:
        answer.cancel()
        return RawAnswer(None, "timeout", time.monotonic() - start, sent)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    elapsed = time.monotonic() - start
    match = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    if match is None:
        return RawAnswer(None, "closed without answer" if not data else "garbled", elapsed, sent, data[:200])
    return RawAnswer(int(match.group(1)), None, elapsed, sent, data[:200])


def chunked(pieces: Iterable[bytes]) -> Iterable[bytes]:
    """HTTP/1.1 chunked transfer encoding of ``pieces``."""
    for piece in pieces:
        yield b"%x\r\n%s\r\n" % (len(piece), piece)
    yield b"0\r\n\r\n"


def repeated(block: bytes, total: int) -> Iterable[bytes]:
    sent = 0
    while sent < total:
        piece = block[: total - sent]
        sent += len(piece)
        yield piece


@contextlib.asynccontextmanager
async def idle_connections(host: str, port: int, count: int) -> AsyncIterator[list[asyncio.StreamReader]]:
    """``count`` connections that send nothing; closed at the end."""
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(count):
            try:
                streams.append(await asyncio.wait_for(asyncio.open_connection(host, port), 5))
            except (TimeoutError, OSError):
                break
        yield [r for r, _ in streams]
    finally:
        for _, w in streams:
            w.close()


async def time_to_close(readers: list[asyncio.StreamReader], seconds: float) -> list[float | None]:
    """For each connection, when (s from now) the server closed it; None if still open."""
    start = time.monotonic()

    async def watch(reader: asyncio.StreamReader) -> float | None:
        try:
            await asyncio.wait_for(reader.read(65536), seconds)
        except TimeoutError:
            return None
        except (ConnectionError, OSError):
            pass
        return time.monotonic() - start

    return list(await asyncio.gather(*(watch(r) for r in readers)))
