"""continuous for step engines: the batch is re-formed before every model call.

Each engine instance keeps a running set (vLLM-style plain data: ``running`` here, the
shared ``queue`` for waiting). One iteration, every time:

1. drop states whose request was answered meanwhile (deadline -> 504, client gone);
2. admit queued requests, highest priority first, up to ``max_batch_size`` running;
3. on the instance's worker thread: ``engine.start`` the admitted ones, ``engine.step``
   everything running (one batched model call, each state at its own timestep), and
   ``engine.result`` of every state that has finished;
4. back on the event loop: answer the finished requests at once; the rest run on.

So an arrival never waits for a whole batch to finish: it joins at the next iteration.

Per-request figures in its Result:
- ``queue_time_s``: arrival to admission into the running set;
- ``compute_time_s``: its own time in the running set (start of its first iteration to
  the end of its last);
- ``batch_size``: its mean occupancy, i.e. the mean number of states in the model calls it
  rode in, rounded to the nearest integer (at least 1);
- ``energy_j``: the sum over its iterations of (iteration energy / states in that
  iteration); None if any of its iterations had no measurement.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import numpy as np
from wattserve.batchers.base import Batcher, BatcherConfig, EngineInstance
from wattserve.batchers.iteration_metrics import (
    IterationMetrics,
    attach_iteration_metrics,
    iteration_metrics_for,
)
from wattserve.batchers.types import BatchFailed, Draining, ItemState, RequestError, Result, WorkItem
from wattserve.engines.base import StepEngine

log = logging.getLogger("wattserve.batcher.iteration")


class InvalidRequest(RequestError):
    """The engine refused the request's inputs when starting it (bad seed, steps...)."""

    status_code = 400
    outcome = "bad_request"


@dataclass(eq=False, slots=True)
class Running:
    """One request in a running set, and what it has cost so far."""

    item: WorkItem
    state: Any
    joined: float  # start of its first iteration
    steps: int = 0
    occupancy_sum: int = 0
    energy_j: float = 0.0
    energy_measured: bool = True


@dataclass(slots=True)
class Iteration:
    """What one worker-thread iteration hands back to the event loop."""

    active: list[Running]  # every state that was stepped (running first, then admitted)
    refused: list[tuple[WorkItem, BaseException]]  # start() failed
    errors: dict[int, BaseException]  # index in active -> its step/result failure
    results: dict[int, dict[str, np.ndarray]]  # index in active -> outputs of finished states
    started: float
    finished: float
    energy: Any  # has .joules, or None


@dataclass
class _Instance:
    """An engine instance and its running set."""

    inst: EngineInstance
    running: list[Running] = field(default_factory=list)
    admitting: list[WorkItem] = field(default_factory=list)  # taken, start() not yet returned


