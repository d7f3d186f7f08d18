"""Once models are loaded the heap is frozen (``gc.freeze``): full collections stop walking
the models' long-lived objects, which stalled the event loop for 60-77 ms about once a second
under load. An unload must still reclaim what the model left in reference cycles."""

from __future__ import annotations

import gc
import weakref

from prometheus_client import CollectorRegistry
from wattserve.server.models.metrics import ServingMetrics
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.plan import SettingsSource
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine


class Weights:
    """Stands for a model's tensors."""


class CyclicEngine(GatedEngine):
    """Holds its weights in a reference cycle, as a torch.fx graph does (node -> graph ->
    module -> node): only the cyclic collector frees it."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = Weights()
        self.cycle = {"engine": self}


def _model_set(built: list[CyclicEngine]) -> ModelSet:
    settings = Settings(model="identity", batcher="dynamic", warmup=False)

    def factory(s: Settings) -> CyclicEngine:
        built.append(CyclicEngine())
        return built[-1]

    def make_runtime(plan) -> ModelRuntime:
        return ModelRuntime(plan.serving, plan.engine_factory, ServingMetrics(plan.name, "dynamic", CollectorRegistry()),
                            name=plan.name)  # fmt: skip

    return ModelSet(SettingsSource(settings, factory), make_runtime, mode="explicit", startup=["*"])


async def test_loading_freezes_the_heap_and_unloading_reclaims_the_models_cycles():
    gc.unfreeze()
    built: list[CyclicEngine] = []
    models = _model_set(built)
    try:
        await models.start()
        assert gc.get_freeze_count() > 1000, "the loaded model's objects are out of the collector's reach"
        weights = weakref.ref(built[0].weights)
        built.clear()
        await models.unload("identity")
        assert weights() is None, "the unloaded engine's cycle was collected despite the freeze"
        await models.load("identity")
        reloaded = weakref.ref(built[0].weights)
        built.clear()
        gc.collect()
        assert reloaded() is not None, "the serving engine is alive"
    finally:
        await models.stop()
        gc.unfreeze()


def test_an_unwatched_observer_lets_go_of_the_batcher_in_every_gauge():
    """The gauge families outlive a model's batcher (reloads reuse them): after ``unwatch``
    neither the serving gauges nor a step model's running-set gauge may hold it."""
    from wattserve.batchers.iteration_metrics import IterationMetrics
    from wattserve.server.models.batch_observer import ServingObserver

    class Watched:
        queue_depth = 3
        inflight = 2
        running_count = 1

    registry = CollectorRegistry()
    labels = {"model": "m", "batcher": "iteration"}
    observer = ServingObserver(ServingMetrics("m", "iteration", registry),
                               iteration=IterationMetrics("m", "iteration", registry))  # fmt: skip
    batcher = Watched()
    observer.watch(batcher)
    assert registry.get_sample_value("wattserve_running_states", labels) == 1
    assert registry.get_sample_value("wattserve_queue_depth", labels) == 3
    observer.unwatch()
    assert registry.get_sample_value("wattserve_running_states", labels) == 0
    assert registry.get_sample_value("wattserve_queue_depth", labels) == 0
    gone = weakref.ref(batcher)
    del batcher
    gc.collect()
    assert gone() is None


async def test_an_unload_frees_the_model_even_when_the_closing_thread_lingers(monkeypatch):
    """A thread-pool worker holds its call a moment after the awaiting coroutine resumes; the
    unload must not freeze the model it just closed meanwhile (a full-suite run saw it).
    Here every pool call lingers 0.3 s after its result, so the race is always lost."""
    import time
    from concurrent.futures import thread

    real_run = thread._WorkItem.run

    def lingering_run(self):
        real_run(self)
        time.sleep(0.3)  # ``self`` (fn, args) still alive while the loop goes on

    monkeypatch.setattr(thread._WorkItem, "run", lingering_run)
    await test_loading_freezes_the_heap_and_unloading_reclaims_the_models_cycles()
