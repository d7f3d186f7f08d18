"""Triton's rate limiter (``--rate-limit execution_count``): instances of every model share
resources, an instance runs a batch only holding its resources, priority orders the waiters.

Engines are doubles that record who computes at once (``Overlaps``); every wait is on an
event or on the limiter's own state, never on a sleep or a wall-clock bound."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from wattserve.batchers import BatcherConfig, ContinuousBatcher, WorkItem
from wattserve.batchers.rate_limiter import InstanceLimits, RateLimiter, Resource
from wattserve.server.models.repository.config import ConfigError, parse_config
from wattserve.server.models.repository.plan import plan_config
from wattserve.server.settings import Settings

from tests.fake_clock import until
from tests.gated_engine import GatedEngine, item_input
from tests.servers import free_port, threaded_server


class Overlaps:
    """Shared by engine doubles: how many compute at once, and the most ever seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


class RecordingEngine(GatedEngine):
    """A GatedEngine on ``device`` that counts itself in ``overlaps`` while it computes."""

    def __init__(self, overlaps: Overlaps, device: str = "cpu") -> None:
        super().__init__(max_batch_size=1)
        self.overlaps = overlaps
        self.device = device

    def infer(self, batch):
        self.overlaps.enter()
        try:
            return super().infer(batch)
        finally:
            self.overlaps.leave()


def unit(name: str = "R1", count: int = 1, is_global: bool = False, priority: int = 0) -> InstanceLimits:
    return InstanceLimits((Resource(name, count, is_global),), priority)


async def model(limiter: RateLimiter, engine: RecordingEngine, limits: InstanceLimits | None):
    """One model's batcher over ``engine``, its instance claiming ``limits``, running."""
    batcher = ContinuousBatcher([engine], BatcherConfig(max_batch_size=1))
    batcher.use_rate_limiter(limiter, [limiter.claim(limits, engine.device, "m")])
    return batcher, asyncio.create_task(batcher.run())


async def ask(batcher, value: float):
    result = await batcher.submit(WorkItem(item_input(value), rows=1))
    np.testing.assert_array_equal(result.outputs["y"], [[2 * value, -2 * value]])


async def started(engine: GatedEngine) -> None:
    assert await asyncio.to_thread(engine.started.wait, 10), "the engine never started a batch"


async def two_models(limiter, devices=("cpu", "cpu"), limits=(unit(), unit())):
    overlaps = Overlaps()
    a, b = (RecordingEngine(overlaps, d) for d in devices)
    (ba, ta), (bb, tb) = [await model(limiter, e, lim) for e, lim in zip((a, b), limits, strict=True)]
    return overlaps, (a, ba, ta), (b, bb, tb)


async def stop(*pairs) -> None:
    for batcher, task in pairs:
        await batcher.drain()
        await task


# ------------------------------------------------------------------ across models
async def test_two_models_sharing_one_unit_never_compute_at_once():
    limiter = RateLimiter("execution_count")
    overlaps, (a, ba, ta), (b, bb, tb) = await two_models(limiter)
    a.gate.clear()
    first = asyncio.create_task(ask(ba, 1))
    await started(a)  # model a holds R1
    second = asyncio.create_task(ask(bb, 2))
    await until(lambda: limiter.waiting == 1)  # model b's batch waits for R1, not computing
    assert not b.started.is_set()
    a.gate.set()
    await asyncio.gather(first, second)
    assert overlaps.most == 1
    await stop((ba, ta), (bb, tb))


async def test_every_request_is_answered_once_under_load_and_never_together():
    limiter = RateLimiter("execution_count")
    overlaps, (a, ba, ta), (b, bb, tb) = await two_models(limiter)
    jobs = [ask(ba if i % 2 else bb, float(i)) for i in range(60)]
    await asyncio.gather(*jobs)  # each asserts its own answer; a second answer would raise
    assert overlaps.most == 1
    assert sorted(a.seen + b.seen) == [float(i) for i in range(60)]
    assert limiter.free == {("R1", 0): 1}  # every unit given back (a CPU instance is device 0, as in Triton)
    await stop((ba, ta), (bb, tb))


async def test_a_request_whose_client_leaves_while_its_batch_waits_is_never_computed():
    limiter = RateLimiter("execution_count")
    _, (a, ba, ta), (b, bb, tb) = await two_models(limiter)
    a.gate.clear()
    first = asyncio.create_task(ask(ba, 1))
    await started(a)
    gone = asyncio.create_task(ask(bb, 2))
    await until(lambda: limiter.waiting == 1)
    gone.cancel()  # the client leaves while its batch waits for R1
    await asyncio.gather(gone, return_exceptions=True)
    a.gate.set()
    await first
    await ask(bb, 3)  # b still serves, after its empty grant gave R1 back
    assert b.seen == [3.0]
    assert limiter.free == {("R1", 0): 1}
    await stop((ba, ta), (bb, tb))


