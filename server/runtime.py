"""The served model at run time: engines, batcher, metrics, readiness, lifecycle.

Routes talk only to this object, so a test can build one with any engine and drive it
without HTTP, and the app factory stays a thin wiring layer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from time import monotonic
from typing import Any

from batchers.base import Batcher
from batchers.factory import build_batcher
from batchers.types import RequestError, Result, WorkItem
from engines.base import Engine, warmup_sizes, zeros_batch
from server.metrics import ServingMetrics
from server.settings import Settings

log = logging.getLogger("wattserve.runtime")

EngineFactory = Callable[[Settings], Engine]


class ModelRuntime:
    """One model served by one batcher over ``settings.instances`` engine instances."""

    def __init__(
        self,
        settings: Settings,
        engine_factory: EngineFactory,
        metrics: ServingMetrics,
        batcher_hooks: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._engine_factory = engine_factory
        self.batcher_hooks: dict[str, Any] = dict(batcher_hooks or {})  # read by start()
        self.engine: Engine | None = None
        self.batcher: Batcher | None = None
        self.ready = False
        self.draining = False
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load every instance and warm it (off the event loop), then start batching."""
        engines: list[Engine] = []
        for _ in range(self.settings.instances):
            engines.append(await asyncio.to_thread(self._engine_factory, self.settings))
        self.engine = engines[0]
        if self.settings.warmup:
            await asyncio.gather(*(asyncio.to_thread(self._warm, e) for e in engines))
        hooks = dict(self.batcher_hooks)
        meter_for = hooks.pop("energy_meter_for", None)  # energy follows the engine's device
        if meter_for is not None:
            hooks["energy_meter"] = meter_for(str(self.engine.device))
        self.batcher = build_batcher(self.settings, engines, metrics=self.metrics, **hooks)
        self.metrics.watch(self.batcher)
        self._task = asyncio.create_task(self.batcher.run(), name="batcher")
        self.ready = True
        self.metrics.ready.set(1)
        log.info(
            "serving %s (%s on %s) with the %s batcher, max batch %d, %d instance(s)",
            self.engine.name, self.engine.platform, self.engine.device,
            self.settings.batcher, self.settings.max_batch_size, len(engines),
        )  # fmt: skip

    def _warm(self, engine: Engine) -> None:
        t0 = monotonic()
        sizes = warmup_sizes(min(engine.max_batch_size, self.settings.max_batch_size),
                             getattr(engine, "batch_sizes", None))  # fmt: skip
        warmup = getattr(engine, "warmup", None)  # engines whose zeros are no real request
        if warmup is not None:
            warmup(sizes)
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
            await self.batcher.drain(self.settings.drain_timeout_s)
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        await self.drain()
        if self.batcher is not None:
            await asyncio.to_thread(self.batcher.close)

    # ------------------------------------------------------------------ requests
    def make_item(self, inputs: dict[str, Any], priority: int, timeout_us: int | None) -> WorkItem:
        """Map Triton-style priority (0 = default) and timeout (µs) onto a work item.

        Raises ValueError (answered 400) for a bad priority or inputs the engine refuses."""
        s = self.settings
        if priority > s.priority_levels:
            raise ValueError(f"priority {priority} outside 0..{s.priority_levels}")
        validate = getattr(self.engine, "validate", None)  # model-specific checks (-> 400)
        if validate is not None:
            validate(inputs)
        level = priority or s.effective_default_priority
        now = monotonic()
        if timeout_us is not None:
            deadline: float | None = now + timeout_us / 1e6
        elif s.default_timeout_ms is not None:
            deadline = now + s.default_timeout_ms / 1e3
        else:
            deadline = None
        return WorkItem(inputs=inputs, priority=level, deadline=deadline, arrival=now)

    def cancel(self, items: Sequence[WorkItem]) -> None:
        """The client left: answer its items now; queued ones are never computed."""
        if self.batcher is not None:
            for item in items:
                self.batcher.cancel(item)

    async def infer(self, items: Sequence[WorkItem]) -> list[Result]:
        """Submit every row of one request; one outcome is counted per request."""
        assert self.batcher is not None
        started = monotonic()
        outcome = "success"
        try:
            if len(items) == 1:
                return [await self.batcher.submit(items[0])]
            tasks = [asyncio.ensure_future(self.batcher.submit(i)) for i in items]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:
                for task in tasks:  # one row failed: the request is answered, stop the rest
                    task.cancel()
                raise
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
            self.metrics.outcome[outcome].inc()
            if outcome == "success":
                self.metrics.request_latency.observe(monotonic() - started)
