"""A batching policy or a batch observer that raises fails only the requests it concerns
(500 with its message, counted as an error) and the batching loop goes on (issue 26,
point 5): a real server on loopback, then a batcher driven directly."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from wattserve.batchers import BatcherConfig, ContinuousBatcher, WorkItem
from wattserve.batchers.types import BatchFailed
from wattserve.server.settings import Settings

from tests.fake_clock import until
from tests.gated_engine import GatedEngine, item_input
from tests.servers import threaded_server


@pytest.fixture(scope="module")
def served():
    engine = GatedEngine(max_batch_size=4)
    settings = Settings(
        model="gated", batcher="dynamic", max_batch_size=4, max_queue_delay_ms=0, warmup=False
    )
    with threaded_server(settings, engine_factory=lambda s: engine) as (url, app):
        yield url, app


def post(url: str, value: float) -> httpx.Response:
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [value, -value]}]}
    return httpx.post(f"{url}/v2/models/gated/infer", json=body, timeout=10)


def raise_once(obj: object, name: str, message: str) -> list[int]:
    """Replace ``obj.name`` by a callable that raises ``message`` on its first call (on the
    event loop or an engine thread alike), then behaves as before; returns its call log."""
    real = getattr(obj, name)
    calls: list[int] = []
    lock = threading.Lock()

    def broken(*args, **kwargs):
        with lock:
            calls.append(1)
            first = len(calls) == 1
        if first:
            raise RuntimeError(message)
        return real(*args, **kwargs)

    setattr(obj, name, broken)
    return calls


def errors_counted(app) -> int:
    return app.state.runtime.metrics.count("error")


def check_fails_then_serves(url: str, app, message: str) -> None:
    before = errors_counted(app)
    failed = post(url, 3.0)
    assert failed.status_code == 500, failed.text
    assert message in failed.json()["error"]
    for value in (4.0, 5.0):  # the loop goes on
        served = post(url, value)
        assert served.status_code == 200, served.text
        assert served.json()["outputs"][0]["data"] == [2 * value, -2 * value]
    assert errors_counted(app) == before + 1


def test_a_policy_that_raises_fails_its_request_and_the_loop_goes_on(served):
    url, app = served
    # the dynamic policy's own size rule, behind its decision (on the loop and on the
    # engine thread alike)
    calls = raise_once(app.state.runtime.batcher, "size_now", "policy bug")
    check_fails_then_serves(url, app, "policy bug")
    assert calls


@pytest.mark.parametrize("hook", ["on_dispatch", "on_batch_start", "on_batch_end"])
def test_an_observer_that_raises_fails_its_batch_and_the_loop_goes_on(served, hook):
    url, app = served
    observer = app.state.runtime.batcher.observer
    calls = raise_once(observer, hook, f"observer bug in {hook}")
    try:
        check_fails_then_serves(url, app, f"observer bug in {hook}")
    finally:
        del observer.__dict__[hook]  # the class's own method again
    assert calls


# ---------------------------------------------------------------- a batcher driven directly
class Fussy(ContinuousBatcher):
    """Continuous, except that its decision raises while a request of value 13 is at the
    head of the queue: on the engine thread (chaining) and on the event loop alike."""

    def decide(self, view, now):
        head = view.queue.peek(1)
        if head and head[0].inputs["x"][0, 0] == 13.0:
            raise RuntimeError("no thirteens")
        return super().decide(view, now)


async def test_a_raising_decision_fails_the_head_request_only_on_either_door():
    engine = GatedEngine()
    engine.gate.clear()  # hold the first batch so two requests queue behind it
    batcher = Fussy([engine], BatcherConfig(max_batch_size=8))
    task = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(WorkItem(item_input(1.0))))
    await asyncio.to_thread(engine.started.wait, 5)
    bad = asyncio.create_task(batcher.submit(WorkItem(item_input(13.0))))
    await until(lambda: len(batcher.queue) == 1)
    good = asyncio.create_task(batcher.submit(WorkItem(item_input(5.0))))
    await until(lambda: len(batcher.queue) == 2)
    engine.gate.set()  # the thread decides first (raises), then the loop (raises, fails 13)
    assert (await asyncio.wait_for(first, 5)).outputs["y"][0, 0] == 2.0
    with pytest.raises(BatchFailed, match="no thirteens"):
        await asyncio.wait_for(bad, 5)
    assert (await asyncio.wait_for(good, 5)).outputs["y"][0, 0] == 10.0
    assert (await batcher.submit(WorkItem(item_input(7.0)))).outputs["y"][0, 0] == 14.0
    assert engine.seen == [1.0, 5.0, 7.0]  # 13 was never computed
    await batcher.drain(timeout=5)
    await asyncio.wait_for(task, 5)
