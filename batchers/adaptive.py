"""adaptive: meet a latency objective (pXX <= T) with the fewest engine-seconds per request.

Two learned models and one pure decision (``batchers.adaptive_decision.decide``):

- ``CostModel``: engine seconds per batch size, seeded by timing one batch of each size
  right after warm-up, then updated from every executed batch; and joules per batch where
  the energy meter measures, taken when the batch's counter window closes (one counter step
  after it ran: the batch's energy record is kept until then), with the device's idle power.
  Once ``MIN_METERED`` batches were metered the decision optimizes joules per request
  (idle energy included, see ``adaptive_decision``) instead of seconds;
  ``wattserve_adaptive_mode`` says which, and why (no meter, meter warming up, joules);
- ``ArrivalModel``: the arrival rate over a short and a long window;
- feedback from request latency itself (``slo_feedback``): the margin held back is the
  larger of the cost model's (compute error and hand-off) and ``LatencyMargin``'s (arrival
  to answer against what the plan expected for each request), and ``MissBackoff`` cuts how
  long a planned wait may hold a request when more requests missed lately than the
  percentile allows, then gives it back slowly, per band of offered load
  (``wattserve_adaptive_max_hold_seconds``).

Each time an engine instance is free, the loop asks ``decide`` whether to dispatch now or
wait for a bigger batch, and for how long at most; any arrival wakes it to ask again. With
``reject_late`` (off by default), requests that cannot meet the objective even if every
batch from now on is full get 503 + Retry-After at once instead of being served late;
either way every request's outcome against the objective is counted in metrics.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from time import monotonic
from typing import Any, NamedTuple

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from wattserve.batchers.adaptive_decision import (
    Ages,
    CostView,
    Objective,
    QueueState,
    allowed_cap,
    doomed,
    doomed_prefix,
    late_batch,
    offered_load,
    queueing_reserve,
    split_size,
)
from wattserve.batchers.adaptive_decision import Decision as AdaptiveDecision
from wattserve.batchers.adaptive_decision import decide as decide_batch
from wattserve.batchers.arrival_model import ArrivalModel
from wattserve.batchers.base import BatchOutcome, padded_size
from wattserve.batchers.clock import Timer
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.cost_model import CostModel, CostSnapshot
from wattserve.batchers.observers import measured_joules
from wattserve.batchers.policy import Decision, Delay, Dispatch, QueueView, Wait
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.slo_feedback import LatencyMargin, MissBackoff, outcomes
from wattserve.batchers.slo_policy import SloBatcher, SloConfig, slo_config
from wattserve.batchers.types import Answering, ItemState, QueueFull, WorkItem
from wattserve.engines.base import Engine, WarmsItself, zeros_batch

_arrival = attrgetter("arrival")  # a queued WorkItem's arrival time

log = logging.getLogger("wattserve.batcher.adaptive")


MAX_PENDING_ENERGY = 4096  # batches awaiting their counter window (~1 s of 1 ms batches x 4)
MAX_WAITS_KEPT = 256  # planned waits awaiting their batch's answer
# The queueing reserve, in M/M/1 percentile waits (adaptive_decision, rule 5): one from
# the start, so that the first burst at a new, higher load finds some slack (the back-off
# learns only from misses), rising to two at the back-off's floor (a shared host's stalls
# and bursts come in episodes, which a queue of independent service times understates).
# Chosen on live pairs, the host replays and the simulation, not derived (docs/adaptive.md,
# "Simulation" and "Not done"; the sessions' runs are in its history): with half of one from
# the start (until the fourteenth session) waits at 200 req/s still held requests 30-40 ms
# just before a burst, which then missed live where a dynamic batcher's did not; one costs
# 2-7% engine time at 5-30% load in the simulation (half: 1-8% less).
CAUTION = (1.0, 2.0)


class SloUnreachable(QueueFull):
    """503 + Retry-After: the request could not meet the objective (counted as shed load)."""


@dataclass(frozen=True, slots=True)
class CostPlan:
    """What a decision reads of the learned models: one immutable snapshot, published whole
    by each learning step (``_publish``), so a decision on one thread never sees another
    thread's half-made update. ``full``: a full batch's dispatch (or its split, rule 8);
    ``cap``: the largest batch a wait may plan for (rule 4)."""

    view: CostView
    full: AdaptiveDecision
    cap: int


class Why(NamedTuple):
    """The adaptive decision behind a ``Dispatch`` or ``Wait`` (its ``note``), for
    ``observe``: when a planned wait is to end, and, for a batch that goes after one, its
    oldest arrival and how late the wait ended (for the latency margin)."""

    decision: AdaptiveDecision
    wait_until: float | None = None
    waited: tuple[float, float] | None = None


@dataclass
class AdaptiveConfig(SloConfig):
    headroom_s: float | None = None  # None: 10% of slo_s
    reject_late: bool = False
    late_last: bool = True  # requests that can no longer meet the objective run after the rest
    unit: str = "auto"  # "seconds": never decide in joules, whatever is metered
    calibrate: bool = True  # time one batch of each probed size before serving


def calibration_sizes(max_batch_size: int, engine_sizes: Sequence[int] | None) -> list[int]:
    """Sizes timed at start: the engine's own buckets, else powers of two and the maximum
    (the fit fills in the sizes between)."""
    if engine_sizes:
        return sorted({b for b in engine_sizes if 1 <= b <= max_batch_size})
    sizes = {1, max_batch_size}
    b = 2
    while b < max_batch_size:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


class AdaptiveBatcher(SloBatcher):
    name = "adaptive"
    summary = "meets slo_ms at the fewest engine-seconds, or joules where metered, per request"
    config: AdaptiveConfig

    def __init__(self, engines: Sequence[Engine], config: AdaptiveConfig, **kwargs: Any) -> None:
        super().__init__(engines, config, **kwargs)
        headroom = config.headroom_s if config.headroom_s is not None else 0.1 * config.slo_s
        self.objective = Objective(config.slo_s, config.percentile, headroom)
        self.latency = LatencyMargin(config.percentile)
        self.backoff = MissBackoff(config.percentile)  # how long a wait may hold a request
        self._wait_until: float | None = None  # when the last planned wait was to end
        # oldest arrival of a batch dispatched after a planned wait -> how late the wait
        # ended (0 when on time): lateness the plan did not expect, for the margin
        self._waits: dict[float, float] = {}
        self._prepared = False  # batch sizes timed (``prepare``), before ready or at ``run``
        self.costs = CostModel(config.max_batch_size, percentile=config.percentile)
        # (batch size, energy record) of batches whose joules are not final yet
        self._energy_pending: deque[tuple[int, Any]] = deque(maxlen=MAX_PENDING_ENERGY)
        self.energy_source: str | None = None  # the meter's source label, once a figure came
        self.arrivals = ArrivalModel()
        self.last_decision: AdaptiveDecision | None = None
        self._engine_sizes = self.engine.batch_sizes
        # the arrival windows are written on the loop (arrivals) and read by decisions on
        # the loop and on engine threads; reentrant, as a learning step may ask the rate
        self._arrivals_lock = threading.RLock()
        # learning (``batch_finished``, calibration) runs on the loop while engine threads
        # decide and scrapes read the cost model: one step at a time, each ending in a new
        # published plan
        self._learning = threading.Lock()
        self._plan = self._plan_from_models()
        self.pipeline = not config.reject_late  # shedding runs on the loop, before every decision
        self.late_last = config.late_last and not config.reject_late  # (rejecting them instead)
        self.delayed_total = 0  # requests moved behind the rest: they could not meet the objective
        self.sheds = config.reject_late

    @classmethod
    def config_from(cls, spec: BatchingSpec, engine: Engine) -> AdaptiveConfig:
        headroom = spec.slo_headroom_ms
        return AdaptiveConfig(
            **slo_config(spec),
            headroom_s=None if headroom is None else headroom / 1000.0,
            reject_late=spec.slo_reject,
            late_last=spec.slo_late_last,
            unit=spec.adaptive_unit,
        )

    # ------------------------------------------------------------------ the loop
    def enqueue(self, item: WorkItem, answer: Answering) -> Timer | None:
        with self._arrivals_lock:  # offered load, whether or not it is accepted
            self.arrivals.arrived(item.arrival)
        return super().enqueue(item, answer)

    async def prepare(self) -> None:
        """Time each probed batch size before the model reports ready (once)."""
        if self._prepared:
            return
        self._prepared = True
        if self.config.calibrate and not isinstance(self.engine, WarmsItself):
            try:  # engines with their own warm-up have no zeros request: they learn online
                await self._calibrate()
            except Exception:
                log.exception("adaptive: timing the batch sizes failed; learning from traffic only")

    async def run(self) -> None:
        await self.prepare()  # a no-op where the runtime prepared it before reporting ready
        await super().run()

    def decide(self, view: QueueView, now: float) -> Decision:
        """The pure decision (``adaptive_decision.decide``) over the queue, the published
        cost plan and the arrival rate; a full batch, or a drain, goes at once. Reads only:
        what it decided is recorded by ``observe``."""
        plan = self._plan
        full = self.config.max_batch_size
        queue = view.queue
        if self.late_last:
            moves = self._late_moves(queue, now, plan)
            if any(moves) or queue.delayed:
                then = self._decide_with_late(queue, now, plan, moves)
                return Delay(moves, then) if any(moves) else then
        queued = queue.head(full).rows
        if queued >= full:
            return Dispatch(plan.full.dispatch, note=Why(plan.full))
        if view.closing:
            return Dispatch(full, complete=False)
        oldest = queue.oldest_arrival()
        assert oldest is not None  # asked only with something queued
        with self._arrivals_lock:
            rate, sustained = self.arrivals.rate_and_long(now)
        load = offered_load(plan.view, sustained, plan.cap)  # the back-off's band: the steady load
        decision = decide_batch(
            QueueState(queued, now - oldest),
            plan.view,
            rate,
            self.objective,
            self.backoff.hold_s(self.objective.budget_s, load),
            sustained_rate=sustained,
            caution=self.backoff.caution(*CAUTION, load=load),
        )
        if decision.dispatch:  # a trade-off against waiting: formed on the loop
            wait_until = self._wait_until  # this batch waited: how late the wait ended
            waited = None if wait_until is None else (oldest, max(now - wait_until, 0.0))
            return Dispatch(decision.dispatch, complete=False, note=Why(decision, waited=waited))
        return Wait(decision.wait_s, note=Why(decision, wait_until=now + decision.wait_s))

    def observe(self, decision: Decision, now: float) -> None:
        """Record ``decision`` once applied (under the queue's lock, ``decide_once``): the
        requests it moved behind the rest, when its planned wait ends (a planned wait is
        over at the next decision either way), the decision for the metrics, and how late
        a wait ended for the batch that followed it."""
        if isinstance(decision, Delay):
            self.delayed_total += sum(decision.counts)
            decision = decision.then
        why = decision.note
        if not isinstance(why, Why):  # a drain's flush: no plan behind it
            self._wait_until = None
            return
        self._wait_until = why.wait_until
        self.last_decision = why.decision
        if why.waited is not None:
            if len(self._waits) >= MAX_WAITS_KEPT:
                self._waits.clear()
            oldest, lateness = why.waited
            self._waits[oldest] = lateness

    def _late_moves(self, queue: PriorityFifo, now: float, plan: CostPlan) -> tuple[int, ...]:
        """Rule 10 (``adaptive_decision.doomed_prefix``): per level, the fewest of the
        oldest requests to move behind the rest that lets every other one still meet the
        objective (those that cannot even alone among them). Only where every request is
        one row of one shape (any prefix of the queue is a batch); none otherwise."""
        if not queue.regular:
            return ()
        objective, batch, instances = self.objective, plan.full.dispatch, len(self.instances)

        def doomed(ahead: int, lane: Sequence[WorkItem]) -> int:
            return doomed_prefix(Ages(lane, now, _arrival), ahead, plan.view, objective, batch, instances)

        return queue.late_moves(doomed)

    def _decide_with_late(
        self, queue: PriorityFifo, now: float, plan: CostPlan, moves: Sequence[int]
    ) -> Dispatch:
        """Rule 10 (``adaptive_decision.late_batch``): with late requests queued (or about
        to be, by ``moves``), no wait."""
        with queue.lock:  # one consistent view of both lanes
            late = queue.delayed + sum(moves)
            oldest = queue.oldest_on_time(skip=moves)
            on_time = len(queue) - late
        age = None if oldest is None else now - oldest
        view = plan.view
        n = late_batch(on_time, late, age, view, self.objective)
        n = split_size(view.seconds, n, view.bias_s)  # rule 8 here too: the backlog drains faster
        why = Why(AdaptiveDecision(n, 0.0, n, "late queued"))
        return Dispatch(
            n, complete=n >= self.config.max_batch_size, note=why
        )  # full: an engine thread may chain it

    def shed(self, now: float) -> bool:
        """With ``reject_late``, before every decision on the loop: refuse (503) the queued
        requests that cannot meet the objective any more."""
        return self._reject_doomed(now)

    def energy_mode(self) -> tuple[str, str]:
        """The cost model's mode, unless the configuration asks for seconds."""
        if self.config.unit == "seconds":
            return "seconds", "configured"
        return self.costs.energy_mode()

    # ------------------------------------------------------------------ learning
    def cost_view(self) -> CostView:
        """The cost model as the decision sees it: by batch size, engine buckets applied."""
        return self._plan.view

    def _plan_from_models(self) -> CostPlan:
        """A new plan from the learned models (called with ``_learning`` held, or before
        the batcher serves)."""
        n = self.config.max_batch_size
        curve = self.costs.curve()
        mode, _ = self.energy_mode()
        joules = self.costs.joule_curve() if mode == "joules" else None
        sizes = [padded_size(b, self._engine_sizes) for b in range(n + 1)]
        sizes = [min(s, n) for s in sizes]
        seconds = np.maximum.accumulate(curve[sizes]).tolist()
        bias = self.costs.bias()
        first = split_size(seconds, n, bias)
        view = CostView(
            seconds=seconds,
            margin_s=max(self.costs.margin(), self.latency.margin()),
            bias_s=bias,
            joules=None if joules is None else np.maximum.accumulate(joules[sizes]).tolist(),
            idle_w=self.costs.idle_watts,
        )
        full = AdaptiveDecision(first, 0.0, first, "full" if first == n else "split")
        return CostPlan(view, full, allowed_cap(view, self.objective))

    def batch_finished(self, outcome: BatchOutcome) -> None:
        try:
            with self._learning:
                self._learn(outcome)
        except Exception:  # learning must never cost a request its answer
            log.exception("adaptive: cost model update failed; batch answered as usual")

    def _learn(self, outcome: BatchOutcome) -> None:
        now = self._now()
        batch = outcome.items
        if not any(isinstance(out, BaseException) for out in outcome.per_item):
            joules = measured_joules(outcome.energy)
            size = len(batch) + outcome.padded
            self._learn_latency(batch, size, outcome, now)
            self.costs.observe(size, outcome.finished - outcome.started, joules)
            if joules is None and outcome.energy is not None and hasattr(outcome.energy, "final"):
                self._energy_pending.append((size, outcome.energy))
            self._take_energy()
            # taken from the queue -> engine start, and engine end -> answers: every
            # request in the batch waits through both, so they belong in the margin
            dispatched = batch[0].dispatched_at or outcome.started
            self.costs.observe_overhead(max((outcome.started - dispatched) + (now - outcome.finished), 0.0))
            self._plan = self._plan_from_models()
        self.count_slo(batch, now)

    def queueing_reserve_s(self) -> float:
        """What a wait would keep back for queueing at the current arrival rate (a metric:
        the decision computes the same from its own inputs)."""
        with self._arrivals_lock:
            rate, sustained = self.arrivals.rate_and_long(self._now())
        plan = self._plan
        if plan.view.seconds[-1] <= 0:
            return 0.0
        caution = self.backoff.caution(
            *CAUTION, load=offered_load(plan.view, sustained, plan.cap)
        )  # as decide()
        return queueing_reserve(plan.view, max(rate, sustained), self.objective, plan.cap, caution)

    def current_load(self, now: float) -> float:
        """``rho`` at the long window's arrival rate: the band the miss back-off learns and
        answers in, as decide() asks it (the short window's bursts would move a steady
        load across bands, where a band without misses of its own holds the whole budget)."""
        with self._arrivals_lock:
            rate = self.arrivals.rate_and_long(now)[1]
        plan = self._plan
        return offered_load(plan.view, rate, plan.cap)  # 0 until a curve is learned

    def max_hold_s(self) -> float:
        """The longest a planned wait may hold the oldest request at the current load: the
        budget, scaled down by the miss back-off while the objective is being missed."""
        return self.backoff.hold_s(self.objective.budget_s, self.current_load(self._now()))

    def _learn_latency(self, batch: Sequence[WorkItem], size: int, outcome: BatchOutcome, now: float) -> None:
        """Before the cost model moves: each request's arrival -> answer (``now``) against
        the plan (its age at dispatch, less a planned wait's late start, plus the compute
        predicted for this size), and its outcome against the miss ceiling."""
        oldest = min(item.arrival for item in batch)
        late = self._waits.pop(oldest, 0.0)
        dispatched = batch[0].dispatched_at or outcome.started
        view = self.cost_view()
        predicted = view.seconds[min(size, len(view.seconds) - 1)]
        self.latency.observe(now - oldest, (dispatched - oldest) - late + predicted, len(batch))
        running = (item.arrival for item in batch if item.state is ItemState.RUNNING)
        met, missed = outcomes(running, now, miss_ceiling(self.objective))
        self.backoff.record(met, missed, self.current_load(now))

    def _take_energy(self) -> None:
        """Fold in the joules of earlier batches whose counter windows have closed since
        (telemetry's ``BatchSpan``: ``final``, ``attributed_joules``, ``idle_power_w``)."""
        pending = self._energy_pending
        for _ in range(len(pending)):
            size, span = pending.popleft()
            if not span.final:
                pending.append((size, span))
                continue
            joules = span.attributed_joules
            if joules is not None:  # None: a device failed to answer; no figure, not zero
                self.costs.observe_energy(size, joules, span.idle_power_w)
                self.energy_source = getattr(span, "source", None)

    async def _calibrate(self) -> None:
        """Seed the cost model: one timed batch of each probed size on each instance."""
        loop = asyncio.get_running_loop()
        sizes = calibration_sizes(self.config.max_batch_size, self._engine_sizes)
        timings: dict[int, list[float]] = {}
        for inst in self.instances:
            for size, seconds in (
                await loop.run_in_executor(inst.executor, _time_sizes, inst.engine, sizes)
            ).items():
                timings.setdefault(size, []).append(seconds)
        seeded = {size: float(np.median(ts)) for size, ts in timings.items()}
        snap = self.seed_costs(seeded)
        log.info("adaptive: cost model seeded from %s: %.2f ms + %.3f ms/item",
                 sizes, snap["intercept_s"] * 1e3, snap["per_item_s"] * 1e3)  # fmt: skip

    def seed_costs(self, seconds_by_size: dict[int, float]) -> CostSnapshot:
        """Seed the cost model with measured batch times (calibration, or a test's own
        figures) and publish the plan the decisions read; the model's snapshot."""
        with self._learning:
            self.costs.seed(seconds_by_size)
            self._plan = self._plan_from_models()
            return self.costs.snapshot()

    def _reject_doomed(self, now: float) -> bool:
        items = list(self.queue)
        positions = doomed(
            [now - it.arrival for it in items], self.cost_view(), self.objective, len(self.instances)
        )
        for i in positions:
            item = items[i]
            if self._unqueue(item):
                self.slo.rejected += 1
                item.finish(error=SloUnreachable("cannot meet the latency objective now; retry later"))
        return bool(positions)

    # ------------------------------------------------------------------ metrics
    def collect_policy(self, labels: tuple[str, str]) -> Iterable[Metric]:
        names = ["model", "batcher"]
        view = self.cost_view()
        with self._learning:  # the cost model's own caches are not for two threads at once
            joules_by_size = {b: self.costs.joules(b) for b in range(1, self.config.max_batch_size + 1)}
            mode, why = self.energy_mode()
            idle_watts = self.costs.idle_watts
            snap = self.costs.snapshot()
            latency_margin = self.latency.margin()
        seconds = GaugeMetricFamily(
            "wattserve_adaptive_batch_seconds",
            "Cost model: predicted engine seconds of one batch, by batch size.",
            labels=[*names, "batch_size"],
        )
        for b in range(1, len(view.seconds)):
            seconds.add_metric([*labels, str(b)], view.seconds[b])
        yield seconds
        source = self.energy_source or "none"
        joules = GaugeMetricFamily(
            "wattserve_adaptive_batch_joules",
            "Cost model: busy joules of one batch (EWMA of its counter windows' share), by batch "
            'size; only sizes metered; source="simulated" on a simulated GPU.',
            labels=[*names, "batch_size", "source"],
        )
        for b, j in joules_by_size.items():
            if j is not None:
                joules.add_metric([*labels, str(b), source], j)
        yield joules
        mode_metric = GaugeMetricFamily(
            "wattserve_adaptive_mode",
            "1 for the unit the decision minimizes per request (mode=seconds|joules) and why "
            "(reason=no meter|meter warming up|joules|configured).",
            labels=[*names, "mode", "reason", "source"],
        )
        mode_metric.add_metric([*labels, mode, why, source], 1.0)
        yield mode_metric
        if idle_watts is not None:
            idle = GaugeMetricFamily(
                "wattserve_adaptive_idle_watts",
                "Cost model: the metered device's idle power (what waiting draws anyway).",
                labels=[*names, "source"],
            )
            idle.add_metric([*labels, source], idle_watts)
            yield idle
        for name, value, doc in (
            ("wattserve_adaptive_cost_intercept_seconds", snap["intercept_s"], "Cost model fit a + c*b: a."),
            ("wattserve_adaptive_cost_per_item_seconds", snap["per_item_s"], "Cost model fit a + c*b: c."),
            (
                "wattserve_adaptive_margin_seconds",
                view.margin_s,
                "Held back: the larger of the compute-error margin and the latency margin.",
            ),
            (
                "wattserve_adaptive_compute_margin_seconds",
                snap["margin_s"],
                "Cost model: percentile of compute prediction error plus hand-off.",
            ),
            (
                "wattserve_adaptive_latency_margin_seconds",
                latency_margin,
                "Percentile of request latency (arrival to answer) minus what the plan expected.",
            ),
            (
                "wattserve_adaptive_max_hold_seconds",
                self.max_hold_s(),
                "Longest a planned wait may hold a request at this load: the budget, cut by the back-off.",
            ),
            (
                "wattserve_adaptive_queueing_reserve_seconds",
                self.queueing_reserve_s(),
                "Kept out of a wait's plan for queueing at this load (grows as the back-off cuts the hold).",
            ),
            (
                "wattserve_adaptive_window_miss_ratio",
                self.backoff.miss_ratio(self.current_load(self._now())),
                "Share of recent requests at this load (back-off window) past the objective less headroom.",
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(list(labels), float(value))
            yield g
        backoffs = CounterMetricFamily(
            "wattserve_adaptive_backoffs",
            "Times the wait's hold was cut because recent misses exceeded the percentile's allowance.",
            labels=names,
        )
        backoffs.add_metric(list(labels), self.backoff.backoffs)
        yield backoffs
        delayed = CounterMetricFamily(
            "wattserve_adaptive_late_delayed",
            "Requests moved behind the rest of the queue because, served first, they would make "
            "others miss the objective (slo_late_last).",
            labels=names,
        )
        delayed.add_metric(list(labels), self.delayed_total)
        yield delayed
        rate = GaugeMetricFamily(
            "wattserve_adaptive_arrival_rate",
            "Arrival model: requests per second.",
            labels=[*names, "window"],
        )
        with self._arrivals_lock:
            short, long_ = self.arrivals.rates(self._now())
        rate.add_metric([*labels, "short"], short)
        rate.add_metric([*labels, "long"], long_)
        yield rate
        target = GaugeMetricFamily(
            "wattserve_adaptive_target_batch_size", "Batch size the last decision dispatched or waited for.",
            labels=names,
        )  # fmt: skip
        target.add_metric(list(labels), self.last_decision.target if self.last_decision else 0)
        yield target


def miss_ceiling(objective: Objective) -> float:
    """Latency past which the back-off counts a request as missed: the budget (objective
    less headroom). The client sees the headroom's time too (HTTP, the network, its own
    lag), so a request that spent it inside the server is a miss where it counts."""
    return objective.slo_s - objective.headroom_s


CALIBRATION_ROUNDS = 2  # per size; the fastest counts (on a shared CPU one call can stall 5x)


def _time_sizes(engine, sizes: Sequence[int]) -> dict[int, float]:
    """Engine thread: seconds of a call per size, the fastest of ``CALIBRATION_ROUNDS``
    (the engine is warm already). Rounds go over all sizes in turn, so one stall of the
    machine lands on one size's one call, not on every call of one size."""
    out: dict[int, float] = {}
    batches = {size: zeros_batch(engine.inputs, size) for size in sizes}
    for _ in range(CALIBRATION_ROUNDS):
        for size in sizes:
            started = monotonic()
            engine.infer(batches[size])
            seconds = monotonic() - started
            out[size] = min(seconds, out.get(size, seconds))
    return out
