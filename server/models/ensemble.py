"""Triton ensembles served: one request runs a graph of other models' requests, in process.

An ensemble has no engine and no batcher of its own (Triton: "an ensemble model is not an
actual model"). ``EnsembleRuntime`` has the surface the front ends use of a ``ModelRuntime``
(``engine`` for the tensor specs, ``batcher`` for admission's room check, ``make_item``,
``infer``, ``cancel``, readiness, metrics), so admission, HTTP and gRPC serve it unchanged.

A request's steps run as soon as their inputs exist (steps that do not depend on each other
run concurrently); each step is a request to its model through the same admission path and
batcher a client's request takes (``server.core.inprocess``), so steps batch with the
model's other traffic, and intermediate tensors stay numpy arrays in this process. Like
Triton, a request for some outputs runs only the steps they need.

Statistics as Triton's ensemble scheduler reports them: each ensemble request is one
success (end to end) and one execution of its rows; its queue and compute phases are the
sums of its steps' phases (the composing requests report into the ensemble's statistics too).

With ``response_cache { enable: true }`` (and the server's cache), an ensemble's own
requests are cached as Triton's top-level ensemble requests are: a hit answers without
running any step (a cache hit, a success, no execution), a miss runs the graph and stores
the answer. A step's model that is decoupled makes the ensemble decoupled, and a decoupled
model's answers are not cached: such an ensemble fails to load with Triton's words.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from time import monotonic
from typing import Any

import numpy as np
from wattserve.batchers.status import Status
from wattserve.batchers.types import ClientGone, Draining, RequestError, Result, SequenceTag, WorkItem
from wattserve.engines.base import TensorSpec
from wattserve.server.core.admission import Refused, admit
from wattserve.server.core.inprocess import request_from_arrays
from wattserve.server.core.request import BadRequest, InferRequest
from wattserve.server.models.ensemble_graph import ModelView, Step, check_against_models, parse_graph
from wattserve.server.models.metrics import ServingMetrics
from wattserve.server.models.model_set import ModelSet, ModelState, UnknownModel
from wattserve.server.models.plan import ModelPlan
from wattserve.server.models.repository.config import ConfigError, read_config
from wattserve.server.models.repository.plan import config_tensors
from wattserve.server.models.response_cache import decoupled_cache_refusal
from wattserve.server.models.runtime import ModelRuntime

log = logging.getLogger("wattserve.ensemble")

PLATFORM = "ensemble"
WAIT_POLL_S = 0.02  # how often a loading ensemble looks at its composing models' states


class StepFailed(RequestError):
    """A step's request was refused or failed: the ensemble's request fails with its status
    kind and its message, prefixed by the ensemble and the step."""

    def __init__(self, message: str, status: Status, retry_after: bool) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.outcome = "bad_request" if status is Status.INVALID_ARG else "error"


class EnsembleSpecs:
    """What front ends read of ``runtime.engine``: the ensemble's tensors (its config's)."""

    platform = PLATFORM
    device = "cpu"
    batch_sizes = None

    def __init__(self, name: str, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch: int):
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.max_batch_size = max(1, max_batch)

    def close(self) -> None:
        pass


class EnsembleGate:
    """What admission and the metrics read of ``runtime.batcher``: no queue of its own (the
    steps queue at their models: Triton's pending count for an ensemble is 0), requests in
    flight, and the last time one ended (the idle trimmer's clock)."""

    queue_depth = 0

    def __init__(self) -> None:
        self.inflight = 0
        self.last_batch_at = 0.0
        self.idle = asyncio.Event()
        self.idle.set()

    def check_admission(self) -> None:
        """Room is decided by each step's model when the step is submitted."""


@dataclass(eq=False, slots=True)
class EnsembleItem(WorkItem):
    """An ensemble request in flight: the decoded request and the task running its graph."""

    request: InferRequest | None = None
    task: asyncio.Task[Result] | None = None
    gone: bool = False


class EnsembleRuntime(ModelRuntime):
    """One ensemble version. ``models``: the model set it belongs to (a getter: the set is
    built after its runtimes are planned)."""

    def __init__(self, plan: ModelPlan, metrics: ServingMetrics, models: Callable[[], ModelSet]) -> None:
        super().__init__(replace(plan.serving, devices=("cpu",)), _no_engine, metrics, name=plan.name,
                         version=plan.version, batching=plan.batching, platform=PLATFORM,
                         config=plan.config)  # fmt: skip
        self._models = models
        self.graph = parse_graph(plan.config, plan.name, plan.name)  # checked when planned; cheap to redo
        self.max_batch = plan.config.max_batch_size
        self._inputs, _ = config_tensors(plan.config.input, plan.name, "input")
        self._outputs, _ = config_tensors(plan.config.output, plan.name, "output")

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Wait for every composing model to be ready (loading it first in explicit mode, as
        Triton does), then check the graph against their tensors; ConfigError names the step."""
        models = self._models()
        if self.serving.response_cache:
            self._check_cacheable(models)
        runtimes: dict[tuple[str, str | None], ModelRuntime] = {}
        for step in self.graph.steps:
            key = (step.model, step.version)
            if key not in runtimes:
                runtimes[key] = await self._composing(models, step)
        views = {}
        for step in self.graph.steps:
            runtime = runtimes[(step.model, step.version)]
            engine = runtime.engine
            if engine is None:
                raise ConfigError(f"ensemble '{self.name}' depends on '{step.model}', which is unloading")
            views[step.index] = ModelView(
                step.model, engine.inputs, engine.outputs, runtime.request_max_batch
            )
        check_against_models(self.graph, self.max_batch, self._inputs, self._outputs, views)
        self.engine = EnsembleSpecs(self.name, self._inputs, self._outputs, self.max_batch)  # type: ignore[assignment]
        self.batcher = EnsembleGate()  # type: ignore[assignment]
        self.ready = True
        self.metrics.ready.set(1)
        log.info("serving ensemble %s v%s: %d step(s) over %s", self.name, self.version,
                 len(self.graph.steps), ", ".join(m for m, _ in self.graph.models()))  # fmt: skip

    def _check_cacheable(self, models: ModelSet) -> None:
        """A cached ensemble with a decoupled step's model is refused (Triton's rule: the step
        makes the ensemble decoupled), read from the repository before the model is loaded."""
        root = getattr(models.source, "root", None)
        for name, _ in self.graph.models():
            try:
                plan = models.lookup(name).plan
            except UnknownModel:
                plan = None
            config = plan.config if plan is not None else None
            if config is None and root is not None:
                try:
                    config = read_config(root / name)
                except ConfigError:
                    continue  # its own load says why
            if config is not None and config.model_transaction_policy.decoupled:
                why = f" (its step's model '{name}' is decoupled)"
                raise ConfigError(decoupled_cache_refusal(self.name, f"ensemble '{self.name}'", why))

    async def _composing(self, models: ModelSet, step: Step) -> ModelRuntime:
        name, version = step.model, step.version
        loaded = False
        while True:
            try:
                entry = models.lookup(name, version)
            except UnknownModel:
                if name in models.loaded_names():
                    raise ConfigError(f"ensemble '{self.name}' depends on '{name}' whose required version "
                                      f"{version} is not loaded ({step.label})") from None  # fmt: skip
                if name not in models.source.names():
                    raise ConfigError(f"ensemble {self.name} contains models that are not available or "
                                      f"ambiguous: {name} ({step.label})") from None  # fmt: skip
                entry = None
            if entry is not None and entry.plan is not None:
                self._check_no_cycle(models, name, [self.name])
            if entry is not None and entry.state is ModelState.READY and entry.runtime is not None:
                return entry.runtime
            if entry is not None and entry.state in (ModelState.LOADING, ModelState.UNLOADING):
                await asyncio.sleep(WAIT_POLL_S)
                continue
            reason = entry.reason if entry is not None else "not loaded"
            if models.mode == "explicit" and not loaded and reason in ("not loaded", "unloaded"):
                loaded = True
                await _load_dependency(models, name)
                continue
            raise ConfigError(f"ensemble '{self.name}' depends on '{name}', which is not available: "
                              f"{reason} ({step.label})")  # fmt: skip

    def _check_no_cycle(self, models: ModelSet, name: str, path: list[str]) -> None:
        """An ensemble among the composing models that leads back here would wait forever."""
        try:
            plan = models.lookup(name).plan
        except UnknownModel:
            return
        if plan is None or plan.platform != PLATFORM:
            return
        for step in plan.config.ensemble_scheduling.step:
            if step.model_name == self.name:
                chain = " -> ".join([self.name, "...", name, self.name])
                raise ConfigError(f"circular dependency between ensembles: {chain}")
            if step.model_name not in path:
                self._check_no_cycle(models, step.model_name, [*path, name])

    async def drain(self) -> None:
        """Stop accepting and wait for the requests in flight (their steps drain with their
        own models)."""
        if self.draining:
            return
        self.draining = True
        self.ready = False
        self.metrics.ready.set(0)
        gate = self.batcher
        if isinstance(gate, EnsembleGate) and gate.inflight:
            try:
                await asyncio.wait_for(gate.idle.wait(), self.serving.drain_timeout_s)
            except TimeoutError:
                log.warning("ensemble %s: %d request(s) still running after the drain timeout",
                            self.name, gate.inflight)  # fmt: skip

    async def stop(self) -> None:
        await self.drain()
        self.batcher = None
        self.engine = None

    # ------------------------------------------------------------------ requests
    def make_item(self, request: InferRequest) -> WorkItem:
        """The request as it is (its steps' models check priority and timeout)."""
        item = EnsembleItem(inputs=request.inputs, request=request)
        item.rows = request.rows
        if self.response_cache is not None:
            item.cache_key = self._cache_key(request)
        return item

    def cancel(self, item: WorkItem) -> None:
        """The client left: stop the graph; its queued steps are never computed."""
        if isinstance(item, EnsembleItem) and item.task is not None and not item.task.done():
            item.gone = True
            item.task.cancel()

    async def infer(self, item: WorkItem) -> Result:
        gate = self.batcher
        if not isinstance(gate, EnsembleGate) or not isinstance(item, EnsembleItem) or item.request is None:
            raise Draining(f"model {self.name!r} is unloading")
        started = monotonic()
        cache, key = self.response_cache, item.cache_key
        lookup_s = 0.0
        if cache is not None and key is not None:
            outputs = cache.get(key)
            if outputs is not None:  # a hit: no step runs (Triton: a hit, a success, no execution)
                hit = Result(outputs, 0.0, 0.0, 0)
                self.metrics.statistics.record_cache_hit(monotonic() - started)
                self.record_outcome("success", started, hit)
                return hit
            lookup_s = monotonic() - started
        gate.inflight += 1
        gate.idle.clear()
        outcome = "success"
        result: Result | None = None
        item.task = asyncio.ensure_future(self._run(item.request))
        try:
            result = await item.task
            if cache is not None and key is not None:  # a miss: stored after success only
                self._store(cache, key, lookup_s, result)
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            if item.gone:
                raise ClientGone("client disconnected") from None
            raise
        except RequestError as exc:
            outcome = exc.outcome
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            if result is None and cache is not None and key is not None:  # a miss that failed
                self.metrics.statistics.record_cache_miss(lookup_s)
            self.record_outcome(outcome, started, result)
            if result is not None:  # an ensemble's own execution: its rows, its steps' times
                self.metrics.statistics.record_batch(
                    item.rows, result.compute_time_s, None, result.input_s, result.output_s
                )
            gate.inflight -= 1
            gate.last_batch_at = monotonic()
            if not gate.inflight:
                gate.idle.set()

    async def _run(self, request: InferRequest) -> Result:
        """The graph for one request: every step whose inputs exist is submitted at once; each
        answer may make others ready. A failed step fails the request and stops the rest."""
        models = self._models()
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        # a tensor is settled once it exists or never will: an optional input the request left
        # out, an output its step did not produce; a step runs once all it reads is settled,
        # with the tensors that exist (Triton's: the absent ones feed optional model inputs)
        settled = set(self.graph.inputs) | set(tensors)
        waiting = list(self.graph.plan(request.outputs))
        running: dict[asyncio.Task[tuple[dict[str, np.ndarray], Result]], Step] = {}
        queue_s = input_s = infer_s = output_s = 0.0
        try:
            while waiting or running:
                for step in [s for s in waiting if all(t in settled for t in s.input_map.values())]:
                    waiting.remove(step)
                    inputs = {key: tensors[t] for key, t in step.input_map.items() if t in tensors}
                    running[asyncio.ensure_future(self._step(models, step, inputs, request))] = step
                if not running:  # cannot happen in a checked graph; never spin
                    raise StepFailed(f"in ensemble '{self.name}': steps {[s.index for s in waiting]} "
                                     "can never run", Status.INTERNAL, False)  # fmt: skip
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    outputs, result = task.result()  # a failed step raises here
                    for key, tensor in step.output_map.items():
                        settled.add(tensor)
                        if key in outputs:
                            tensors[tensor] = outputs[key]
                    queue_s += result.queue_time_s
                    input_s += result.input_s
                    output_s += result.output_s
                    infer_s += result.compute_time_s - result.input_s - result.output_s
        finally:
            for task in running:  # a failure or a cancel: the other steps are not needed
                task.cancel()
        names = [n for n in request.outputs or self.graph.outputs if n in tensors]  # absent: not answered
        # a Result's outputs carry the batch axis (the front ends drop it for unbatched requests)
        outputs = {n: tensors[n] if request.batched else tensors[n][np.newaxis] for n in names}
        return Result(outputs, queue_s, infer_s + input_s + output_s, request.rows, input_s, output_s)

    async def _step(
        self, models: ModelSet, step: Step, inputs: Mapping[str, np.ndarray], request: InferRequest
    ) -> tuple[dict[str, np.ndarray], Result]:
        """One step's request to its model, through admission and the model's own batcher."""
        wanted = list(step.output_map)

        async def decode(runtime: ModelRuntime, _source: Any) -> tuple[InferRequest, Any]:
            engine = runtime.engine
            if engine is None:
                raise BadRequest(f"model {step.model!r} is unloading", Status.UNAVAILABLE)
            args = (inputs, wanted, request.id, request.priority, request.timeout_us)
            step_request = request_from_arrays(runtime, engine, *args)
            tag = request.sequence
            if tag is not None:  # Triton passes the correlation ID and flags to every step
                step_request.sequence = SequenceTag(tag.correlation_id, start=tag.start, end=tag.end)
            return step_request, engine

        try:
            done = await admit(models, step.model, step.version, decode, None)
        except Refused as exc:
            raise StepFailed(f"in ensemble '{self.name}', {step.label}: {exc}", exc.status,
                             exc.retry_after) from None  # fmt: skip
        outputs = done.result.outputs  # a Python model may leave a requested output out
        if done.request.batched:
            return {k: outputs[k] for k in wanted if k in outputs}, done.result
        return {k: outputs[k][0] for k in wanted if k in outputs}, done.result

    # ------------------------------------------------------------------ documents
    def triton_config_doc(self) -> dict[str, Any]:
        """The configuration as Triton serves an ensemble's: its tensors and its steps."""

        def tensors(specs: list[TensorSpec]) -> list[dict[str, Any]]:
            datatype = {"BYTES": "TYPE_STRING"}
            return [{"name": s.name, "data_type": datatype.get(s.datatype, f"TYPE_{s.datatype}"),
                     "dims": list(s.shape)} for s in specs]  # fmt: skip

        steps = [{"model_name": s.model, "model_version": int(s.version) if s.version else -1,
                  "input_map": dict(s.input_map), "output_map": dict(s.output_map)}
                 for s in self.graph.steps]  # fmt: skip
        return {
            "name": self.name,
            "platform": PLATFORM,
            "max_batch_size": self.max_batch,
            "input": tensors(self._inputs),
            "output": tensors(self._outputs),
            "ensemble_scheduling": {"step": steps},
            **({"response_cache": {"enable": True}} if self.response_cache is not None else {}),
        }


def _no_engine(_config: Any) -> Any:
    raise AssertionError("an ensemble has no engine")


# explicit mode: a composing model being loaded for some ensemble, shared by the others
_dependency_loads: weakref.WeakKeyDictionary[ModelSet, dict[str, asyncio.Task[Any]]] = (
    weakref.WeakKeyDictionary()
)


async def _load_dependency(models: ModelSet, name: str) -> None:
    loads = _dependency_loads.setdefault(models, {})
    task = loads.get(name)
    if task is None:
        log.info("loading %s: an ensemble being loaded is composed of it", name)
        task = loads[name] = asyncio.ensure_future(models.load(name))
        task.add_done_callback(lambda _t: loads.pop(name, None))
    try:
        await asyncio.shield(task)
    except Exception as exc:  # its entry now says why; the caller reads it
        log.warning("loading %s for an ensemble failed: %s", name, exc)


def ensemble_runtime(plan: ModelPlan, registry: Any, models: Callable[[], ModelSet]) -> EnsembleRuntime:
    """The runtime of an ensemble plan (the app's ``make_runtime`` for ``platform: ensemble``)."""
    return EnsembleRuntime(plan, ServingMetrics(plan.name, PLATFORM, registry), models)
