"""The served model at run time: engines, batcher, metrics, readiness, lifecycle.

The front ends find a model in the ``ModelSet`` (``admission.select``) and submit to the
runtime it returns; a test can build one with any engine and drive it without HTTP, and the
app factory stays a thin wiring layer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from time import monotonic
from typing import Any

import numpy as np
from wattserve.batchers.base import Batcher, RequestBatcher, engine_thread
from wattserve.batchers.clock import REAL_CLOCK, Clock, Timer
from wattserve.batchers.engine_thread import EngineThread
from wattserve.batchers.iteration_metrics import IterationMetrics
from wattserve.batchers.lm_metrics import LMMetrics
from wattserve.batchers.rate_limiter import Claim, RateLimiter
from wattserve.batchers.registry import build_batcher
from wattserve.batchers.types import Draining, QueueFull, RequestError, Result, WorkItem
from wattserve.engines.base import (
    Engine,
    PreparesInputs,
    StepEngine,
    ValidatesInputs,
    WarmsItself,
    warms_with_zeros,
    warmup_sizes,
    zeros_batch,
)
from wattserve.engines.request_engines import CallsModels, RunsRequests
from wattserve.server.core.request import InferRequest
from wattserve.server.extensions.classification import ClassLabels
from wattserve.server.models.batch_observer import ServingObserver
from wattserve.server.models.metrics import ServingMetrics, request_protocol
from wattserve.server.models.plan import EngineFactory
from wattserve.server.models.request_books import SuccessBooks
from wattserve.server.models.response_cache import ResponseCache, request_key
from wattserve.server.models.serving_config import ServingConfig

log = logging.getLogger("wattserve.runtime")

__all__ = ["EngineFactory", "ModelRuntime"]


class ModelRuntime:
    """One model version served by its own batcher over its own engine instances.

    Nothing is shared with other models' runtimes but the event loop: each has its queue,
    its batching loop task and one thread per engine instance.
    """

    def __init__(
        self,
        serving: ServingConfig,
        engine_factory: EngineFactory,
        metrics: ServingMetrics,
        batcher_hooks: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        version: str = "1",
        batching: bool = True,
        platform: str | None = None,
        config: Any = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        """``clock``: the batcher's, and its work items' arrivals and deadlines (``batchers.clock``)."""
        self.serving = serving  # this model's typed configuration, built once (its plan's)
        self.name = name or serving.engine.model
        self.version = version
        self.batching = batching  # False: Triton's max_batch_size 0 (no batch axis in requests)
        # Largest batch a request may carry (codec); 0 when requests carry no batch axis.
        self.request_max_batch = serving.max_batch_size if batching else 0
        self.devices = list(serving.devices)
        self.queue_policy = serving.queue  # read per request (make_item, work_item)
        # priority_queue_policy levels with a queue bound of their own (most models: none, so
        # the per-request check is one empty-dict test)
        self._level_bounds = {
            level: p.max_queue_size for level, p in serving.queue.levels.items() if p.max_queue_size
        }
        self.priority_levels = serving.batching.priority_levels
        self.platform = platform
        self.config = config  # parsed ModelConfig when served from a repository
        self.class_labels: ClassLabels | None = None  # outputs' label files (classification)
        self.metrics = metrics
        self.books = SuccessBooks(metrics)  # submit_nowait's successes, counted once per loop turn
        self.clock = clock
        self._now = clock.now
        self._engine_factory = engine_factory
        # read by start(): "energy_meter_for" (device -> meter), "on_batch" (size, energy)
        self.batcher_hooks: dict[str, Any] = dict(batcher_hooks or {})
        self.engine: Engine | None = None
        self.batcher: Batcher | None = None
        self._validate: Any = None  # the engine's own input checks (ValidatesInputs), if any
        self._prepare: Any = None  # the engine fills optional inputs, keys batches (PreparesInputs)
        self._one_row = False  # a step engine: one row per request (its state is one row)
        self._variable: list[str] | None = None  # inputs with -1 dims: their shapes key batches
        self._optional: list[str] | None = None  # optional inputs: which are present keys batches
        self._last_answer: asyncio.Future[None] | None = None  # preserve_ordering: the latest request's turn
        self._collector: Any = None  # the batcher's own Prometheus collector, if any
        # the server's response cache when this model's config enables it (set by the app)
        self.response_cache: ResponseCache | None = None
        self._batch_observer: ServingObserver | None = None  # watches the batcher for the gauges
        self.ready = False
        self.draining = False
        self._task: asyncio.Task[None] | None = None
        self._claims: list[Claim | None] = []  # this model's instances' rate limiter claims

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load every instance and warm it on the thread that will run its batches (see
        ``engine_thread``), off the event loop, then start batching."""
        loop = asyncio.get_running_loop()
        engines: list[Engine] = []
        threads: list[EngineThread] = []
        try:
            for index, device in enumerate(self.devices):
                engine_config = self.serving.engine.on(device)
                threads.append(engine_thread(index, engine_config.flush_denormal))
                engines.append(await loop.run_in_executor(threads[-1], self._engine_factory, engine_config))
            if self.serving.warmup and warms_with_zeros(engines[0].inputs):
                await asyncio.gather(
                    *(loop.run_in_executor(t, self._warm, e) for t, e in zip(threads, engines, strict=True))
                )
            bind_models(engines, self.batcher_hooks.get("call_model"), loop)
            observer = self._observer(engines[0])
            # e.g. iteration needs a step engine
            batcher = build_batcher(self.serving.batching, engines, observer, threads, self.clock)
            self._rate_limit(batcher, engines)
            await batcher.prepare()  # e.g. adaptive times its batch sizes: before ready, not after
        except BaseException:
            self._withdraw()
            for thread, engine in zip(threads, engines, strict=False):  # a failed load frees what it built
                await loop.run_in_executor(thread, engine.close)
            for thread in threads:
                thread.shutdown(wait=False)
            raise
        self.engine, self.batcher = engines[0], batcher
        self._validate = self.engine.validate if isinstance(self.engine, ValidatesInputs) else None
        self._prepare = self.engine.prepare if isinstance(self.engine, PreparesInputs) else None
        self._one_row = isinstance(self.engine, StepEngine)
        if self._one_row and self.response_cache is not None:  # iterative (seeded, stepped): not cached
            log.warning("%s: response_cache is not used for a step (iteration-level) model", self.name)
            self.response_cache = None
        # a ragged input's shape keys no batch (Triton's allow_ragged_batch)
        variable = [spec.name for spec in self.engine.inputs if spec.variable and not spec.ragged]
        self._variable = variable or None
        self._optional = [spec.name for spec in self.engine.inputs if spec.optional] or None
        observer.watch(batcher)
        self._batch_observer = observer
        self._collector = batcher.collector(self.name)
        if self._collector is not None:
            self.metrics.registry.register(self._collector)
        self._task = asyncio.create_task(batcher.run(), name=f"batcher-{self.name}")
        self.ready = True
        self.metrics.ready.set(1)
        chosen = self.serving.batching.batcher
        policy = chosen if batcher.name == chosen else f"{chosen} ({batcher.name})"
        if batcher.name != self.serving.policy:  # an engine factory's step engine the plan did not foresee
            log.warning("%s: metrics are labelled batcher=%r but %r runs", self.name, self.serving.policy,
                        batcher.name)  # fmt: skip
        log.info(
            "serving %s v%s (%s on %s) with the %s batcher, max batch %d, %d instance(s)",
            self.name, self.version, self.engine.platform, self.engine.device,
            policy, self.serving.max_batch_size, len(engines),
        )  # fmt: skip

    def _rate_limit(self, batcher: Batcher, engines: Sequence[Engine]) -> None:
        """Triton's rate limiter: each instance's group's resources, claimed from the server's
        limiter (the ``rate_limiter`` hook, made by the app); nothing when it is off."""
        limiter: RateLimiter | None = self.batcher_hooks.get("rate_limiter")
        if limiter is None or not limiter.enabled or not self.serving.rate_limits:
            return
        claims: list[Claim | None] = []
        try:
            for i, (limits, engine) in enumerate(zip(self.serving.rate_limits, engines, strict=True)):
                claims.append(limiter.claim(limits, str(engine.device), f"{self.name} instance {i}"))
        except ValueError:  # Triton's refusal: this model fails to load, the pools as they were
            limiter.withdraw(claims)
            raise
        self._claims = claims
        if not any(claims):
            return
        if not isinstance(batcher, RequestBatcher):
            self._withdraw()
            raise ValueError(f"{self.name}: the rate limiter is not implemented for the {batcher.name} "
                             "batcher (iteration-level models)")  # fmt: skip
        batcher.use_rate_limiter(limiter, claims)
        for i, limits in enumerate(self.serving.rate_limits):
            if limits is not None:
                log.info("%s instance %d: rate limited (%s)", self.name, i, limits.describe())

    def _withdraw(self) -> None:
        """This model's instances leave the server's rate limiter (unloaded, or a failed load)."""
        limiter: RateLimiter | None = self.batcher_hooks.get("rate_limiter")
        if limiter is not None and self._claims:
            limiter.withdraw(self._claims)
        self._claims = []

    def _observer(self, engine: Engine) -> ServingObserver:
        """The batcher's one observer: this model's metrics (and iteration metrics for a step
        engine), the energy meter of the engine's device, telemetry's batch record."""
        meter_for = self.batcher_hooks.get("energy_meter_for")  # energy follows the engine's device
        iteration = None
        if isinstance(engine, StepEngine):  # occupancy of every model call, whichever policy batches
            iteration = IterationMetrics(self.name, self.serving.policy, self.metrics.registry)
        lm = None
        if getattr(engine, "streams_tokens", False):  # a language model: token figures
            lm = LMMetrics(self.name, self.serving.policy, self.metrics.registry)
        return ServingObserver(
            self.metrics,
            iteration=iteration,
            lm=lm,
            meter=meter_for(str(engine.device)) if meter_for is not None else None,
            record_batch=self.batcher_hooks.get("on_batch"),
        )

    def _warm(self, engine: Engine) -> None:
        t0 = monotonic()
        sizes = warmup_sizes(min(engine.max_batch_size, self.serving.max_batch_size), engine.batch_sizes)
        if isinstance(engine, WarmsItself):  # engines whose zeros are no real request
            engine.warmup(sizes)
        else:
            for size in sizes:
                engine.infer(zeros_batch(engine.inputs, size))
        log.info("warmed batch sizes %s in %.1fs", sizes, monotonic() - t0)

    async def drain(self) -> None:
        """Stop accepting (ready=false, new requests 503) and answer everything accepted."""
        if self.draining:
            return
        self.draining = True
        self.ready = False
        self.metrics.ready.set(0)
        if self.batcher is not None:
            await self.batcher.drain(self.serving.drain_timeout_s)
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        """Drain, then free the engines and their threads (also what unloading does)."""
        await self.drain()
        if self.batcher is not None:
            batcher, self.batcher = self.batcher, None
            if self._batch_observer is not None:
                self._batch_observer.unwatch()
                self._batch_observer = None
            await _close_off_loop(batcher)
            self._withdraw()
        if self._collector is not None:  # a reload registers its new batcher's own
            collector, self._collector = self._collector, None
            self.metrics.registry.unregister(collector)
        self.engine = None
        self._validate = None
        self._prepare = None
        self._one_row = False
        self._variable = None
        self._optional = None

    # ------------------------------------------------------------------ requests
    def make_item(self, request: InferRequest) -> WorkItem:
        """One work item for one whole request (Triton never splits a request): Triton-style
        priority (0 = default) and timeout (µs) mapped onto the item.

        Raises ValueError (answered 400) for a bad priority or inputs the engine refuses."""
        levels = self.priority_levels
        if request.priority > levels:
            raise ValueError(f"priority {request.priority} outside 0..{levels}")
        inputs = request.inputs
        if not request.batched:  # the batcher's items always carry the batch axis
            inputs = {name: value[np.newaxis] for name, value in inputs.items()}
        if self._one_row and request.rows != 1:
            raise ValueError(f"model {self.name!r} takes one row per request (a step model); got "
                             f"{request.rows}")  # fmt: skip
        if self._validate is not None:  # model-specific checks (-> 400), once per request
            self._validate(inputs)
        sequence = self.serving.sequence
        if sequence is not None:  # a stateful model: Triton's checks, its control inputs filled
            inputs = sequence.admit(request.sequence, request.rows, inputs)
        item = self._make_item(request, inputs)
        item.sequence = request.sequence
        if self.response_cache is not None:
            item.cache_key = self._cache_key(request)
        return item

    def _cache_key(self, request: InferRequest) -> bytes | None:
        """The request's response-cache key, or None when it is not cached: no cache, or the
        request carries its own parameters, a response (or token) stream or a sequence (each may change the
        answer)."""
        if (request.parameters or request.response_sink is not None or request.token_sink is not None
                or request.sequence is not None):  # fmt: skip
            return None
        return request_key(self.name, self.version, request.inputs, request.outputs)

    def _make_item(self, request: InferRequest, inputs: dict[str, Any]) -> WorkItem:
        if self._prepare is not None:  # optional inputs filled in; the engine's batch key
            inputs, key = self._prepare(inputs)
            item = self.work_item(inputs, request.priority, request.timeout_us)
            item.shape_key = key
            item.context = request  # a streaming request's token sink (language models)
            return item
        item = self.work_item(inputs, request.priority, request.timeout_us)
        item.rows = request.rows
        item.context = request  # id, requested outputs: for engines that take requests
        if self._variable is not None:  # only same-shape requests share a batch
            item.shape_key = tuple(inputs[n].shape[1:] if n in inputs else None for n in self._variable)
        if self._optional is not None:  # ... and the same optional inputs present
            present = tuple(name in inputs for name in self._optional)
            item.shape_key = (item.shape_key, present) if item.shape_key is not None else present
        return item

    def work_item(self, inputs: dict[str, Any], priority: int, timeout_us: int | None) -> WorkItem:
        """A one-row work item (``inputs`` with the batch axis) with Triton's priority and
        timeout: the deadline is the default timeout, shortened by the request's own."""
        level = priority or self.queue_policy.default_priority
        s = self.queue_policy.at(level)  # the level's own policy (priority_queue_policy), else the default
        now = self._now()  # the batcher's clock: its deadline timer and queue bound read the same
        default_s = s.default_timeout_ms / 1e3 if s.default_timeout_ms is not None else None
        if timeout_us is not None and s.allow_timeout_override:
            timeout_s = timeout_us / 1e6  # Triton: an override may shorten the default, not extend it
            deadline: float | None = now + (min(timeout_s, default_s) if default_s else timeout_s)
        elif default_s is not None:
            deadline = now + default_s
        else:
            deadline = None
        delay = deadline is not None and s.timeout_action == "delay"
        return WorkItem(inputs=inputs, priority=level, deadline=deadline, arrival=now, delay_on_timeout=delay)

    def cancel(self, item: WorkItem) -> None:
        """The client left: answer its item now; a queued one is never computed."""
        if self.batcher is not None:
            self.batcher.cancel(item)

    async def infer(self, item: WorkItem) -> Result:
        """Submit one request's work item; its one outcome is counted. With Triton's
        ``preserve_ordering`` an answer (result or error) leaves only after the answer of the
        request that came before it."""
        if not self.serving.preserve_ordering:
            return await self._infer(item)
        previous, mine = self._last_answer, asyncio.get_running_loop().create_future()
        self._last_answer = mine
        try:
            result = await self._infer(item)
        except asyncio.CancelledError:  # the client left: the next waits for the one before
            _release_after(previous, mine)
            raise
        except BaseException:
            await _wait_turn(previous, mine)
            raise
        await _wait_turn(previous, mine)
        return result

    def submit_nowait(self, item: WorkItem, answer: AnswerCallback, protocol: str = "http") -> bool:
        """``infer`` without a coroutine, a future or a task per request, for a caller with
        many requests (the engine core behind front-end processes, ``server.split``): queue
        the item now; its one outcome is counted (under ``protocol``) and ``answer(result,
        error)`` called on the event loop the moment the batcher answers it. False, with
        nothing done, for a model whose ``infer`` does more than queue (response cache,
        preserve_ordering, per-level queue bounds, a batcher whose submit does more than
        queue, as the sequence batcher's): await ``infer`` for those. Raises the refusals
        ``infer`` raises before queueing."""
        if self.response_cache is not None or self.serving.preserve_ordering or self._level_bounds:
            return False
        batcher = self.batcher
        if batcher is None:  # unloaded between admission and submit
            raise Draining(f"model {self.name!r} is unloading")
        if type(batcher).submit is not Batcher.submit:  # e.g. a sequence's turn is awaited first
            return False
        pending = NowaitAnswer(self, batcher, protocol, answer, item.requests)
        try:
            pending.timer = batcher.enqueue(item, pending)
        except RequestError as exc:  # refused at the door (queue full, draining): counted as
            self.metrics.outcomes(protocol)[exc.outcome].inc(item.requests)  # as admission counts a refusal
            raise
        return True

    def groups_requests(self) -> bool:
        """Whether a front end may send several one-row requests as one multi-row item (a
        group, ``server.split.core_client``): nothing in this model treats a request by itself
        (no response cache, ordering, per-level bound, sequence, request-taking engine,
        variable or optional inputs), ``submit_nowait`` queues it, and requests batch."""
        batcher = self.batcher
        return (
            self.request_max_batch > 1
            and batcher is not None
            and type(batcher).submit is Batcher.submit
            and self.response_cache is None
            and not self.serving.preserve_ordering
            and not self._level_bounds
            and self.serving.sequence is None
            and self._prepare is None
            and self._variable is None
            and self._optional is None
            and not self._one_row
            and not isinstance(self.engine, RunsRequests)
        )

    async def _infer(self, item: WorkItem) -> Result:
        if self.batcher is None:  # unloaded between admission and submit
            raise Draining(f"model {self.name!r} is unloading")
        started = monotonic()
        cache, key = self.response_cache, item.cache_key
        lookup_s = 0.0
        if cache is not None and key is not None:
            outputs = cache.get(key)
            if outputs is not None:  # a hit: no queue, no engine
                hit = Result(outputs, 0.0, 0.0, 0)
                self.metrics.statistics.record_cache_hit(monotonic() - started)
                on_hit = self.batcher_hooks.get("on_cache_hit")
                if on_hit is not None:  # telemetry: an inference with no engine energy
                    on_hit(item.rows)
                self.record_outcome("success", started, hit)
                return hit
            lookup_s = monotonic() - started
        outcome = "success"
        result: Result | None = None
        try:
            bound = self._level_bounds.get(item.priority) if self._level_bounds else None
            if bound and self.batcher.queue.level_size(item.priority) >= bound:
                raise QueueFull(f"Exceeds maximum queue size (priority level {item.priority} holds {bound})")
            result = await self.batcher.submit(item)
            if cache is not None and key is not None:  # a miss: stored after success only
                self._store(cache, key, lookup_s, result)
            return result
        except RequestError as exc:
            outcome = exc.outcome
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            if result is None and cache is not None and key is not None:  # a miss that failed
                self.metrics.statistics.record_cache_miss(lookup_s)  # (nothing stored)
            self.record_outcome(outcome, started, result)

    def _store(self, cache: ResponseCache, key: bytes, lookup_s: float, result: Result) -> None:
        """Insert a computed answer; Triton's cache_miss time is the lookup plus the insert
        (the queue and compute between them are not cache time)."""
        t0 = monotonic()
        if not cache.put(key, result.outputs):  # Triton's words, then why
            log.error("Failed to insert key [%s] into response cache: %s: an answer over the cache's %d "
                      "bytes is not stored", key.hex(), self.name, cache.size)  # fmt: skip
        self.metrics.statistics.record_cache_miss(lookup_s + monotonic() - t0)

    def record_outcome(
        self, outcome: str, started: float, result: Result | None, protocol: str | None = None
    ) -> None:
        """One request's one outcome: counted, its latency and Triton's statistics recorded
        (an ensemble's runtime counts through here too). ``protocol``: the metrics' label,
        when the caller is not in the request's own context (the one it would be read from)."""
        metrics = self.metrics
        protocol = protocol or request_protocol.get()
        metrics.outcomes(protocol)[outcome].inc()
        elapsed = monotonic() - started
        if result is not None:
            metrics.latency(protocol).observe(elapsed)
            metrics.statistics.record_success(elapsed, result)
        elif outcome != "cancelled":
            metrics.statistics.record_failure(elapsed)


