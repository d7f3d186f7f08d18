"""iteration: iteration-level batching for step engines (diffusion), a scheduler.

Each engine instance keeps a running set; waiting requests are the shared queue. Every
iteration has three steps, in vLLM's shape:

1. ``schedule`` (pure, event loop): from (waiting, running, capacity), which running
   requests leave (answered meanwhile: deadline 504, client gone), which run on, and which
   waiting ones are admitted (highest priority first, FIFO within, up to ``max_batch_size``
   running);
2. ``execute`` (the instance's worker thread): ``engine.start`` the admitted, one
   ``engine.step`` over every running state (one batched model call, each state at its
   own timestep), ``engine.result`` of every state that has finished;
3. ``settle`` (event loop): answer the finished and failed requests at once; the rest run
   on into the next iteration.

So an arrival never waits for a whole batch to finish: it joins at the next iteration.
``WATTSERVE_BATCHER=continuous`` on a step engine picks this policy (``batchers.registry``).

Per-request figures in its Result:
- ``queue_time_s``: arrival to admission into the running set;
- ``compute_time_s``: its own time in the running set (start of its first iteration to
  the end of its last);
- ``batch_size``: its mean occupancy, i.e. the mean number of states in the model calls it
  rode in, rounded to the nearest integer (at least 1).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from wattserve.batchers.base import Batcher, BatcherConfig
from wattserve.batchers.executor import EngineInstance
from wattserve.batchers.observers import BatchReport
from wattserve.batchers.scheduler import DispatchFailed, fail
from wattserve.batchers.status import Status
from wattserve.batchers.types import BatchFailed, Draining, ItemState, RequestError, Result, WorkItem
from wattserve.engines.base import StepEngine

log = logging.getLogger("wattserve.batcher.iteration")


class InvalidRequest(RequestError):
    """The engine refused the request's inputs when starting it (bad seed, steps...)."""

    status = Status.INVALID_ARG
    outcome = "bad_request"


@dataclass(eq=False, slots=True)
class Running:
    """One request in a running set, and what it has cost so far."""

    item: WorkItem
    state: Any
    joined: float  # start of its first iteration
    steps: int = 0
    occupancy_sum: int = 0

    def account(self, occupancy: int) -> None:
        """One more iteration among ``occupancy`` states."""
        self.steps += 1
        self.occupancy_sum += occupancy


@dataclass(frozen=True, slots=True)
class Plan:
    """One iteration of one running set, decided before it runs."""

    running: list[Running]  # run on: their requests still wait for an answer
    admit: list[WorkItem]  # join at this iteration, in this order
    leave: list[Running]  # answered meanwhile (deadline, client gone): never stepped again

    @property
    def idle(self) -> bool:
        return not self.running and not self.admit


def schedule(waiting: Sequence[WorkItem], running: Sequence[Running], capacity: int) -> Plan:
    """The scheduling decision of one iteration, a pure function.

    ``waiting``: queued requests in the order the queue serves them (priority level, then
    arrival); ``running``: the instance's running set; ``capacity``: the most states one
    model call may hold (``max_batch_size``). Running requests already answered leave;
    the others keep their place (never preempted); waiting ones fill the room left.
    """
    keep = [r for r in running if r.item.state is ItemState.RUNNING]
    leave = [r for r in running if r.item.state is not ItemState.RUNNING]
    room = max(capacity - len(keep), 0)
    return Plan(keep, list(waiting[:room]), leave)


@dataclass(slots=True)
class Iteration:
    """What one execute step hands back to the event loop."""

    active: list[Running]  # every state that was stepped (running first, then admitted)
    refused: list[tuple[WorkItem, BaseException]]  # start() failed
    errors: dict[int, BaseException]  # index in active -> its step/result failure
    results: dict[int, dict[str, np.ndarray]]  # index in active -> outputs of finished states
    started: float
    finished: float
    energy: Any  # what the observer's on_batch_end returned


@dataclass
class _Instance:
    """An engine instance and its running set."""

    inst: EngineInstance[StepEngine]
    running: list[Running] = field(default_factory=list)
    admitting: list[WorkItem] = field(default_factory=list)  # taken, start() not yet returned