class IterationBatcher(Batcher):
    """Iteration-level continuous batching for a StepEngine (name: continuous)."""

    name = "continuous"

    def __init__(
        self,
        engines: Sequence[StepEngine],
        config: BatcherConfig,
        *,
        iteration_metrics: IterationMetrics | None = None,
        **hooks: Any,
    ) -> None:
        super().__init__(engines, config, **hooks)  # type: ignore[arg-type]
        for engine in engines:
            if not isinstance(engine, StepEngine):
                raise TypeError(f"{type(engine).__name__} is not a StepEngine")
        if iteration_metrics is None and self.metrics is not None:
            iteration_metrics = iteration_metrics_for(self.metrics, self.engine.name, self.name)
        self.iteration_metrics = iteration_metrics
        if iteration_metrics is not None:
            attach_iteration_metrics(engines, iteration_metrics)
        self._changed = asyncio.Event()
        self._slots = [_Instance(inst) for inst in self.instances]

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        """One iteration loop per engine instance, all fed from the one queue."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        try:
            await asyncio.gather(*(self._serve(slot) for slot in self._slots))
        finally:
            self._stopped.set()

    @property
    def running_count(self) -> int:
        return sum(len(s.running) + len(s.admitting) for s in self._slots)

    async def _serve(self, slot: _Instance) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                slot.running = [r for r in slot.running if r.item.state is ItemState.RUNNING]
                if not slot.running and not await self._wait_for_work():
                    return  # draining, nothing queued, nothing running
                admitted = self.take(self.config.max_batch_size - len(slot.running))  # -> running
                slot.admitting = admitted
                self._set_running_gauge()
                if not slot.running and not admitted:
                    continue  # everything queued was answered meanwhile
                running = list(slot.running)
                try:
                    it = await loop.run_in_executor(
                        slot.inst.executor, self.iterate, slot.inst.engine, running, admitted
                    )
                except Exception as exc:  # the worker itself broke: fail this iteration's requests
                    log.exception("iteration over %d states failed outside the engine", len(running))
                    self._fail_slot(slot, BatchFailed(f"iteration failed: {exc}"))
                    continue
                slot.admitting = []
                slot.running = self._settle(it)
                self._set_running_gauge()
        except asyncio.CancelledError:
            # Stopped without a drain (or after a drain timed out): answer what is left.
            self._fail_slot(slot, Draining("server stopped before this request finished"))
            raise

    async def _wait_for_work(self) -> bool:
        """Wait until something is queued (True) or a drain has emptied the queue (False)."""
        while not len(self.queue):
            if self.closing:
                return False
            self._changed.clear()
            await self._changed.wait()
        return True

    # ------------------------------------------------------------------ worker thread
    def iterate(self, engine: StepEngine, running: list[Running], admitted: list[WorkItem]) -> Iteration:
        """Worker thread: start the admitted, step everything, collect finished results.

        If the batched step fails, each state is retried alone (the engine leaves states
        unchanged when ``step`` raises), so one bad request fails alone.
        """
        meter = self.energy_meter
        started = monotonic()
        mark = meter.begin() if meter is not None else None
        refused: list[tuple[WorkItem, BaseException]] = []
        active = list(running)
        for item in admitted:
            try:
                active.append(Running(item, engine.start(item.inputs), joined=started))
            except Exception as exc:
                refused.append((item, exc))
        errors: dict[int, BaseException] = {}
        if active:
            try:
                engine.step([r.state for r in active])
            except Exception as exc:
                if len(active) == 1:
                    errors[0] = exc
                else:
                    log.warning("step of %d states failed (%s); retrying one by one", len(active), exc)
                    for i, r in enumerate(active):
                        try:
                            engine.step([r.state])
                        except Exception as one_exc:
                            errors[i] = one_exc
        results: dict[int, dict[str, np.ndarray]] = {}
        for i, r in enumerate(active):
            if i in errors:
                continue
            try:
                if engine.finished(r.state):
                    results[i] = engine.result(r.state)
            except Exception as exc:
                errors[i] = exc
        energy = meter.end(mark) if meter is not None else None
        return Iteration(active, refused, errors, results, started, monotonic(), energy)

    # ------------------------------------------------------------------ event loop
    def _settle(self, it: Iteration) -> list[Running]:
        """Account one iteration, answer finished and failed requests; return who runs on."""
        n = len(it.active)
        for item, exc in it.refused:
            err = InvalidRequest(str(exc)) if isinstance(exc, ValueError) else BatchFailed(str(exc))
            self._answer_error(item, err)
        if n == 0:
            return []
        compute_s = it.finished - it.started
        if self.metrics is not None:
            self.metrics.batch_size.observe(n)
            self.metrics.compute_time.observe(compute_s)
            self.metrics.executions.inc()
        if self.on_batch is not None:
            self.on_batch(n, it.energy)
        self.last_batch_at = it.finished
        joules = getattr(it.energy, "joules", None)  # None: final later, in metrics only
        share = joules / n if joules is not None else None
        keep: list[Running] = []
        for i, r in enumerate(it.active):
            r.steps += 1
            r.occupancy_sum += n
            if share is None:
                r.energy_measured = False
            else:
                r.energy_j += share
            item = r.item
            if item.state is not ItemState.RUNNING:
                continue  # answered meanwhile (deadline) or abandoned by its client: leaves now
            if i in it.errors:
                self._answer_error(item, BatchFailed(f"inference failed: {it.errors[i]}"))
            elif i in it.results:
                self._answer(r, it.results[i], it.finished)
            else:
                keep.append(r)
        return keep

    def _answer(self, r: Running, outputs: dict[str, np.ndarray], now: float) -> None:
        item = r.item
        assert item.dispatched_at is not None
        if self.metrics is not None:
            self.metrics.inferences.inc()
        if self.iteration_metrics is not None:
            self.iteration_metrics.time_to_result.observe(now - item.arrival)
        item.finish(
            Result(
                outputs=outputs,
                queue_time_s=item.dispatched_at - item.arrival,
                compute_time_s=now - r.joined,
                batch_size=max(1, round(r.occupancy_sum / r.steps)),
                energy_j=r.energy_j if r.energy_measured else None,
            )
        )

    def _queue_changed(self) -> None:
        super()._queue_changed()
        self._changed.set()

    def _set_running_gauge(self) -> None:
        if self.iteration_metrics is not None:
            self.iteration_metrics.running.set(self.running_count)

    async def drain(self, timeout: float | None = None) -> None:
        """Finish everything running and queued; on timeout, answer what is left (503)."""
        await super().drain(timeout)
        if self._stopped is not None and not self._stopped.is_set():
            for slot in self._slots:
                self._fail_slot(slot, Draining("server stopped before this request finished"))

    def _fail_slot(self, slot: _Instance, exc: RequestError) -> None:
        """Answer every request of one running set (and its admissions) with ``exc``."""
        for item in [*(r.item for r in slot.running), *slot.admitting]:
            self._answer_error(item, exc)
        slot.running, slot.admitting = [], []
        self._set_running_gauge()
