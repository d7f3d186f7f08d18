"""The HTTP side of the generator: one aiohttp session speaking KServe v2 to any v2 server."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from .payloads import PreparedRequest
from .stats import StreamTimes

# Response headers wattserve adds to every infer answer (absent on other servers).
H_QUEUE, H_COMPUTE, H_BATCH = ("X-Queue-Time-Ms", "X-Compute-Time-Ms", "X-Batch-Size")


@dataclass(slots=True)
class Outcome:
    status: str
    queue_ms: float | None = None
    compute_ms: float | None = None
    batch_size: int | None = None
    detail: str | None = None  # error body (truncated) for the probe's error messages
    stream: StreamTimes | None = None  # a language model's streamed answer (lm_client.py)


def make_session(timeout_s: float) -> aiohttp.ClientSession:
    """A keep-alive session with no connection cap (the runner bounds outstanding requests)."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        skip_auto_headers=("User-Agent",),
    )


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    req: PreparedRequest,
    keep_detail: bool = False,
    timeout_s: float | None = None,
) -> Outcome:
    """Send one request and read the whole response; never raises for server or network errors.

    ``timeout_s`` overrides the session's timeout for this request.
    """
    extra: dict[str, Any] = {}
    if timeout_s is not None:
        extra["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
    data: Any = req.body
    if req.file is not None:
        form = aiohttp.FormData()
        name, content, ctype = req.file
        form.add_field("file", content, filename=name, content_type=ctype)
        data = form
    try:
        async with session.post(base_url + req.path, data=data, headers=req.headers, **extra) as resp:
            body = await resp.read()
            h = resp.headers
            detail = body[:500].decode("utf-8", "replace") if keep_detail and resp.status != 200 else None
            return Outcome(
                str(resp.status),
                _float(h.get(H_QUEUE)),
                _float(h.get(H_COMPUTE)),
                _int(h.get(H_BATCH)),
                detail,
            )
    except TimeoutError:
        return Outcome("timeout")
    except aiohttp.ClientConnectionError as exc:
        return Outcome("connection_error", detail=str(exc) if keep_detail else None)
    except aiohttp.ClientError as exc:
        return Outcome("client_error", detail=str(exc) if keep_detail else None)


async def wait_ready(session: aiohttp.ClientSession, base_url: str, timeout_s: float) -> None:
    """Poll ``GET /v2/health/ready`` until it answers 200, or raise TimeoutError."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            async with session.get(base_url + "/v2/health/ready") as resp:
                await resp.read()
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            last = type(exc).__name__
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{base_url} not ready after {timeout_s:.0f} s ({last})")
        await asyncio.sleep(0.25)


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as resp:
        if resp.status != 200:
            text = await resp.text()
            raise RuntimeError(f"GET {url} -> HTTP {resp.status}: {text[:300]}")
        return await resp.json(content_type=None)


async def get_text(session: aiohttp.ClientSession, url: str) -> str | None:
    """The body of a GET, or None on any non-200 answer or network error."""
    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            return await resp.text()
    except (TimeoutError, aiohttp.ClientError):
        return None


def _float(v: str | None) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def _int(v: str | None) -> int | None:
    try:
        return int(float(v)) if v is not None else None
    except ValueError:
        return None