AnswerCallback = Callable[[Result | None, BaseException | None], None]


class NowaitAnswer:
    """One ``submit_nowait`` request's answer: the batcher answers it as it would a future
    (``batchers.types.Answering``), and it counts the outcome and calls the caller back at
    once, where a future would wake a waiter one loop turn later through a scheduled
    callback. A failing callback is logged, never raised into the batcher (the batch's
    other requests still get their answers). Answered off the loop's thread (a caller's
    bug, which an asyncio future would not survive either), it hops onto the loop first."""

    __slots__ = ("_done", "answer", "batcher", "loop", "protocol", "requests", "runtime", "started", "timer")

    def __init__(self, runtime: ModelRuntime, batcher: Batcher, protocol: str, answer: AnswerCallback,
                 requests: int = 1) -> None:  # fmt: skip
        self.runtime = runtime
        self.requests = requests  # client requests it answers (a front end's group: several)
        self.batcher = batcher
        self.protocol = protocol
        self.answer = answer
        self.started = monotonic()
        self.timer: Timer | None = None
        self.loop = asyncio.get_running_loop()
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Result, /) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException, /) -> None:
        self._finish(None, exception)

    def _finish(self, result: Result | None, error: BaseException | None) -> None:
        if self._done:
            return
        if asyncio._get_running_loop() is not self.loop:  # another thread: answer on the loop
            self.loop.call_soon_threadsafe(self._finish, result, error)
            return
        self._done = True
        self.batcher.release(self.timer)
        try:
            if error is None:  # counted at the end of this loop turn, with the batch's others
                assert result is not None
                self.runtime.books.add(self.protocol, monotonic() - self.started, result, self.requests)
            else:
                for _ in range(self.requests):
                    self.runtime.record_outcome(
                        getattr(error, "outcome", "error"), self.started, None, self.protocol
                    )
            self.answer(result, error)
        except Exception:
            log.exception("%s: answering a request failed", self.runtime.name)


