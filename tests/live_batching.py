"""Driving a live ``wattserve serve`` process of the identity model for the batching tests:
its environment, request bodies, a burst of concurrent requests, the batch-size histogram it
exports, and the check that each request got its own answer back."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

ELEMENTS = 4


def base_env(batcher: str, **extra: str) -> dict[str, str]:
    env = {
        "WATTSERVE_MODEL": "identity",
        "WATTSERVE_IDENTITY_ELEMENTS": str(ELEMENTS),
        "WATTSERVE_BATCHER": batcher,
        "WATTSERVE_MAX_BATCH_SIZE": "8",
        "WATTSERVE_MAX_QUEUE_SIZE": "1000",
        "WATTSERVE_IDENTITY_DELAY_MS": "20",
        "WATTSERVE_LOG_LEVEL": "warning",
    }
    env.update(extra)
    return env


def body(value: float) -> dict:
    return {"inputs": [{"name": "INPUT0", "shape": [1, ELEMENTS], "datatype": "FP32",
                        "data": [value, value + 0.5, -value, 7.0]}]}  # fmt: skip


async def fire(url: str, values: list[float], timeout: float = 120) -> list[tuple[int, dict | str]]:
    """Send every request at once; (status, json or text) per value, in order."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:  # fmt: skip

        async def one(v: float):
            async with session.post(f"{url}/v2/models/identity/infer", json=body(v)) as r:
                return r.status, (await r.json() if r.status == 200 else await r.text())

        return await asyncio.gather(*(one(v) for v in values))


def batch_histogram(url: str) -> tuple[float, float, dict[float, float]]:
    """(batch count, request count, cumulative bucket counts) of wattserve_batch_size."""
    text = httpx.get(url + "/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "wattserve_batch_size":
            count = next(s.value for s in family.samples if s.name.endswith("_count"))
            total = next(s.value for s in family.samples if s.name.endswith("_sum"))
            buckets = {float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")}
            return count, total, buckets
    raise AssertionError("no wattserve_batch_size in /metrics")


async def wait_until_held(url: str, n: int, timeout: float = 15.0) -> None:
    """Until the server holds all ``n`` requests: accepted and not yet answered
    (wattserve_inflight_requests), or already computed (wattserve_batch_size's sum)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < deadline:
            text = (await client.get(url + "/metrics")).text
            held = sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
                       if s.name in ("wattserve_inflight_requests", "wattserve_batch_size_sum"))  # fmt: skip
            if held >= n:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"the server did not accept {n} requests in {timeout} s")


def assert_own_answers(values, answers) -> None:
    for v, (status, doc) in zip(values, answers, strict=True):
        assert status == 200, doc
        assert doc["outputs"][0]["data"] == [v, v + 0.5, -v, 7.0]