class IterationBatcher(Batcher[StepEngine]):
    """Iteration-level batching for a StepEngine: schedule, execute, settle, repeat."""

    name = "iteration"
    summary = "step engines only: the batch re-formed before every model call"
    step_engines_only = True

    def __init__(
        self,
        engines: Sequence[StepEngine],
        config: BatcherConfig,
        **hooks: Any,
    ) -> None:
        for engine in engines:
            if not isinstance(engine, StepEngine):
                raise TypeError(f"{type(engine).__name__} is not a StepEngine")
        super().__init__(engines, config, **hooks)
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
        capacity = self.config.max_batch_size
        try:
            while True:
                bound = self.queue_wait_bound_s
                if bound and not self.closing:
                    self.shed_overdue(self._now(), bound)
                plan = schedule(self.queue.peek(capacity), slot.running, capacity)
                slot.running = plan.running
                if plan.idle:
                    if plan.leave:  # nothing to run, but the leavers' resources go back now
                        leavers = [r.state for r in plan.leave]
                        await loop.run_in_executor(slot.inst.executor, _release, slot.inst.engine, leavers)
                    if not await self._wait_for_work():
                        return  # draining, nothing queued, nothing running
                    continue
                try:
                    admitted = self.take_items(len(plan.admit))  # the planned items: queued -> running
                except DispatchFailed as failed:  # the observer refused them: they fail alone
                    fail(failed.items, failed.error)
                    admitted = []
                slot.admitting = admitted
                if not slot.running and not admitted:
                    continue  # everything planned was answered meanwhile
                running = list(slot.running)
                try:
                    it = await loop.run_in_executor(
                        slot.inst.executor, self.execute, slot.inst.engine, running, admitted, plan.leave
                    )
                except Exception as exc:  # the worker itself broke: fail this iteration's requests
                    log.exception("iteration over %d states failed outside the engine", len(running))
                    _release(slot.inst.engine, [r.state for r in slot.running])
                    self._fail_slot(slot, BatchFailed(f"iteration failed: {exc}"))
                    continue
                slot.admitting = []
                slot.running = self.settle(it)
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
    def execute(
        self,
        engine: StepEngine,
        running: list[Running],
        admitted: list[WorkItem],
        leaving: Sequence[Running] = (),
    ) -> Iteration:
        """Worker thread: start the admitted, step everything, collect finished results.

        If the batched step fails, each state is retried alone (the engine leaves states
        unchanged when ``step`` raises), so one bad request fails alone. States that left
        (answered meanwhile) or failed give their engine resources back (``release``: a
        language model's KV blocks), on this thread, the only one that touches the engine.
        """
        _release(engine, [r.state for r in leaving])
        observer = self.observer
        started = self._now()
        mark = observer.on_batch_start()
        refused: list[tuple[WorkItem, BaseException]] = []
        active = list(running)
        for item in admitted:
            try:
                # a step engine's request is one row (the runtime refuses more): its state
                # starts from the row, and its result gets the batch axis back (_answer)
                state = engine.start(_row(item.inputs))
                if hasattr(state, "priority"):  # engines that rank their states (token scheduling)
                    state.priority = item.priority
                if hasattr(state, "context"):  # engines that stream to the front end (tokens)
                    state.context = item.context
                if hasattr(state, "arrival"):  # engines that time their first output (TTFT)
                    state.arrival = item.arrival
                active.append(Running(item, state, joined=started))
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
        _release(engine, [active[i].state for i in errors])
        energy = observer.on_batch_end(mark)
        return Iteration(active, refused, errors, results, started, self._now(), energy)

    # ------------------------------------------------------------------ event loop
    def settle(self, it: Iteration) -> list[Running]:
        """Account one iteration, answer its finished and failed requests; return who runs on."""
        for item, exc in it.refused:
            err = InvalidRequest(str(exc)) if isinstance(exc, ValueError) else BatchFailed(str(exc))
            self._answer_error(item, err)
        n = len(it.active)
        if n == 0:
            return []
        keep: list[Running] = []
        failed: list[tuple[Running, BaseException]] = []
        done: list[tuple[Running, dict[str, np.ndarray]]] = []
        for i, r in enumerate(it.active):
            r.account(n)
            if r.item.state is not ItemState.RUNNING:
                # answered meanwhile (deadline) or abandoned by its client: never stepped
                # again; the next schedule lists it in ``leave`` (its engine resources freed)
                keep.append(r)
                continue
            if i in it.errors:
                failed.append((r, it.errors[i]))
            elif i in it.results:
                done.append((r, it.results[i]))
            else:
                keep.append(r)
        self.last_batch_at = it.finished
        ttr = tuple(it.finished - r.item.arrival for r, _ in done)
        try:
            self.observer.on_batch(BatchReport(n, it.started, it.finished, it.energy, time_to_result=ttr))
        except Exception:
            log.exception("batch observer failed; answering the iteration anyway")
        for r, exc in failed:
            self._answer_error(r.item, BatchFailed(f"inference failed: {exc}"))
        for r, outputs in done:
            self._answer(r, outputs, it.finished)
        return keep

    def _answer(self, r: Running, outputs: dict[str, np.ndarray], now: float) -> None:
        item = r.item
        assert item.dispatched_at is not None
        item.finish(
            Result(
                outputs={name: value[np.newaxis] for name, value in outputs.items()},
                queue_time_s=item.dispatched_at - item.arrival,
                compute_time_s=now - r.joined,
                batch_size=max(1, round(r.occupancy_sum / r.steps)),
            )
        )

    def _queue_changed(self) -> None:
        super()._queue_changed()
        self._changed.set()

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


def _release(engine: StepEngine, states: Sequence[Any]) -> None:
    """Hand states that will never be stepped again back to an engine that holds resources
    for them (``release(state)``, optional in the step contract)."""
    release = getattr(engine, "release", None)
    if release is None:
        return
    for state in states:
        try:
            release(state)
        except Exception:
            log.exception("releasing a state failed")


def _row(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A one-row request's inputs without the batch axis, as ``StepEngine.start`` takes them."""
    return {name: value[0] for name, value in inputs.items()}
