"""The engine core's per-read and per-turn books (server/split/core_service.py,
server/models/request_books.py, ``ModelRuntime.submit_nowait``), in-process: the core app on
a Unix socket and a real ``CoreClient`` (the front end's side) over it, no HTTP.

A read's requests are admitted with one model lookup; each answer still comes from its
own rows, refusals in the middle of a read touch only their own request, and the books
(outcome counter, latency histogram, Triton's statistics) count each request once, at the
end of the loop turn that answered it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from wattserve.batchers.status import Status
from wattserve.batchers.types import ClientGone, Result
from wattserve.server.app import create_app
from wattserve.server.core.request import InferRequest
from wattserve.server.extensions.statistics import ModelStatistics
from wattserve.server.models.metrics import ServingMetrics
from wattserve.server.models.request_books import SuccessBooks
from wattserve.server.settings import Settings
from wattserve.server.split.core_client import CoreClient, RemoteError, RemoteRuntime

ELEMENTS = 8


def run_core(tmp_path, check, **settings):
    """``check(app, runtime, client)`` against an in-process engine core and a client."""

    async def main():
        path = os.path.join(tmp_path, "core.sock")
        s = Settings(**{"model": "identity", "grpc_port": 0, "identity_elements": ELEMENTS,
                        "telemetry": False, "max_queue_size": 4096, **settings})  # fmt: skip
        app = create_app(s, core_channel=path)
        async with app.router.lifespan_context(app):
            client = CoreClient(path, 8 << 20, 1)
            client.start()
            await asyncio.wait_for(client.connected.wait(), 30)
            info = await client.describe("identity", None)
            try:
                await check(app, RemoteRuntime(client, info, None), client)
            finally:
                await client.close()

    asyncio.run(main())


def request(values: np.ndarray) -> InferRequest:
    return InferRequest(None, {"INPUT0": values}, True, values.shape[0])


def test_a_read_of_many_requests_answers_each_from_its_own_rows_and_counts_each_once(tmp_path):
    async def check(app, remote, client):
        rng = np.random.default_rng(0)
        values = [rng.standard_normal((1 + i % 3, ELEMENTS)).astype(np.float32) for i in range(300)]
        results = await asyncio.gather(*(remote.infer(remote.make_item(request(v))) for v in values))
        for value, result in zip(values, results, strict=True):
            np.testing.assert_array_equal(result.outputs["OUTPUT0"], value)
        runtime = app.state.runtime
        assert max(r.batch_size for r in results) > 1  # they did share batches
        await asyncio.sleep(0)  # the turn that answered the last ones has ended
        assert runtime.metrics.count("success") == 300
        assert runtime.metrics.statistics.success.count == 300
        latency = runtime.metrics.latency("http")
        assert latency._sum.get() > 0
        assert sum(bucket.get() for bucket in latency._buckets) == 300

    run_core(tmp_path, check, max_batch_size=64, max_queue_delay_ms=2)


def test_a_refused_request_in_the_middle_of_a_read_refuses_only_itself(tmp_path):
    """One read carries requests for the model, then one for a model the core does not
    know, then more for the model: the unknown one is answered NOT_FOUND, the rest served."""

    async def check(app, remote, client):
        unknown = dataclasses.replace(remote.info, name="nowhere")
        values = [np.full((1, ELEMENTS), i, np.float32) for i in range(20)]
        futures = []
        for i, value in enumerate(values):  # submitted in one turn: one write, one read
            info = unknown if i == 10 else remote.info
            futures.append(client.submit(info, request(value), "grpc")[1])
        answers = await asyncio.gather(*futures, return_exceptions=True)
        assert isinstance(answers[10], RemoteError) and "nowhere" in str(answers[10])
        for i, answer in enumerate(answers):
            if i != 10:
                np.testing.assert_array_equal(answer.outputs["OUTPUT0"], values[i])
        await asyncio.sleep(0)
        metrics = app.state.runtime.metrics
        assert metrics.outcomes("grpc")["success"]._value.get() == 19
        assert metrics.outcomes("http")["success"]._value.get() == 0  # the protocol the front end named

    run_core(tmp_path, check, max_batch_size=64, max_queue_delay_ms=2)


def test_a_full_queue_refuses_at_the_door_with_retry_and_counts_no_failure(tmp_path):
    async def check(app, remote, client):
        futures = [client.submit(remote.info, request(np.ones((1, ELEMENTS), np.float32)), "http")[1]
                   for _ in range(12)]  # fmt: skip
        answers = await asyncio.gather(*futures, return_exceptions=True)
        refused = [a for a in answers if isinstance(a, RemoteError)]
        served = [a for a in answers if isinstance(a, Result)]
        assert refused and served and len(refused) + len(served) == 12
        assert all(a.status is Status.UNAVAILABLE and a.retry_after for a in refused)
        await asyncio.sleep(0)
        metrics = app.state.runtime.metrics
        assert metrics.count("queue_full") == len(refused)
        assert metrics.count("success") == len(served)
        assert metrics.statistics.fail.count == 0  # refused at the door, as admission refuses

    run_core(tmp_path, check, max_batch_size=1, max_queue_delay_ms=0, identity_delay_ms=50, max_queue_size=4)


def test_a_failing_answer_callback_leaves_the_batch_s_other_answers_alone(tmp_path, caplog):
    async def check(app, remote, client):
        runtime = app.state.runtime
        answered: dict[int, np.ndarray] = {}

        def answer_to(index):
            def answer(result, error):
                if index == 3:
                    raise RuntimeError("the caller's bug")
                answered[index] = result.outputs["OUTPUT0"]

            return answer

        values = [np.full((1, ELEMENTS), i, np.float32) for i in range(8)]
        with caplog.at_level(logging.ERROR, logger="wattserve.runtime"):
            for i, value in enumerate(values):
                assert runtime.submit_nowait(runtime.make_item(request(value)), answer_to(i), "http")
            for _ in range(200):
                if len(answered) == 7:
                    break
                await asyncio.sleep(0.01)
        assert sorted(answered) == [0, 1, 2, 4, 5, 6, 7]
        for i, out in answered.items():
            np.testing.assert_array_equal(out, values[i])
        assert any("answering a request failed" in r.getMessage() for r in caplog.records)
        await asyncio.sleep(0)
        assert runtime.metrics.count("success") == 8  # counted once each, the failed callback's too
        assert runtime.batcher.inflight == 0

    run_core(tmp_path, check, max_batch_size=8, max_queue_delay_ms=20)


def result(seconds: float) -> Result:
    return Result({}, queue_time_s=seconds / 4, compute_time_s=seconds / 2, batch_size=4,
                  input_s=seconds / 10, output_s=seconds / 20)  # fmt: skip


def test_statistics_recorded_together_equal_statistics_recorded_one_by_one():
    entries = [(s, result(s)) for s in (0.001, 0.0123, 0.5, 2.0, 0.0)]
    one_by_one, together = ModelStatistics(), ModelStatistics()
    for seconds, r in entries:
        one_by_one.record_success(seconds, r)
    together.record_successes(entries)
    assert together.success.count == one_by_one.success.count == 5
    for name in ("queue_ns", "compute_input_ns", "compute_infer_ns", "compute_output_ns"):
        assert getattr(together, name) > 0
        assert abs(getattr(together, name) - getattr(one_by_one, name)) <= len(entries)  # rounded once
    assert abs(together.success.ns - one_by_one.success.ns) <= len(entries)
    assert together.phase("queue").count == 5 and together.fail.count == 0


def test_books_count_at_the_end_of_the_turn_exactly_what_was_answered():
    metrics = ServingMetrics("m", "dynamic", CollectorRegistry())
    books = SuccessBooks(metrics)

    async def main():
        for seconds in (0.001, 0.002, 0.3):
            books.add("grpc", seconds, result(seconds))
        books.add("http", 0.004, result(0.004))
        assert metrics.count("success") == 0  # not before the turn ends
        await asyncio.sleep(0)
        assert metrics.outcomes("grpc")["success"]._value.get() == 3
        assert metrics.outcomes("http")["success"]._value.get() == 1
        assert metrics.statistics.success.count == 4
        assert metrics.latency("grpc")._sum.get() == pytest.approx(0.303)
        await asyncio.sleep(0)
        assert metrics.count("success") == 4  # and never twice

    asyncio.run(main())
    books.add("http", 0.01, result(0.01))  # no loop running: counted at once
    assert metrics.count("success") == 5


def test_an_answer_given_on_another_thread_reaches_the_caller_on_the_loop(tmp_path):
    """A batcher answers on the loop; were one to answer on an engine thread, the caller's
    callback (which writes to the loop's transports) still runs on the loop, once."""

    async def check(app, remote, client):
        runtime = app.state.runtime
        calls: list[tuple[int, BaseException | None]] = []
        item = runtime.make_item(request(np.ones((1, ELEMENTS), np.float32)))
        assert runtime.submit_nowait(item, lambda result, error: calls.append((threading.get_ident(), error)))
        gone = ClientGone("answered from a thread")
        assert await asyncio.to_thread(item.finish, None, gone)
        await asyncio.sleep(0)
        assert calls == [(threading.get_ident(), gone)]  # this (the loop's) thread, not that one
        assert not item.finish(None, gone)  # and never again

    run_core(tmp_path, check, max_batch_size=8, max_queue_delay_ms=5000)
