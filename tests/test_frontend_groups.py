"""A front end's groups (server/split/core_client.py ``_Group``): the one-row requests to a
model decoded in one loop turn travel to the engine core as one multi-row item.

In-process, as tests/test_engine_core.py: the core app on a Unix socket and a real
``CoreClient`` over it. What must hold: each member is answered from its own row; every
book counts members, not groups (outcomes, latency, Triton's statistics, queue time, the
front end's request count, the queue's bound); a waiter that leaves loses only its own
answer, and a group whose waiters all left is cancelled in the core (never computed if
queued); models that treat a request by itself are never grouped."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from wattserve.batchers.status import Status
from wattserve.batchers.types import Result
from wattserve.server.app import create_app
from wattserve.server.settings import Settings
from wattserve.server.split.core_client import CoreClient, CoreUnavailable, RemoteError, RemoteRuntime
from wattserve.server.split.core_service import GROUP_SHARE

from tests.test_engine_core import ELEMENTS, request, run_core


async def until(predicate, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not reached in time")


async def occupy(runtime, remote) -> asyncio.Task:
    """A two-row request (sent alone, never grouped) running on the model's one instance, so
    that what comes next queues behind it; its task."""
    blocker = asyncio.create_task(remote.infer(remote.make_item(request(np.ones((2, ELEMENTS), np.float32)))))
    await until(lambda: runtime.batcher.inflight and not runtime.batcher.queue_depth)
    return blocker


def sample_count(histogram) -> float:
    return sum(bucket.get() for bucket in histogram._buckets)


def test_a_turn_s_one_row_requests_travel_as_groups_each_answered_from_its_own_row(tmp_path):
    async def check(app, remote, client):
        assert remote.info.group_rows == 64 // GROUP_SHARE == 8
        rng = np.random.default_rng(1)
        values = [rng.standard_normal((1, ELEMENTS)).astype(np.float32) for _ in range(43)]
        results = await asyncio.gather(*(remote.infer(remote.make_item(request(v))) for v in values))
        for value, result in zip(values, results, strict=True):
            np.testing.assert_array_equal(result.outputs["OUTPUT0"], value)
            assert result.outputs["OUTPUT0"].shape == (1, ELEMENTS)
        assert client.grouped == 43  # five groups of 8 and one of 3, none sent alone
        await asyncio.sleep(0)  # the turn that answered them has ended: the books are in
        runtime = app.state.runtime
        metrics = runtime.metrics
        assert metrics.count("success") == 43
        assert metrics.statistics.success.count == 43
        assert metrics.statistics.inference_count == 43
        assert sample_count(metrics.latency("http")) == 43
        assert sample_count(metrics.queue_time) == 43
        service = app.state.core_service
        assert service.requests.labels("1")._value.get() == 43  # the front end's count, by member
        assert service.grouped.labels("1")._value.get() == 43
        assert service.groups.labels("1")._value.get() == 6
        assert runtime.batcher.queue_depth == 0 and runtime.batcher.inflight == 0

    run_core(tmp_path, check, max_batch_size=64, max_queue_delay_ms=2)


def test_a_group_is_admitted_whole_or_refused_whole_against_the_queue_bound(tmp_path):
    """Three groups of 8 in one read, a bound of 12 requests: the first queues (8), each
    other would make 16, so is refused whole (503, retry), and counted per member."""

    async def check(app, remote, client):
        futures = [client.submit(remote.info, request(np.full((1, ELEMENTS), i, np.float32)), "http")[1]
                   for i in range(24)]  # fmt: skip
        answers = await asyncio.gather(*futures, return_exceptions=True)
        served = [i for i, a in enumerate(answers) if isinstance(a, Result)]
        refused = [a for a in answers if isinstance(a, RemoteError)]
        assert served == list(range(8)) and len(refused) == 16
        assert all(a.status is Status.UNAVAILABLE and a.retry_after for a in refused)
        for i in served:
            np.testing.assert_array_equal(answers[i].outputs["OUTPUT0"], np.full((1, ELEMENTS), i))
        await asyncio.sleep(0)
        metrics = app.state.runtime.metrics
        assert metrics.count("queue_full") == 16
        assert metrics.count("success") == 8

    run_core(tmp_path, check, max_batch_size=64, max_queue_delay_ms=0, max_queue_size=12)


def test_waiters_that_leave_lose_their_rows_and_a_group_all_left_is_cancelled_in_the_core(tmp_path):
    async def check(app, remote, client):
        runtime = app.state.runtime
        blocker = await occupy(runtime, remote)
        left = [asyncio.create_task(remote.infer(remote.make_item(request(np.full((1, ELEMENTS), 7.0, np.float32)))))
                for _ in range(5)]  # fmt: skip
        kept = [np.full((1, ELEMENTS), 10.0 + i, np.float32) for i in range(3)]
        staying = [asyncio.create_task(remote.infer(remote.make_item(request(v)))) for v in kept]
        mixed = [asyncio.create_task(remote.infer(remote.make_item(request(np.zeros((1, ELEMENTS), np.float32)))))
                 for _ in range(4)]  # fmt: skip
        await until(lambda: runtime.batcher.queue_depth == 12)  # a group of 8 (5 + 3), one of 4
        for task in left + mixed[:2]:
            task.cancel()
        for task in mixed[2:]:  # the second group's last waiters leave too: it is cancelled
            task.cancel()
        for value, task in zip(kept, staying, strict=True):
            np.testing.assert_array_equal((await task).outputs["OUTPUT0"], value)
        await blocker
        for task in left + mixed:
            assert task.cancelled()
        await until(lambda: runtime.metrics.count("cancelled") == 4)
        await asyncio.sleep(0)
        # the group of 8 was computed (3 still waited): 8 successes in the core, 5 rows dropped;
        # the group of 4 never was: cancelled while queued, each member counted
        assert runtime.metrics.count("cancelled") == 4
        assert runtime.metrics.count("success") == 1 + 8
        assert runtime.metrics.statistics.inference_count == 2 + 8
        assert runtime.batcher.inflight == 0 and client.inflight == 0

    run_core(tmp_path, check, max_batch_size=64, max_queue_delay_ms=0, identity_delay_ms=300, warmup=False)


def test_models_that_batch_little_are_not_grouped(tmp_path):
    async def check(app, remote, client):
        assert remote.info.group_rows == 0  # 8 // GROUP_SHARE: a group of one is no group
        values = [np.full((1, ELEMENTS), i, np.float32) for i in range(10)]
        results = await asyncio.gather(*(remote.infer(remote.make_item(request(v))) for v in values))
        for value, result in zip(values, results, strict=True):
            np.testing.assert_array_equal(result.outputs["OUTPUT0"], value)
        assert client.grouped == 0

    run_core(tmp_path, check, max_batch_size=8, max_queue_delay_ms=2)


def test_a_group_booked_with_its_count_equals_its_members_booked_one_by_one():
    """The core books a group's answer once with its count (``SuccessBooks.add(...,
    requests)``, ``BisectHistogram.observe_counted``): the same figures as one entry each."""
    from prometheus_client import CollectorRegistry
    from wattserve.server.models.metrics import ServingMetrics
    from wattserve.server.models.request_books import SuccessBooks

    def timing(seconds: float) -> Result:
        return Result({}, queue_time_s=seconds / 3, compute_time_s=seconds / 2, batch_size=8,
                      input_s=seconds / 10, output_s=seconds / 20)  # fmt: skip

    answers = [(0.0021, 5), (0.04, 1), (0.7, 12), (0.0021, 3)]
    counted = ServingMetrics("m", "dynamic", CollectorRegistry())
    one_by_one = ServingMetrics("m", "dynamic", CollectorRegistry())
    counted_books, single_books = SuccessBooks(counted), SuccessBooks(one_by_one)
    for seconds, requests in answers:
        counted_books.add("grpc", seconds, timing(seconds), requests)
        for _ in range(requests):
            single_books.add("grpc", seconds, timing(seconds))
    counted_books.flush()
    single_books.flush()
    assert counted.count("success") == one_by_one.count("success") == 21
    a, b = counted.latency("grpc"), one_by_one.latency("grpc")
    assert [x.get() for x in a._buckets] == [x.get() for x in b._buckets]
    assert sum(x.get() for x in a._buckets) == 21
    assert abs(a._sum.get() - b._sum.get()) < 1e-9
    for name in ("queue_ns", "compute_input_ns", "compute_infer_ns", "compute_output_ns"):
        assert abs(getattr(counted.statistics, name) - getattr(one_by_one.statistics, name)) <= 21
    assert counted.statistics.success.count == 21
    assert abs(counted.statistics.success.ns - one_by_one.statistics.success.ns) <= 21
    waits = counted.queue_time
    waits.observe_counted([(0.001, 4), (0.25, 2)])
    assert sum(x.get() for x in waits._buckets) == 6 and abs(waits._sum.get() - 0.504) < 1e-12


def test_a_front_end_that_goes_away_has_its_groups_counted_lost_by_member_and_never_computed(tmp_path):
    async def check(app, remote, client):
        runtime = app.state.runtime
        blocker = await occupy(runtime, remote)
        members = [
            asyncio.create_task(
                remote.infer(remote.make_item(request(np.full((1, ELEMENTS), i, np.float32))))
            )
            for i in range(8)
        ]
        await until(lambda: runtime.batcher.queue_depth == 8)
        client.protocol.transport.abort()  # as if the front end's process were killed
        for task in [blocker, *members]:  # its own waiters: the core is gone for them (503)
            with pytest.raises(CoreUnavailable) as gone:
                await task
            assert gone.value.status is Status.UNAVAILABLE and gone.value.retry_after
        lost = app.state.core_service.lost
        await until(lambda: lost._value.get() == 9)  # the running request and the group's 8
        await until(lambda: not runtime.batcher.inflight)
        assert runtime.metrics.statistics.inference_count <= 2  # the group was never computed

    run_core(tmp_path, check, max_batch_size=64, max_queue_delay_ms=0, identity_delay_ms=300, warmup=False)


def test_a_group_the_slab_has_no_room_for_travels_in_its_frame(tmp_path):
    """A slab too small for a group's rows and answer: the rows go inline in the frame (and
    the answer comes back inline), each member still answered from its own row."""

    async def main():
        path = os.path.join(tmp_path, "core.sock")
        settings = Settings(model="identity", grpc_port=0, identity_elements=ELEMENTS, telemetry=False,
                            max_batch_size=64, max_queue_delay_ms=2)  # fmt: skip
        app = create_app(settings, core_channel=path)
        async with app.router.lifespan_context(app):
            client = CoreClient(path, 512, 1)  # a group of 8 needs 640 bytes: never fits
            client.start()
            await asyncio.wait_for(client.connected.wait(), 30)
            remote = RemoteRuntime(client, await client.describe("identity", None), None)
            blocks: list[int | None] = []
            allocate = client.ring.allocate
            client.ring.allocate = lambda n: blocks.append(allocate(n)) or blocks[-1]  # type: ignore[method-assign]
            try:
                values = [np.full((1, ELEMENTS), i, np.float32) for i in range(16)]
                results = await asyncio.gather(*(remote.infer(remote.make_item(request(v))) for v in values))
                for value, result in zip(values, results, strict=True):
                    np.testing.assert_array_equal(result.outputs["OUTPUT0"], value)
                assert client.grouped == 16
                assert blocks == [None, None]  # two groups of 8, neither placed in the slab
            finally:
                await client.close()

    asyncio.run(main())