async def _wait_turn(previous: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
    """preserve_ordering: wait until the request before this one is answered, then let the
    next one go."""
    try:
        if previous is not None and not previous.done():
            await asyncio.shield(previous)
    except asyncio.CancelledError:
        _release_after(previous, mine)
        raise
    _release_after(None, mine)


def _release_after(previous: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
    """Mark this request answered once ``previous`` is (now, if there is none)."""

    def release(_: object = None) -> None:
        if not mine.done():
            mine.set_result(None)

    if previous is None or previous.done():
        release()
    else:
        previous.add_done_callback(release)


def bind_models(engines: Sequence[Engine], make_caller: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Hand engines that call other models (BLS) the server's in-process door, bound to the
    loop (``make_caller(loop)``, from the app; engines never import server/)."""
    if make_caller is None:
        return
    for engine in engines:
        if isinstance(engine, CallsModels):
            engine.bind_models(make_caller(loop))


async def _close_off_loop(batcher: Batcher) -> None:
    """``batcher.close`` (joins its engine threads) on a thread of its own, awaited.

    Not ``asyncio.to_thread``: its worker still holds the call (and so the batcher and its
    engines) for a moment after the awaiting coroutine resumes, and an unload's
    ``freeze_heap`` then froze the model it had just unloaded, reference cycles and all,
    out of the collector's reach until the next load or unload (seen once in a full test
    run). A Thread drops its target
    when it ends, before ``join`` returns."""
    failed: list[BaseException] = []

    def close() -> None:
        try:
            batcher.close()
        except BaseException as exc:  # raised here, on the loop, as to_thread would
            failed.append(exc)

    closer = threading.Thread(target=close, name="close-batcher", daemon=True)
    closer.start()
    await asyncio.to_thread(closer.join)
    if failed:
        raise failed[0]
