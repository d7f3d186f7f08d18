"""The iteration-level continuous batcher on the real tiny diffusion engine.

What must hold: a request arriving mid-way joins at the next iteration (seen in the
occupancy metric and in its latency); a finished request is answered while the others
still run; deadlines, cancellation, the bounded queue and drain keep every invariant.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from time import monotonic

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from wattserve.batchers.base import BatcherConfig
from wattserve.batchers.continuous import ContinuousBatcher
from wattserve.batchers.iteration import InvalidRequest, IterationBatcher
from wattserve.batchers.iteration_metrics import IterationMetrics
from wattserve.batchers.observers import NullObserver
from wattserve.batchers.registry import ON_STEP_ENGINES, build_batcher, policy_for
from wattserve.batchers.types import (
    BatchFailed,
    ClientGone,
    DeadlineExceeded,
    Draining,
    QueueFull,
    Result,
    WorkItem,
)
from wattserve.engines.diffusion import DiffusionEngine
from wattserve.engines.identity import IdentityEngine
from wattserve.server.models.batch_observer import ServingObserver
from wattserve.server.models.metrics import ServingMetrics
from wattserve.server.settings import Settings

from tests.diffusion_support import quiet_cpu  # noqa: F401  (autouse fixture)
from tests.fake_clock import FakeClock, until

TOL = 1e-3  # same-seed images alone vs batched (see tests/test_diffusion_engine.py)


@pytest.fixture(scope="module")
def engine() -> DiffusionEngine:
    return DiffusionEngine(device="cpu", max_batch_size=8)


@pytest.fixture(scope="module")
def solo_cache(engine):
    cache: dict[tuple[int, int], np.ndarray] = {}

    def solo(seed: int, steps: int) -> np.ndarray:
        if (seed, steps) not in cache:
            b = {"seed": np.array([[seed]], np.int64), "steps": np.array([[steps]], np.int32)}
            cache[seed, steps] = engine.infer(b)["image"][0]
        return cache[seed, steps]

    return solo


class Occupancy:
    """Records the occupancy of every model call the engine makes (its step observer)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, states: int, _seconds: float) -> None:
        self.calls.append(states)

    async def wait_for(self, n: int, timeout: float = 30.0) -> None:
        end = monotonic() + timeout
        while len(self.calls) < n:
            assert monotonic() < end, f"only {len(self.calls)} iterations ran"
            await asyncio.sleep(0.002)


@dataclass
class JoulePerIteration(NullObserver):
    """Energy-meter double (no NVML here): every iteration 'measures' exactly 1 J."""

    iterations: int = 0

    def __init__(self) -> None:
        self.reports: list = []

    def on_batch(self, report) -> None:
        self.reports.append(report)

    def on_batch_end(self, _mark: None):
        self.iterations += 1
        return type("Energy", (), {"joules": 1.0})()