async def test_with_rate_limiting_off_the_same_models_overlap():
    limiter = RateLimiter("off")
    overlaps, (a, ba, ta), (b, bb, tb) = await two_models(limiter)
    a.gate.clear()
    b.gate.clear()
    pending = [asyncio.create_task(ask(ba, 1)), asyncio.create_task(ask(bb, 2))]
    await started(a)
    await started(b)  # both compute at once: the resources are ignored
    a.gate.set()
    b.gate.set()
    await asyncio.gather(*pending)
    assert overlaps.most == 2
    await stop((ba, ta), (bb, tb))


async def test_a_per_device_resource_is_one_pool_per_device_a_global_one_is_shared():
    limiter = RateLimiter("execution_count")
    overlaps, (a, ba, ta), (b, bb, tb) = await two_models(limiter, ("cuda:0", "cuda:1"))
    a.gate.clear()
    b.gate.clear()
    pending = [asyncio.create_task(ask(ba, 1)), asyncio.create_task(ask(bb, 2))]
    await started(a)
    await started(b)  # R1 on cuda:0 and R1 on cuda:1: two pools
    a.gate.set()
    b.gate.set()
    await asyncio.gather(*pending)
    await stop((ba, ta), (bb, tb))

    limiter = RateLimiter("execution_count")
    g = unit("G", is_global=True)
    overlaps, (a, ba, ta), (b, bb, tb) = await two_models(limiter, ("cuda:0", "cuda:1"), (g, g))
    a.gate.clear()
    first = asyncio.create_task(ask(ba, 1))
    await started(a)
    second = asyncio.create_task(ask(bb, 2))
    await until(lambda: limiter.waiting == 1)  # one G for the whole server
    assert not b.started.is_set()
    a.gate.set()
    await asyncio.gather(first, second)
    assert overlaps.most == 1
    await stop((ba, ta), (bb, tb))


# ------------------------------------------------------------------ the limiter alone
async def test_priority_lower_value_more_chances_ties_in_arrival_order():
    limiter = RateLimiter("execution_count")
    holder = limiter.claim(unit(), "cpu", "holder")
    fast = limiter.claim(unit(priority=1), "cpu", "fast")
    slow = limiter.claim(unit(priority=2), "cpu", "slow")
    assert holder and fast and slow
    for claim in (fast, slow):  # each has run once: scaled priority 1 vs 2
        assert limiter.try_acquire(claim)
        limiter.release(claim)
    assert limiter.try_acquire(holder)
    order: list[str] = []

    async def wait(claim):
        await limiter.acquire(claim)
        order.append(claim.owner)

    waiters = [asyncio.create_task(wait(slow))]  # slow asks first
    await until(lambda: limiter.waiting == 1)
    waiters.append(asyncio.create_task(wait(fast)))
    await until(lambda: limiter.waiting == 2)
    limiter.release(holder)
    await until(lambda: order == ["fast"])  # fast first though it asked second
    limiter.release(fast)
    await asyncio.gather(*waiters)
    assert order == ["fast", "slow"]


async def test_a_cancelled_waiter_does_not_block_those_behind_it():
    limiter = RateLimiter("execution_count")
    big = limiter.claim(unit(count=2), "cpu", "big")  # the pool becomes 2
    small = limiter.claim(unit(count=1), "cpu", "small")
    assert big and small and limiter.try_acquire(small)
    blocked = asyncio.create_task(limiter.acquire(big))
    await until(lambda: limiter.waiting == 1)
    other = limiter.claim(unit(count=1), "cpu", "other")
    assert other and not limiter.try_acquire(other)  # big waits ahead of it
    blocked.cancel()
    await asyncio.gather(blocked, return_exceptions=True)
    assert limiter.try_acquire(other)


def test_pools_are_the_most_asked_unless_the_flags_set_them():
    limiter = RateLimiter("execution_count")
    a = limiter.claim(unit(count=2), "cuda:0", "a")
    b = limiter.claim(unit(count=3), "cuda:0", "b")
    small = limiter.claim(unit(count=1), "cpu", "c")  # Triton counts CPU instances as device 0
    assert limiter.pools == {("R1", 0): 3}
    limiter.withdraw([b])  # unloaded: the pool is the most the others ask again
    assert limiter.pools == {("R1", 0): 2} and limiter.free == {("R1", 0): 2}
    limiter.withdraw([a, small])
    assert limiter.pools == {} and limiter.free == {}
    # Triton's example: R1:10 on every device, R2 5 on device 0 and 8 on 1, global R3 2
    limiter = RateLimiter("execution_count", ["R1:10", "R2:5:0", "R2:8:1", "R3:2"])
    for device in ("cuda:0", "cuda:1"):
        limiter.claim(InstanceLimits((Resource("R1", 1), Resource("R2", 1))), device, device)
    limiter.claim(unit("R3", is_global=True), "cuda:1", "c")
    assert limiter.pools == {("R1", 0): 10, ("R2", 0): 5, ("R1", 1): 10, ("R2", 1): 8, ("R3", "global"): 2}
    assert RateLimiter("off").claim(unit(), "cpu", "e") is None  # off: never limited
    for bad in ("R1", "R1:x", ":2", "R1:2:gpu"):
        with pytest.raises(ValueError):
            Settings(rate_limit_resource=[bad])
    assert Settings(rate_limit_resource="R1:2,R2:1:0").rate_limit_resource == ["R1:2", "R2:1:0"]


