"""Execution: one executor per engine instance, its thread, stacking, retries and scatter.

An engine instance is one engine and the one thread that may call it (``engine_thread``).
Its ``BatchExecutor`` runs a batch there: the items' rows are stacked in item order, the
model runs, the outputs are sliced back by offset (``run_batch``); when the whole batch
fails, each item is retried alone so one bad request fails alone. Then, still on the
thread, it asks the scheduler for the next batch the policy dispatches at once
(``Scheduler.ready_batch``) and starts it with no round trip through the event loop, while
the loop answers the batch just finished (``answer``). Only when the policy would wait
does the instance go back to the loop.

Invariants kept here: every computed item is answered from its own rows; a batch whose
worker broke (or whose dispatch the observer refused) fails only its own items.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import numpy as np
from wattserve.batchers.clock import REAL_CLOCK
from wattserve.batchers.engine_thread import EngineThread
from wattserve.batchers.observers import BatchObserver
from wattserve.batchers.types import BatchFailed, ItemState, RequestError, Result, WorkItem
from wattserve.engines.base import Engine, StacksItems, StepEngine
from wattserve.engines.request_engines import PadsRows, RunsRequests

log = logging.getLogger("wattserve.batcher")


@dataclass(slots=True)
class BatchOutcome:
    """What a worker thread hands back: the items it computed, per-item outputs or
    exceptions (same order), and the window."""

    items: list[WorkItem]
    per_item: Sequence[dict[str, np.ndarray] | BaseException]
    started: float
    finished: float
    energy: Any  # what the observer's on_batch_end returned (telemetry: a BatchSpan), or None
    padded: int
    rows: int = 0  # rows of the computed items (the batch size)
    input_s: float = 0.0  # gathering the items' inputs into the batch
    output_s: float = 0.0  # slicing the batch's outputs back into items
    null_rows: int = 0  # rows the model ran beyond the items' (PadsRows: idle slots' null requests)


def padded_size(n: int, batch_sizes: Sequence[int] | None) -> int:
    """The engine batch size a batch of ``n`` runs at (smallest bucket that holds it)."""
    if not batch_sizes:
        return n
    fitting = [b for b in batch_sizes if b >= n]
    return min(fitting) if fitting else n


def engine_thread(index: int, flush_denormal: bool = False) -> EngineThread:
    """The one thread that builds, warms and runs engine instance ``index``.

    One thread per engine for its whole life, not just for its batches: GNU OpenMP (torch's
    CPU thread pool) keeps a worker team per calling thread, and once the process holds more
    OpenMP threads than CPUs its workers stop spinning between parallel regions and sleep
    on a futex instead. An engine built on one thread and run on another left two teams on
    a 2-CPU machine: mobilenet_v2 at batch 1 took ~250 context switches per call instead of
    ~0.5 (see docs/architecture.md).

    ``flush_denormal``: the thread (and the OpenMP / ONNX Runtime threads it starts) reads
    and writes subnormal floats as zero (``engines.denormals``)."""
    if flush_denormal:
        from wattserve.engines.denormals import flush_denormals_on_this_thread

        return EngineThread(f"engine-{index}", initializer=flush_denormals_on_this_thread)
    return EngineThread(f"engine-{index}")


# What a policy drives: request-level policies an Engine (whole batches), the iteration-level
# one a StepEngine (one step of every state); both are closed by their EngineInstance.
AnyEngine = TypeVar("AnyEngine", bound=Engine | StepEngine)


class EngineInstance(Generic[AnyEngine]):
    """One engine and the single thread that may call it (``engine_thread``; the one it
    was built on, when the caller passes it)."""

    def __init__(self, engine: AnyEngine, index: int, executor: EngineThread | None = None) -> None:
        self.engine = engine
        self.index = index
        self.executor = executor if executor is not None else engine_thread(index)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.engine.close()


# Engine thread: the next batch the policy dispatches at once, and the error to answer it
# with (``Scheduler.ready_batch``).
NextReady = Callable[[], tuple[list[WorkItem], BaseException | None]]


class BatchExecutor:
    """One engine instance's executor: runs batches on its thread, chains ready ones, and
    posts each outcome to the event loop's ``done(executor, batch, outcome, error,
    continuing)`` (``continuing``: the thread has started the next batch already)."""

    def __init__(
        self,
        instance: EngineInstance[Engine],
        observer: BatchObserver,
        done: Callable[
            [BatchExecutor, list[WorkItem], BatchOutcome | None, BaseException | None, bool], None
        ],
        next_ready: NextReady | None = None,
        now: Callable[[], float] = REAL_CLOCK.now,
    ) -> None:
        """``now``: the batcher's clock (``batchers.clock``), read on the engine thread."""
        self.instance = instance
        self.observer = observer
        self.done = done
        self.next_ready = next_ready  # None: never chain (the loop forms every batch)
        self.now = now
        # an engine that takes a batch as its requests (Triton's Python backend), not stacked rows
        self.runs_requests = isinstance(instance.engine, RunsRequests)
        # an engine that forms its batch itself (ragged batching), not by stacking rows
        self.stacks = isinstance(instance.engine, StacksItems)

    def start(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        """Event loop: run ``batch`` on the instance's thread."""
        try:
            self.instance.executor.post(self._work, loop, batch)
        except RuntimeError as exc:  # executor shut down: fail this batch only
            self.done(self, batch, None, exc, False)

    def _work(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        """Engine thread: run ``batch``, then every batch the policy would dispatch at once,
        posting each outcome to the loop as it finishes."""
        engine = self.instance.engine
        error: BaseException | None = None
        while batch:
            outcome: BatchOutcome | None = None
            if error is None:
                try:
                    outcome = run_batch(
                        engine, batch, self.observer, self.runs_requests, self.now, self.stacks
                    )
                except BaseException as exc:  # the worker itself broke: fail this batch only
                    error = exc
            following: list[WorkItem] = []
            refused = None
            if error is None and self.next_ready is not None:
                try:
                    following, refused = self.next_ready()
                except Exception:  # never strand the batch just computed: the loop decides
                    log.exception("taking the next batch on the engine thread failed")
            try:
                loop.call_soon_threadsafe(self.done, self, batch, outcome, error, bool(following))
            except RuntimeError:  # the loop is closed: the server stopped, nobody waits
                log.debug("batch of %d finished after the event loop closed", len(batch))
                return
            batch, error = following, refused


def run_batch(
    engine: Engine,
    items: Sequence[WorkItem],
    observer: BatchObserver,
    runs_requests: bool = False,
    now: Callable[[], float] = REAL_CLOCK.now,
    stacks: bool = False,
) -> BatchOutcome:
    """Worker thread: stack, run, split. On failure retry items one by one, so one bad
    request fails alone rather than taking its neighbours with it. ``runs_requests``: the
    engine takes the batch as its requests (``RunsRequests``), each answered on its own.
    ``now``: the batcher's clock, so the batch's times are on the scale of its items'.
    ``stacks``: the engine forms the batch from the items' inputs itself (``StacksItems``)."""
    # Items answered after the batch was formed (deadline, client gone) are not computed.
    items = [item for item in items if item.state is ItemState.RUNNING]
    if not items:
        at = now()
        return BatchOutcome([], [], at, at, None, 0)
    started = now()
    mark = observer.on_batch_start()
    per_item: Sequence[dict[str, np.ndarray] | BaseException]
    energy = None
    input_s = output_s = 0.0
    rows = sum(item.rows for item in items)
    null_rows = 0
    try:
        try:
            if runs_requests:  # each request whole; its own answer or error, no retry
                runner = cast(RunsRequests, engine)
                requests = [(it.inputs, it.context, it.is_cancelled) for it in items]
                per_item = runner.run_requests(requests)
                if isinstance(runner, PadsRows):  # its null rows count in the batch's size
                    null_rows = runner.rows_for(requests) - rows
            else:
                batch = _stack(engine, items, stacks)
                gathered = now()
                outputs = engine.infer(batch)
                computed = now()
                per_item = _split(outputs, items)
                input_s, output_s = gathered - started, now() - computed
        except Exception as exc:
            if len(items) == 1:
                per_item = [exc]
            else:
                log.warning("batch of %d failed (%s); retrying items one by one", len(items), exc)
                per_item = [_run_alone(engine, item, stacks) for item in items]
    finally:  # keep the meter's busy/idle books balanced whatever happened
        energy = observer.on_batch_end(mark)
    finished = now()
    padded = padded_size(rows, engine.batch_sizes) - rows
    return BatchOutcome(
        list(items), per_item, started, finished, energy, padded, rows, input_s, output_s, null_rows
    )


def answer(outcome: BatchOutcome) -> None:
    """Event loop: answer every computed item from its own rows (or its own failure)."""
    n = outcome.rows
    compute_s = outcome.finished - outcome.started
    for item, out in zip(outcome.items, outcome.per_item, strict=True):
        if isinstance(out, BaseException):  # a model's own error keeps its message and kind
            item.finish(
                error=out if isinstance(out, RequestError) else BatchFailed(f"inference failed: {out}")
            )
            continue
        item.finish(
            Result(
                outputs=out,
                queue_time_s=outcome.started - item.arrival,
                compute_time_s=compute_s,
                batch_size=n,
                input_s=outcome.input_s,
                output_s=outcome.output_s,
            )
        )


def _run_alone(engine: Engine, item: WorkItem, stacks: bool = False) -> dict[str, np.ndarray] | BaseException:
    try:
        return _split(engine.infer(_stack(engine, [item], stacks)), [item])[0]
    except Exception as exc:
        return exc


def _stack(engine: Engine, items: Sequence[WorkItem], stacks: bool = False) -> dict[str, np.ndarray]:
    """The batch: each input's rows, item after item (a lone item's arrays as they are).
    An optional input a request left out is absent; a batch's requests all have the same
    inputs (their batch key says which). ``stacks``: the engine forms it (ragged batching)."""
    if stacks:
        return cast(StacksItems, engine).stack_items([it.inputs for it in items])
    inputs = items[0].inputs
    names = [spec.name for spec in engine.inputs if spec.name in inputs]
    if len(items) == 1:
        return {name: inputs[name] for name in names}
    return {name: np.concatenate([it.inputs[name] for it in items]) for name in names}


def _split(outputs: dict[str, np.ndarray], items: Sequence[WorkItem]) -> list[dict[str, np.ndarray]]:
    """Each item's own rows of every output, by offset (views, no copy)."""
    rows = sum(item.rows for item in items)
    for name, value in outputs.items():
        if len(value) != rows:
            raise BatchFailed(f"engine returned {len(value)} rows of {name!r} for {rows} rows")
    if len(items) == 1:
        return [outputs]
    per_item = []
    start = 0
    for item in items:
        end = start + item.rows
        per_item.append({name: value[start:end] for name, value in outputs.items()})
        start = end
    return per_item
