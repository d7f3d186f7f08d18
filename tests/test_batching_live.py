"""Each batcher selected only by WATTSERVE_BATCHER, in a real server process on loopback:
the batch-size histogram shows the policy, every concurrent request gets its own answer,
and a SIGTERM drain answers everything accepted exactly once."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from tests.live_batching import (
    assert_own_answers,
    base_env,
    batch_histogram,
    body,
    fire,
    wait_until_held,
)
from tests.servers import server_process, wattserve_process


@pytest.mark.slow
@pytest.mark.parametrize("batcher", ["static", "dynamic", "continuous"])
def test_policy_visible_in_histogram_and_every_request_gets_its_own_answer(batcher):
    env = base_env(batcher, WATTSERVE_MAX_QUEUE_DELAY_MS="200")
    values = [float(i) for i in range(240)]
    with server_process(env) as server:
        answers = asyncio.run(fire(server.url, values))
        assert_own_answers(values, answers)
        batches, requests, buckets = batch_histogram(server.url)
        assert requests == 240
        if batcher == "static":
            assert batches == 30  # only full batches of N=8
            assert buckets[6.0] == 0
        else:
            assert batches < 240 / 2  # concurrent requests were batched
            assert buckets[8.0] == batches  # never above max_batch_size
        # A lone request: static holds it for N (its deadline answers Triton's 503 "Request
        # timeout expired"), dynamic sends
        # it after max_queue_delay, continuous at once.
        lone = httpx.post(server.url + "/v2/models/identity/infer",
                          json={**body(1.0), "parameters": {"timeout": 400_000}}, timeout=30)  # fmt: skip
        if batcher == "static":
            assert lone.status_code == 503 and lone.json()["error"] == "Request timeout expired"
        else:
            assert lone.status_code == 200
            assert lone.headers["x-batch-size"] == "1"
            queued_ms = float(lone.headers["x-queue-time-ms"])
            if batcher == "dynamic":
                assert queued_ms >= 190
            else:
                assert queued_ms < 190


@pytest.mark.slow
def test_sigterm_drain_answers_every_accepted_request_once():
    env = base_env("static", WATTSERVE_IDENTITY_DELAY_MS="100", WATTSERVE_LOG_LEVEL="info")
    server = wattserve_process(env).start()
    try:
        server.wait_ready()
        values = [float(i) for i in range(100)]  # 12 full batches of 8 and a partial of 4

        async def scenario():
            load = asyncio.create_task(fire(server.url, values))
            await wait_until_held(server.url, len(values))  # all accepted before the signal
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            late: list[int | str] = []
            async with httpx.AsyncClient(timeout=10) as client:
                for _ in range(2):
                    try:
                        late.append((await client.post(server.url + "/v2/models/identity/infer",
                                                       json=body(999.0))).status_code)  # fmt: skip
                        late.append((await client.get(server.url + "/v2/health/ready")).status_code)
                    except httpx.TransportError as exc:  # already closed: also a refusal
                        late.append(type(exc).__name__)
            return await load, late

        answers, late = asyncio.run(scenario())
        assert_own_answers(values, answers)  # the partial batch of 4 was flushed
        assert 200 not in late, late
        print("late answers during drain:", late)
        assert server.proc.wait(60) == 0
        assert "drained" in server.log()
    finally:
        server.stop()


def test_settings_come_only_from_the_environment(monkeypatch):
    from wattserve.server.settings import Settings

    monkeypatch.setenv("WATTSERVE_BATCHER", "static")
    monkeypatch.setenv("WATTSERVE_MAX_BATCH_SIZE", "4")
    monkeypatch.setenv("WATTSERVE_PREFERRED_BATCH_SIZES", "2,4")
    s = Settings()
    assert (s.batcher, s.max_batch_size, s.preferred_batch_sizes) == ("static", 4, [2, 4])
    monkeypatch.setenv("WATTSERVE_BATCHER", "fastest")
    with pytest.raises(ValueError):
        Settings()
    monkeypatch.setenv("WATTSERVE_BATCHER", "dynamic")
    monkeypatch.setenv("WATTSERVE_PREFERRED_BATCH_SIZES", "16")
    with pytest.raises(ValueError, match="preferred_batch_sizes"):
        Settings()


def test_drained_server_exits_promptly_when_idle():
    env = base_env("dynamic")
    server = wattserve_process(env).start()
    try:
        server.wait_ready()
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert time.monotonic() - t0 < 30
    finally:
        server.stop()