class RecordingObserver(ServingObserver):
    """The server's observer, also recording each model call's occupancy for the test."""

    def __init__(self, occupancy: Occupancy, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.occupancy = occupancy

    def on_step(self, states: int, seconds: float) -> None:
        self.occupancy(states, seconds)
        super().on_step(states, seconds)


def work(seed: int, steps: int, **kw) -> WorkItem:
    # one request of one row: the batch axis first, as every work item carries it
    return WorkItem(
        inputs={"seed": np.array([[seed]], np.int64), "steps": np.array([[steps]], np.int32)}, **kw
    )


async def started(batcher: IterationBatcher) -> asyncio.Task:
    task = asyncio.create_task(batcher.run())
    await asyncio.sleep(0)
    return task


def make(engine, *, max_batch=4, queue=64, observer=None) -> IterationBatcher:
    config = BatcherConfig(max_batch_size=max_batch, max_queue_size=queue)
    return IterationBatcher([engine], config, observer=observer)


def release(batcher: IterationBatcher) -> None:
    """Stop the worker threads but keep the module's shared engine open (close() would not)."""
    for inst in batcher.instances:
        inst.executor.shutdown(wait=True)


async def finish(batcher: IterationBatcher, task: asyncio.Task) -> None:
    await batcher.drain(timeout=60)
    await task
    release(batcher)


@pytest.fixture
def observed(engine):
    occ = Occupancy()
    engine.step_observer = occ
    yield occ
    engine.step_observer = None


async def test_late_arrival_joins_at_next_iteration_and_leaves_first(engine, observed, solo_cache):
    registry = CollectorRegistry()
    metrics = ServingMetrics("tiny_unet", "continuous", registry)
    iteration = IterationMetrics("tiny_unet", "continuous", registry)
    observer = RecordingObserver(observed, metrics, iteration=iteration)
    batcher = make(engine, observer=observer)  # the engine now reports its steps to it
    observer.watch(batcher)
    task = await started(batcher)

    long_task = asyncio.create_task(batcher.submit(work(1, 30)))
    await observed.wait_for(6)
    done_before = len(observed.calls)
    t_submit = monotonic()
    short: Result = await batcher.submit(work(2, 5))
    short_latency = monotonic() - t_submit
    assert not long_task.done(), "the short request was answered while the long one still runs"
    long: Result = await long_task
    await finish(batcher, task)
    engine.step_observer = observed  # the solo reference runs below are not the batcher's

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model": "tiny_unet", "batcher": "continuous", **labels})

    assert value("wattserve_iteration_batch_size_count") == 30
    assert value("wattserve_iteration_batch_size_bucket", le="1.0") == 25
    assert value("wattserve_iteration_state_steps_total") == 35
    assert value("wattserve_time_to_result_seconds_count") == 2
    assert value("wattserve_batch_executions_total") == 30
    assert value("wattserve_inferences_total") == 2
    assert value("wattserve_running_states") == 0
    stats = metrics.statistics.triton("tiny_unet", "1")  # Triton's /stats: every model call an execution
    assert (stats["execution_count"], stats["inference_count"]) == (30, 2)
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {1: 25, 2: 5}

    calls = observed.calls
    join = calls.index(2)
    assert join <= done_before + 1  # joined at the next iteration (one may have been in flight)
    assert calls == [1] * join + [2] * 5 + [1] * (25 - join)  # rode its 5 steps with the long one
    assert short.batch_size == 2 and short.queue_time_s < short_latency
    assert long.batch_size == 1  # mean occupancy 35/30, rounded
    # its latency is its own 5 steps (plus at most one iteration's wait), not the long one's 30
    assert short.compute_time_s < long.compute_time_s
    np.testing.assert_allclose(short.outputs["image"][0], solo_cache(2, 5), atol=TOL, rtol=0)
    np.testing.assert_allclose(long.outputs["image"][0], solo_cache(1, 30), atol=TOL, rtol=0)


async def test_mixed_steps_answered_in_finish_order_with_own_images(engine, observed, solo_cache):
    batcher = make(engine, max_batch=8)
    task = await started(batcher)
    order: list[int] = []
    specs = [(10, 12), (11, 3), (12, 7), (13, 1), (14, 9)]

    async def one(seed: int, steps: int) -> Result:
        r = await batcher.submit(work(seed, steps))
        order.append(steps)
        return r

    results = await asyncio.gather(*(one(s, n) for s, n in specs))
    await finish(batcher, task)
    assert order == sorted(n for _, n in specs)  # each answered as soon as it finished
    assert observed.calls[0] == 5 and len(observed.calls) == 12
    for (seed, steps), r in zip(specs, results, strict=True):
        np.testing.assert_allclose(r.outputs["image"][0], solo_cache(seed, steps), atol=TOL, rtol=0)


async def test_max_batch_bounds_the_running_set(engine, observed):
    batcher = make(engine, max_batch=2)
    task = await started(batcher)
    await asyncio.gather(*(batcher.submit(work(s, 4)) for s in range(5)))
    await finish(batcher, task)
    assert max(observed.calls) == 2
    assert sum(observed.calls) == 5 * 4


async def test_deadline_while_running_is_504_and_leaves_the_running_set(engine, observed):
    clock = FakeClock()  # the deadline passes when the test says, whatever the machine's pace
    batcher = IterationBatcher([engine], BatcherConfig(max_batch_size=4, max_queue_size=64), clock=clock)
    task = await started(batcher)
    keeper = asyncio.create_task(batcher.submit(work(1, 60, arrival=clock.now())))
    doomed = asyncio.create_task(
        batcher.submit(work(2, 500, arrival=clock.now(), deadline=clock.now() + 0.25))
    )
    await observed.wait_for(3)
    await clock.advance(0.249)
    assert not doomed.done()
    await clock.advance(0.001)
    with pytest.raises(DeadlineExceeded):
        await doomed
    at_expiry = len(observed.calls)
    await keeper
    await finish(batcher, task)
    calls = observed.calls
    assert calls[0] == 2  # it ran (both were admitted at the first iteration)...
    assert all(c == 1 for c in calls[at_expiry + 1 :])  # ...and left at the next iteration
    assert len(calls) < 100  # its 500 steps were not computed


@pytest.mark.parametrize("how", ["task", "server"])
async def test_cancelled_client_leaves_the_running_set(engine, observed, how):
    """The client goes away: its task is cancelled, or the server calls batcher.cancel."""
    batcher = make(engine)
    task = await started(batcher)
    keeper = asyncio.create_task(batcher.submit(work(1, 40)))
    item = work(2, 400)
    gone = asyncio.create_task(batcher.submit(item))
    await observed.wait_for(5)
    if how == "task":
        gone.cancel()
    else:
        batcher.cancel(item)
    at_cancel = len(observed.calls)
    with pytest.raises((asyncio.CancelledError, ClientGone)):
        await gone
    await keeper
    await finish(batcher, task)
    assert all(c == 1 for c in observed.calls[at_cancel + 1 :])
    assert len(observed.calls) == 40
    assert batcher.running_count == 0 and batcher.inflight == 0


async def test_queue_is_bounded(engine):
    batcher = make(engine, max_batch=1, queue=2)
    task = await started(batcher)
    running = asyncio.create_task(batcher.submit(work(1, 30)))
    await until(lambda: batcher.running_count == 1)  # admitted into the running set
    queued = [asyncio.create_task(batcher.submit(work(s, 1))) for s in (2, 3)]
    await until(lambda: len(batcher.queue) == 2)
    with pytest.raises(QueueFull):
        await batcher.submit(work(4, 1))
    await asyncio.gather(running, *queued)
    await finish(batcher, task)


async def test_bad_request_fails_alone(engine, solo_cache):
    batcher = make(engine)
    task = await started(batcher)
    good = asyncio.create_task(batcher.submit(work(5, 4)))
    bad = asyncio.create_task(batcher.submit(work(6, -2)))
    with pytest.raises(InvalidRequest):
        await bad
    np.testing.assert_allclose((await good).outputs["image"][0], solo_cache(5, 4), atol=TOL, rtol=0)
    await finish(batcher, task)


class FaultyEngine:
    """Fault injection around the real engine: any step that includes seed 666 raises."""

    def __init__(self, inner: DiffusionEngine) -> None:
        self.inner = inner
        self.name, self.inputs, self.outputs = inner.name, inner.inputs, inner.outputs
        self.max_batch_size = inner.max_batch_size
        self.start, self.finished, self.result = inner.start, inner.finished, inner.result

    def step(self, states) -> None:
        if any(s.seed == 666 for s in states):
            raise RuntimeError("injected fault")
        self.inner.step(states)

    def close(self) -> None:
        pass


async def test_a_failing_state_fails_alone(engine, solo_cache):
    batcher = IterationBatcher([FaultyEngine(engine)], BatcherConfig(max_batch_size=4))
    task = await started(batcher)
    good = asyncio.create_task(batcher.submit(work(7, 6)))
    bad = asyncio.create_task(batcher.submit(work(666, 6)))
    with pytest.raises(Exception, match="injected fault"):
        await bad
    np.testing.assert_allclose((await good).outputs["image"][0], solo_cache(7, 6), atol=TOL, rtol=0)
    after = await batcher.submit(work(8, 2))  # and the batcher keeps serving
    assert after.outputs["image"].shape == (1, 3, 32, 32)  # its one row, batch axis kept
    await finish(batcher, task)


async def test_an_observer_that_refuses_an_admission_fails_those_requests_and_the_loop_goes_on(engine):
    """Issue 26 point 5 on the iteration-level batcher: ``on_dispatch`` raising while the
    scheduler admits requests fails them (500 with the message), not the loop."""

    class RefusesOnce(NullObserver):
        refused = 0

        def on_dispatch(self, items, now):
            if not self.refused:
                self.refused += 1
                raise RuntimeError("observer bug at admission")

    batcher = make(engine, observer=RefusesOnce())
    task = await started(batcher)
    with pytest.raises(BatchFailed, match="observer bug at admission"):
        await asyncio.wait_for(batcher.submit(work(5, 2)), 30)
    after = await asyncio.wait_for(batcher.submit(work(6, 2)), 30)
    assert after.outputs["image"].shape == (1, 3, 32, 32)
    await finish(batcher, task)


async def test_every_iteration_reaches_the_observer_with_its_energy_record(engine):
    meter = JoulePerIteration()
    batcher = make(engine, observer=meter)
    task = await started(batcher)
    a = asyncio.create_task(batcher.submit(work(1, 8)))
    b = asyncio.create_task(batcher.submit(work(2, 4)))
    ra, rb = await a, await b
    await finish(batcher, task)
    assert meter.iterations == 8  # a's 8 steps; b's 4 ride in 4 of them
    assert [r.size for r in meter.reports] == [2, 2, 2, 2, 1, 1, 1, 1]
    assert all(r.energy.joules == 1.0 for r in meter.reports)
    assert ra.batch_size == 2 and rb.batch_size == 2  # mean occupancy: (4*2 + 4*1) / 8 rounds to 2


async def test_drain_finishes_running_and_queued_and_refuses_new(engine, solo_cache):
    batcher = make(engine, max_batch=2)
    task = await started(batcher)
    specs = [(20, 9), (21, 3), (22, 5), (23, 2), (24, 4)]
    futures = [asyncio.create_task(batcher.submit(work(s, n))) for s, n in specs]
    await until(lambda: batcher.running_count == 2 and len(batcher.queue) == 3)
    drain = asyncio.create_task(batcher.drain(timeout=60))
    await asyncio.sleep(0)
    with pytest.raises(Draining):
        await batcher.submit(work(99, 1))
    results = await asyncio.gather(*futures)
    await drain
    await task  # the loop ends once everything is answered
    for (seed, steps), r in zip(specs, results, strict=True):
        np.testing.assert_allclose(r.outputs["image"][0], solo_cache(seed, steps), atol=TOL, rtol=0)
    assert batcher.running_count == 0 and len(batcher.queue) == 0
    release(batcher)


async def test_drain_timeout_answers_what_is_left(engine):
    batcher = make(engine, max_batch=1)
    task = await started(batcher)
    running = asyncio.create_task(batcher.submit(work(1, 1000)))
    queued = asyncio.create_task(batcher.submit(work(2, 1000)))
    await until(lambda: batcher.running_count == 1 and len(batcher.queue) == 1)
    await batcher.drain(timeout=0.2)
    for f in (running, queued):
        with pytest.raises(Draining):
            await f
    await asyncio.wait_for(task, 10)  # the loop notices its running set is gone
    release(batcher)


async def test_concurrent_load_every_request_answered_once_with_its_own_image(engine, solo_cache):
    batcher = make(engine, max_batch=4, queue=16)
    task = await started(batcher)
    rng = np.random.default_rng(0)
    specs = [(int(s), int(n)) for s, n in zip(rng.integers(0, 5, 40), rng.integers(1, 6, 40), strict=True)]
    answers: list[Result | BaseException] = []

    async def client(seed: int, steps: int, delay: float):
        await asyncio.sleep(delay)
        try:
            answers.append(await batcher.submit(work(seed, steps)))
        except BaseException as exc:
            answers.append(exc)
        return answers[-1]

    arrivals = np.cumsum(rng.exponential(0.01, len(specs)))  # Poisson, ~100 requests/s
    outs = await asyncio.gather(*(client(s, n, float(t)) for (s, n), t in zip(specs, arrivals, strict=True)))
    await finish(batcher, task)
    assert len(answers) == len(specs)
    for (seed, steps), out in zip(specs, outs, strict=True):
        if isinstance(out, QueueFull):
            continue  # an explicit answer under overload
        assert isinstance(out, Result), out
        np.testing.assert_allclose(out.outputs["image"][0], solo_cache(seed, steps), atol=TOL, rtol=0)
    assert sum(isinstance(o, Result) for o in outs) >= len(specs) // 2
    assert batcher.inflight == 0 and batcher.running_count == 0


def test_continuous_on_a_step_engine_is_the_explicit_iteration_mapping(engine):
    assert ON_STEP_ENGINES == {"continuous": "iteration"}
    assert policy_for("continuous", engine) is IterationBatcher
    assert policy_for("iteration", engine) is IterationBatcher
    identity = IdentityEngine()
    assert policy_for("continuous", identity) is ContinuousBatcher  # one-shot engines keep it
    with pytest.raises(ValueError, match="needs a step engine"):
        policy_for("iteration", identity)
    with pytest.raises(ValueError, match="unknown batcher"):
        policy_for("nope", engine)


def test_build_batcher_reports_every_model_call_once_whichever_policy(engine):
    """The step observer is the batcher's one observer's ``on_step``, for iteration-level
    and request-level policies alike (no second attachment elsewhere)."""
    try:
        for name, expected in (("continuous", IterationBatcher), ("static", None), ("dynamic", None)):
            settings = Settings(model="tiny_unet", batcher=name, max_batch_size=4)
            registry = CollectorRegistry()
            observer = ServingObserver(
                ServingMetrics("tiny_unet", name, registry),
                iteration=IterationMetrics("tiny_unet", name, registry),
            )
            batcher = build_batcher(settings.batching_spec(), [engine], observer)
            assert isinstance(batcher, IterationBatcher) is (expected is IterationBatcher), name
            assert engine.step_observer == observer.on_step
            engine.step_observer(3, 0.01)
            labels = {"model": "tiny_unet", "batcher": name}
            assert registry.get_sample_value("wattserve_iterations_total", labels) == 1
            assert registry.get_sample_value("wattserve_iteration_state_steps_total", labels) == 3
    finally:
        engine.step_observer = None