def test_the_limiter_refuses_what_triton_refuses():
    limiter = RateLimiter("execution_count", ["R1:1:1"])
    with pytest.raises(
        ValueError, match=r'Resource count for "R1" is limited to 1 .* minimum required count is 2'
    ):
        limiter.claim(unit(count=2), "cuda:1", "a")
    with pytest.raises(ValueError, match='Resource count for "R9" is limited to 0'):  # no flag names it
        limiter.claim(unit("R9"), "cuda:1", "b")
    limiter = RateLimiter("execution_count")
    limiter.claim(unit("G", is_global=True), "cpu", "c")
    with pytest.raises(ValueError, match='Resource "G" is present as both global and device-specific'):
        limiter.claim(unit("G"), "cpu", "d")
    assert limiter.pools == {("G", "global"): 1}  # a refused claim changes nothing


# ------------------------------------------------------------------ config.pbtxt
BASE = """backend: "wattserve"
max_batch_size: 4
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "4" } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
LIMITED = (
    BASE
    + """instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R1"
count: 1 }, { name: "G" global: true count: 2 } ] priority: 2 } }, { count: 1 kind: KIND_CPU } ]
"""
)


def test_the_rate_limiter_is_planned_per_instance(tmp_path):
    (tmp_path / "m").mkdir()
    (plan,) = plan_config(tmp_path / "m", Settings(), parse_config(LIMITED), "config.pbtxt")
    first = InstanceLimits((Resource("R1", 1), Resource("G", 2, True)), 2)
    assert plan.serving.rate_limits == (first, first, None)
    assert plan.config.instance_group[0].rate_limiter.priority == 2  # /config shows it


def test_a_malformed_resource_fails_the_load_and_a_repeated_name_keeps_its_last_count(tmp_path):
    (tmp_path / "m").mkdir()
    group = "instance_group [ {{ kind: KIND_CPU rate_limiter {{ resources [ {} ] }} }} ]"
    with pytest.raises(ConfigError, match=r"config.pbtxt:7:\d+: .*count"):  # uint32: protobuf's own words
        parse_config(BASE + group.format('{ name: "R" count: -1 }'))
    with pytest.raises(ConfigError, match=r"config.pbtxt:7:\d+: .*glob"):
        parse_config(BASE + group.format('{ name: "R" glob: true }'))
    config = parse_config(BASE + group.format('{ name: "R" count: 1 }, { name: "R" count: 3 }'))
    (plan,) = plan_config(tmp_path / "m", Settings(), config, "config.pbtxt")
    assert plan.serving.rate_limits == (InstanceLimits((Resource("R", 3),)),)  # Triton's map: the last


def test_a_model_the_flags_leave_too_little_is_unavailable_with_tritons_reason(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_text(LIMITED)
    settings = Settings(model_repository=tmp_path, telemetry=False, rate_limit="execution_count",
                        rate_limit_resource=["R1:1", "G:1"])  # fmt: skip
    with threaded_server(settings) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/v2/models/a/ready").status_code != 200
        (entry,) = client.post("/v2/repository/index", json={}).json()
        assert 'Resource count for "G" is limited to 1' in entry["reason"], entry


def test_a_server_shares_one_limiter_across_models_and_shows_the_config(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(LIMITED)
    port = free_port()
    settings = Settings(
        model_repository=tmp_path, telemetry=False, rate_limit="execution_count", grpc_port=port
    )
    with threaded_server(settings) as (url, app):
        grpc_config = tgrpc.InferenceServerClient(f"127.0.0.1:{port}").get_model_config("b").config
        assert grpc_config.instance_group[0].rate_limiter.resources[1].count == 2  # gRPC: the same
        assert grpc_config.instance_group[1].count == 1
        with httpx.Client(base_url=url, timeout=30) as client:
            config = client.get("/v2/models/a/config").json()
            limiter = config["instance_group"][0]["rate_limiter"]
            assert limiter["priority"] == 2
            assert {"name": "G", "global": True, "count": 2} in limiter["resources"]
            body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
            for name in ("a", "b") * 5:
                reply = client.post(f"/v2/models/{name}/infer", json=body)
                assert reply.status_code == 200, reply.text
                assert reply.json()["outputs"][0]["data"] == [1, 2, 3, 4]
        if getattr(app.state, "models", None) is not None:  # in process (not a split server)
            limiters = [rt.batcher._limiter for rt in app.state.models.runtimes()]
            assert len(limiters) == 2 and limiters[0] is limiters[1] is not None
