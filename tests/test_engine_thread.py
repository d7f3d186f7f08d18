"""Each engine instance is built, warmed, run and (on a failed load) closed on one thread of
its own. torch's OpenMP pool is per calling thread: an engine built on one thread and run on
another leaves a second worker team behind, and on a small machine every team then sleeps
between parallel regions (docs/architecture.md, "One thread per engine")."""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry
from wattserve.server.models.metrics import ServingMetrics
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.models.serving_config import ServingConfig
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine, item_input


class ThreadRecording(GatedEngine):
    """GatedEngine that notes the thread of every call made on it."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.threads = {"build": {threading.get_ident()}, "infer": set(), "close": set()}

    def infer(self, batch):
        self.threads["infer"].add(threading.get_ident())
        return super().infer(batch)

    def close(self) -> None:
        self.threads["close"].add(threading.get_ident())


@pytest.mark.parametrize("batcher", ["dynamic", "static", "continuous", "adaptive"])
async def test_each_instance_is_built_warmed_and_run_on_its_own_thread(batcher):
    built: list[ThreadRecording] = []

    def factory(settings):
        engine = ThreadRecording(max_batch_size=4)
        built.append(engine)
        return engine

    settings = Settings(model="identity", batcher=batcher, instances=2, max_batch_size=4, warmup=True,
                        max_queue_delay_ms=1)  # fmt: skip
    runtime = ModelRuntime(
        ServingConfig.from_settings(settings),
        factory,
        ServingMetrics("gated", batcher, CollectorRegistry()),
        name="gated",
    )
    await runtime.start()
    try:
        warm_calls = [len(e.batches) for e in built]
        assert all(n >= 1 for n in warm_calls), "warm-up ran on every instance"
        items = [runtime.work_item(item_input(float(i)), 0, None) for i in range(16)]
        results = await asyncio.gather(*(runtime.infer(item) for item in items))
        assert [r.outputs["y"][0, 0] for r in results] == [2.0 * i for i in range(16)]
    finally:
        await runtime.stop()
    loop_thread = threading.get_ident()
    assert len(built) == 2
    owners = []
    for engine in built:
        (owner,) = engine.threads["build"]
        assert engine.threads["infer"] == {owner}, "warm-up and batches ran where the engine was built"
        assert owner != loop_thread
        owners.append(owner)
    assert owners[0] != owners[1], "two instances, two threads"
    assert sum(len(e.batches) for e in built) > sum(warm_calls), "requests were computed"


async def test_a_failed_load_closes_each_engine_on_its_own_thread():
    built: list[ThreadRecording] = []

    def factory(settings):
        built.append(ThreadRecording())
        return built[-1]

    settings = Settings(model="identity", batcher="iteration", warmup=True)  # iteration needs a step engine
    runtime = ModelRuntime(
        ServingConfig.from_settings(settings),
        factory,
        ServingMetrics("gated", "iteration", CollectorRegistry()),
        name="gated",
    )
    with pytest.raises(ValueError, match="needs a step engine"):
        await runtime.start()
    (engine,) = built
    assert engine.threads["close"] == engine.threads["build"] == engine.threads["infer"]
    assert not runtime.ready and runtime.batcher is None
