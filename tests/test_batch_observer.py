"""A batcher reports to its one observer: what left the queue, the model call's window (the
energy mark around it), and one report per executed batch before its answers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from wattserve.batchers import BatcherConfig, ContinuousBatcher, WorkItem
from wattserve.batchers.observers import BatchReport, NullObserver

from tests.fake_clock import until
from tests.gated_engine import GatedEngine, item_input


@dataclass
class Recorder(NullObserver):
    calls: list[str] = field(default_factory=list)
    dispatched: list[int] = field(default_factory=list)
    reports: list[BatchReport] = field(default_factory=list)
    answered_at_report: list[bool] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)

    def on_dispatch(self, items, now):
        self.calls.append("dispatch")
        self.dispatched.append(len(items))
        assert all(now >= item.arrival for item in items)

    def on_batch_start(self):
        self.calls.append("start")
        return "mark"

    def on_batch_end(self, mark):
        assert mark == "mark"
        self.calls.append("end")
        return type("Energy", (), {"joules": 6.0})()

    def on_batch(self, report):
        self.calls.append("batch")
        self.reports.append(report)
        self.answered_at_report.append(any(f.done() for f in self.futures))


async def test_one_batch_is_reported_once_in_order_with_its_energy_record():
    engine = GatedEngine()
    engine.gate.clear()  # hold the first batch so three requests queue behind it
    observer = Recorder()
    batcher = ContinuousBatcher([engine], BatcherConfig(max_batch_size=8), observer=observer)
    task = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(WorkItem(item_input(1.0))))
    await asyncio.to_thread(engine.started.wait, 5)
    rest = [asyncio.create_task(batcher.submit(WorkItem(item_input(v)))) for v in (2.0, 3.0, 4.0)]
    await until(lambda: len(batcher.queue) == 3)
    observer.futures = rest
    engine.gate.set()
    results = await asyncio.gather(first, *rest)
    await batcher.drain(timeout=5)
    await task
    # the engine thread may take the second batch before the loop reports the first
    assert [c for c in observer.calls if c != "batch"] == ["dispatch", "start", "end"] * 2
    assert observer.calls.count("batch") == 2 and observer.calls.index("batch") > observer.calls.index("end")
    assert observer.dispatched == [1, 3]
    assert [r.size for r in observer.reports] == [1, 3]
    assert all(r.time_to_result is None and r.compute_s >= 0 for r in observer.reports)
    assert observer.answered_at_report == [False, False]  # reported before any answer
    assert [r.energy.joules for r in observer.reports] == [6.0, 6.0]  # what on_batch_end returned
    assert len(results) == 4


async def test_a_failing_observer_costs_no_answer():
    class Broken(NullObserver):
        def on_batch(self, report):
            raise RuntimeError("observer bug")

    batcher = ContinuousBatcher([GatedEngine()], BatcherConfig(max_batch_size=2), observer=Broken())
    task = asyncio.create_task(batcher.run())
    result = await batcher.submit(WorkItem(item_input(5.0)))
    await batcher.drain(timeout=5)
    await task
    assert result.outputs["y"][0, 0] == pytest.approx(10.0)


async def test_the_runtime_wires_one_observer_and_the_policys_own_collector():
    """Serving metrics come from the runtime's observer; the SLO collector is registered
    with the model's name while the batcher serves and unregistered when it stops, so a
    reload does not leave a stale copy behind."""
    from prometheus_client import CollectorRegistry
    from wattserve.server.models.metrics import ServingMetrics
    from wattserve.server.models.runtime import ModelRuntime
    from wattserve.server.models.serving_config import ServingConfig
    from wattserve.server.settings import Settings

    registry = CollectorRegistry()
    settings = Settings(model="identity", batcher="aimd", warmup=False, max_batch_size=4)
    labels = {"model": "gated", "batcher": "aimd"}
    objective = ("wattserve_slo_objective_seconds", {**labels, "percentile": "99"})
    for _ in range(2):  # a second start (a reload) registers its own collector again
        runtime = ModelRuntime(ServingConfig.from_settings(settings), lambda s: GatedEngine(), ServingMetrics("gated", "aimd", registry),
                               name="gated")  # fmt: skip
        await runtime.start()
        assert registry.get_sample_value(*objective) == 0.1
        results = [await runtime.infer(runtime.work_item(item_input(3.0), 0, None))]
        assert results[0].outputs["y"][0, 0] == pytest.approx(6.0)
        assert registry.get_sample_value("wattserve_queue_duration_seconds_count", labels) >= 1
        await runtime.stop()
        assert registry.get_sample_value(*objective) is None
    assert registry.get_sample_value("wattserve_batch_executions_total", labels) == 2


async def test_a_batcher_that_cannot_serve_the_engine_fails_the_load_and_frees_it():
    from wattserve.server.models.metrics import ServingMetrics
    from wattserve.server.models.runtime import ModelRuntime
    from wattserve.server.models.serving_config import ServingConfig
    from wattserve.server.settings import Settings

    closed = []

    class Tracked(GatedEngine):
        def close(self) -> None:
            closed.append(self)

    settings = Settings(model="identity", batcher="iteration", warmup=False)
    runtime = ModelRuntime(
        ServingConfig.from_settings(settings),
        lambda s: Tracked(),
        ServingMetrics("gated", "iteration"),
        name="gated",
    )
    with pytest.raises(ValueError, match="needs a step engine"):
        await runtime.start()
    assert len(closed) == 1 and runtime.batcher is None and not runtime.ready
