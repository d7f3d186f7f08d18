"""The adaptive batcher learns from the latency its objective is about (arrival to answer):
its margin grows when answers come later than the plan expected, and how long a wait may
hold a request backs off when more requests miss than the percentile allows, then recovers.

Deterministic: fake outcomes, and the batcher's learning hook driven with times placed
relative to the clock it reads (no server, no load)."""

from __future__ import annotations

from time import monotonic

import pytest
from wattserve.batchers.adaptive import CAUTION, AdaptiveBatcher, AdaptiveConfig
from wattserve.batchers.adaptive_decision import allowed_cap
from wattserve.batchers.arrival_model import ArrivalModel
from wattserve.batchers.executor import BatchOutcome
from wattserve.batchers.policy import Dispatch, Wait
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.scheduler import decide_once
from wattserve.batchers.slo_feedback import LatencyMargin, MissBackoff
from wattserve.batchers.types import ItemState, WorkItem
from wattserve.engines.identity import IdentityEngine


def test_latency_margin_is_zero_until_enough_requests_then_the_percentile_of_lateness() -> None:
    margin = LatencyMargin(percentile=99, window=1000, min_samples=32)
    margin.observe(actual_s=0.050, planned_s=0.040, requests=31)
    assert margin.margin() == 0.0  # too few to mean anything
    margin.observe(actual_s=0.050, planned_s=0.040, requests=1)
    assert margin.margin() == pytest.approx(0.010)
    margin.observe(actual_s=0.100, planned_s=0.040, requests=100)  # answers 60 ms later than planned
    assert margin.margin() == pytest.approx(0.060)


def test_latency_margin_never_negative_and_forgets_old_requests() -> None:
    margin = LatencyMargin(percentile=99, window=100, min_samples=10)
    margin.observe(0.010, 0.030, requests=50)  # earlier than planned
    assert margin.margin() == 0.0
    margin.observe(0.090, 0.030, requests=100)
    assert margin.margin() == pytest.approx(0.060)
    margin.observe(0.035, 0.030, requests=100)  # the slow ones fall out of the window
    assert margin.margin() == pytest.approx(0.005)


def test_backoff_engages_when_misses_exceed_the_budget_and_recovers_slowly() -> None:
    backoff = MissBackoff(percentile=99, window=500, decrease=0.5, recover=0.05, floor=0.05)
    for _ in range(50):  # 1000 requests, 0.5% missed: within p99's 1%
        backoff.record(met=199, missed=1) if _ % 10 == 0 else backoff.record(met=20, missed=0)
    assert backoff.scale == 1.0 and backoff.backoffs == 0
    # 2% missed: more than the 5 of 500 allowed
    for _ in range(6):
        backoff.record(met=49, missed=1)
    assert backoff.backoffs == 1 and backoff.scale == pytest.approx(0.5)
    # still missing: cut again, multiplicatively, never below the floor
    for _ in range(200):
        backoff.record(met=8, missed=2)
    assert backoff.scale == pytest.approx(0.05) and backoff.backoffs > 4
    backoff.record(met=0, missed=6)  # one more cut: the window starts empty
    assert backoff.scale == pytest.approx(0.05) and backoff.miss_ratio() == 0.0
    assert backoff.caution(0.5, 2.0) == pytest.approx(2.0)  # at the floor: the whole reserve
    # answers on time again: nothing comes back until a whole window says so
    backoff.record(met=499, missed=0)
    assert backoff.scale == pytest.approx(0.05)
    backoff.record(met=500, missed=0)  # then 5% of the budget per 500 requests
    assert backoff.scale == pytest.approx(0.10)
    for _ in range(40):
        backoff.record(met=500, missed=0)
    assert backoff.scale == 1.0
    assert backoff.miss_ratio() == 0.0


def test_backoff_does_not_recover_while_misses_sit_near_the_budget() -> None:
    backoff = MissBackoff(percentile=99, window=500)
    backoff.scale = 0.5
    for _ in range(100):  # 0.8% missed: under the budget (no cut) but over half of it
        backoff.record(met=124, missed=1)
    assert backoff.scale == 0.5 and backoff.backoffs == 0


def test_backoff_cut_at_a_load_holds_at_that_load_and_above_not_below() -> None:
    """Misses at 90% load say waits there (and just below) queue too long; they say
    nothing about waiting at 20% (the twelfth session's runs: after a minute of overload the hold sat at its floor
    for ~9,500 requests at 30 req/s, batching no more than a fixed 5 ms delay)."""
    backoff = MissBackoff(percentile=99, window=500)
    for _ in range(4):
        backoff.record(met=0, missed=6, load=0.9)  # a cut each time: 0.5, 0.25, 0.125, 0.0625
    assert backoff.hold_s(1.0, load=0.9) == pytest.approx(0.0625)
    assert backoff.hold_s(1.0, load=1.5) == pytest.approx(0.0625)  # more load: cut as well
    assert backoff.hold_s(1.0, load=0.8) == pytest.approx(0.0625)  # the band just below too
    assert backoff.hold_s(1.0, load=0.2) == 1.0 and backoff.hold_s(1.0, load=0.6) == 1.0
    assert backoff.caution(0.5, 2.0, load=0.2) == 0.5
    assert backoff.caution(0.5, 2.0, load=0.9) > 1.9
    backoff.record(met=0, missed=6, load=0.6)  # misses at 60%: cut there, above, just below
    assert backoff.hold_s(1.0, load=0.6) == pytest.approx(0.5)
    assert backoff.hold_s(1.0, load=0.4) == pytest.approx(0.5)
    assert backoff.hold_s(1.0, load=0.9) == pytest.approx(0.0625)  # already lower: kept
    assert backoff.hold_s(1.0, load=0.2) == 1.0
    assert backoff.backoffs == 5


def test_backoff_recovery_at_a_load_lifts_the_loads_below_not_above() -> None:
    backoff = MissBackoff(percentile=99, window=500)
    backoff.scale = 0.05  # every band at the floor
    for _ in range(4):  # four clean windows at 60%: +5% each
        backoff.record(met=500, missed=0, load=0.6)
    assert backoff.hold_s(1.0, load=0.6) == pytest.approx(0.25)
    assert backoff.hold_s(1.0, load=0.1) == pytest.approx(0.25)  # what holds at 60% holds at 10%
    assert backoff.hold_s(1.0, load=0.9) == pytest.approx(0.05)  # no evidence at 90% yet
    # each band judges on its own window: misses at 90% do not empty the 60% window
    backoff.record(met=0, missed=6, load=0.9)
    backoff.record(met=500, missed=0, load=0.6)
    assert backoff.hold_s(1.0, load=0.6) == pytest.approx(0.30)
    assert backoff.miss_ratio(load=0.6) == 0.0 and backoff.miss_ratio(load=0.9) == 0.0  # cut: emptied


# ------------------------------------------------------------------ in the batcher


def _batcher(slo_ms: float = 100.0) -> AdaptiveBatcher:
    engine = IdentityEngine(elements=4, max_batch_size=8)
    config = AdaptiveConfig(max_batch_size=8, slo_s=slo_ms / 1000, percentile=99.0, calibrate=False)
    batcher = AdaptiveBatcher([engine], config)
    batcher.seed_costs({b: 0.010 + 0.001 * b for b in (1, 2, 4, 8)})  # 11-18 ms
    return batcher


def _answer(
    batcher: AdaptiveBatcher, size: int, age_at_dispatch: float, after_dispatch: float, waited: bool = True
) -> None:
    """A batch of ``size`` dispatched ``age_at_dispatch`` after its requests arrived (at the
    end of a planned wait, or at once), answered ``after_dispatch`` later (now)."""
    now = monotonic()
    dispatched = now - after_dispatch
    items = [WorkItem({}, arrival=dispatched - age_at_dispatch, state=ItemState.RUNNING) for _ in range(size)]
    if waited:
        batcher._waits[items[0].arrival] = 0.0  # what decide() records when a wait ends in a dispatch
    for item in items:
        item.dispatched_at = dispatched
    compute = batcher.costs.seconds(size)  # compute exactly as predicted: any lateness is outside it
    outcome = BatchOutcome(items, [{}] * size, started=dispatched, finished=dispatched + compute,
                           energy=None, padded=0, rows=size)  # fmt: skip
    batcher.batch_finished(outcome)


def test_the_batchers_margin_grows_when_answers_come_later_than_planned() -> None:
    batcher = _batcher()
    for _ in range(8):  # answered as planned
        _answer(batcher, 4, age_at_dispatch=0.005, after_dispatch=batcher.costs.seconds(4))
    before = batcher.cost_view().margin_s
    assert before < 0.005
    for _ in range(16):  # compute as predicted, but each answer set 20 ms later (the loop was busy)
        _answer(batcher, 4, age_at_dispatch=0.005, after_dispatch=batcher.costs.seconds(4) + 0.020)
    assert batcher.latency.margin() >= 0.019
    assert batcher.cost_view().margin_s >= 0.019  # the decision plans with it
    assert batcher.backoff.scale == 1.0  # 25-35 ms: nobody missed the 90 ms budget


def test_the_batchers_hold_backs_off_on_misses_and_recovers() -> None:
    batcher = _batcher()
    budget = batcher.objective.budget_s  # 90 ms: 100 less 10% headroom
    assert batcher.max_hold_s() == pytest.approx(budget)
    assert batcher.backoff.caution(*CAUTION) == CAUTION[0]  # no misses: the reserve it starts with
    for _ in range(4):  # 32 requests dispatched in time (10 ms old) but answered 110 ms after arrival
        _answer(batcher, 8, age_at_dispatch=0.010, after_dispatch=0.100)
    assert batcher.backoff.backoffs >= 1
    assert batcher.max_hold_s() <= budget / 2
    assert batcher.backoff.caution(*CAUTION) > CAUTION[0]  # the same cut raises the queueing reserve
    for k in range(40):
        batcher.arrivals.arrived(monotonic() - 0.2 + 0.005 * k)  # 200/s: near this engine's capacity
    reserve = {m.name: m for m in batcher.collector("m").collect()}[
        "wattserve_adaptive_queueing_reserve_seconds"
    ]
    assert reserve.samples[0].value > 0
    assert batcher.objective.budget_s == pytest.approx(budget)  # the objective itself does not move
    assert batcher.slo.missed == 32  # and the misses are counted against it
    for _ in range(1600):  # 12,800 requests on time: the hold comes back (5% per 500)
        _answer(batcher, 8, age_at_dispatch=0.005, after_dispatch=0.020)
    assert batcher.max_hold_s() == pytest.approx(budget)
    assert batcher.backoff.caution(*CAUTION) == pytest.approx(CAUTION[0])
    metrics = {m.name: m for m in batcher.collector("m").collect()}
    hold = metrics["wattserve_adaptive_max_hold_seconds"].samples[0].value
    assert hold == pytest.approx(budget)
    assert metrics["wattserve_adaptive_backoffs"].samples[0].value >= 1
    assert "wattserve_adaptive_latency_margin_seconds" in metrics


def test_a_late_planned_wait_counts_against_the_plan() -> None:
    """A wait the decision planned to end at T that the loop ended at T + 30 ms: the 30 ms is
    lateness the plan did not expect, so it reaches the margin."""
    batcher = _batcher()
    arrival = monotonic() - 0.050
    batcher._wait_until = arrival + 0.010
    batcher._waits[arrival] = 0.030  # what decide() records when it dispatches past the wait's end
    item = WorkItem({}, arrival=arrival, state=ItemState.RUNNING)
    item.dispatched_at = arrival + 0.040
    compute = batcher.costs.seconds(1)
    for _ in range(40):
        batcher._waits[arrival] = 0.030
        now = monotonic()
        item.dispatched_at = now - compute
        outcome = BatchOutcome(
            [item], [{}], started=now - compute, finished=now, energy=None, padded=0, rows=1
        )
        batcher.batch_finished(outcome)
    assert batcher.latency.margin() >= 0.029


def test_misses_behind_a_wait_cut_the_hold_but_not_the_batches_that_drain_them() -> None:
    """Requests that queued behind a batch (not waited for themselves) and missed: they
    count, as the objective counts them, and cut how long a wait may hold; the batch-size
    cap and the deadline keep the whole budget, so a queue still goes in one batch."""
    batcher = _batcher()
    cap = allowed_cap(batcher.cost_view(), batcher.objective)
    for _ in range(20):  # dispatched at once, 150 ms old: a burst's backlog
        _answer(batcher, 8, age_at_dispatch=0.150, after_dispatch=0.020, waited=False)
    assert batcher.backoff.backoffs >= 1
    assert batcher.max_hold_s() < batcher.objective.budget_s / 2
    assert batcher.slo.missed == 160
    assert allowed_cap(batcher.cost_view(), batcher.objective) == cap
    # a lone request with more expected: waited for before, now goes once held enough
    queue = PriorityFifo()
    now = monotonic()
    queue.push(WorkItem({}, arrival=now - batcher.max_hold_s()))
    for k in range(20):
        batcher.arrivals.arrived(now - 0.5 + 0.025 * k)  # 40/s
    assert isinstance(decide_once(batcher, _View(queue), now), Dispatch)
    assert batcher.last_decision is not None and batcher.last_decision.reason == "held enough"
    batcher.backoff.scale = 1.0
    assert isinstance(decide_once(batcher, _View(queue), now), Wait)


def test_overload_misses_do_not_cut_the_hold_at_low_load() -> None:
    """The batcher learns the back-off by the load it is answered at (``current_load``):
    misses answered while requests arrive faster than the engine can serve cut the hold
    there, and once the load is low again its waits hold the whole budget at once."""
    batcher = _batcher()
    budget = batcher.objective.budget_s
    now = monotonic()
    for k in range(600):  # 600/s: the cap's batch (8 in 18 ms) carries 444/s
        batcher.arrivals.arrived(now - 1.0 + k / 600)
    assert batcher.current_load(monotonic()) > 1.0
    for _ in range(20):  # a backlog answered late
        _answer(batcher, 8, age_at_dispatch=0.150, after_dispatch=0.020, waited=False)
    assert batcher.backoff.backoffs >= 1
    assert batcher.max_hold_s() < budget / 2
    batcher.arrivals = ArrivalModel()  # later: 30/s
    now = monotonic()
    for k in range(60):
        batcher.arrivals.arrived(now - 2.0 + k / 30)
    assert batcher.current_load(monotonic()) < 0.3
    assert batcher.max_hold_s() == pytest.approx(budget)
    queue = PriorityFifo()
    queue.push(WorkItem({}, arrival=now - 0.010))  # a lone request, 10 ms old: worth a wait
    assert isinstance(decide_once(batcher, _View(queue), now), Wait)


def test_misses_count_past_the_budget_the_client_needs_the_headroom() -> None:
    batcher = _batcher()  # 100 ms objective, 10 ms headroom: the back-off counts past 90 ms
    for _ in range(20):  # 88 ms: within the budget
        _answer(batcher, 8, age_at_dispatch=0.010, after_dispatch=0.078)
    assert batcher.backoff.backoffs == 0
    _answer(batcher, 8, age_at_dispatch=0.010, after_dispatch=0.083)  # 93 ms: 8 past it, 5 allowed
    assert batcher.backoff.backoffs == 1


class _View:
    def __init__(self, queue: PriorityFifo) -> None:
        self.queue = queue
        self.closing = False


def test_decide_marks_the_batches_that_waited() -> None:
    """A dispatch that ends a planned wait marks its batch (by its oldest arrival); a
    dispatch decided at once does not, nor does a later one after a full batch ended a wait."""
    batcher = _batcher()
    queue = PriorityFifo()
    now = monotonic()
    first = WorkItem({}, arrival=now)
    queue.push(first)
    batcher.arrivals.arrived(now - 0.5)  # a modest rate: worth waiting for one more
    batcher.arrivals.arrived(now - 0.25)
    batcher.arrivals.arrived(now)
    assert isinstance(decide_once(batcher, _View(queue), now), Wait)
    second = WorkItem({}, arrival=now + 0.070)
    queue.push(second)
    assert isinstance(decide_once(batcher, _View(queue), now + 0.075), Dispatch)  # 75 ms old: goes
    assert set(batcher._waits) == {first.arrival}
    fresh = PriorityFifo()
    late = WorkItem({}, arrival=now + 0.001)
    fresh.push(late)
    assert isinstance(decide_once(batcher, _View(fresh), now + 0.081), Dispatch)  # 80 ms old: at once
    assert set(batcher._waits) == {first.arrival}


def test_a_full_queue_goes_split_where_the_learned_curve_says_two_batches_are_faster() -> None:
    """The batcher's shortcut for a full queue takes rule 8 from the cost view: 8 requests
    at 6 ms each cost 48 ms at once but 2 x 20 ms as 4 + 4."""
    batcher = _batcher()
    queue = PriorityFifo()
    now = monotonic()
    for _ in range(8):
        queue.push(WorkItem({}, arrival=now))
    assert decide_once(batcher, _View(queue), now) == Dispatch(8)
    batcher.seed_costs({1: 0.005, 2: 0.010, 4: 0.020, 8: 0.048})
    assert decide_once(batcher, _View(queue), now) == Dispatch(4)
    assert batcher.last_decision is not None and batcher.last_decision.reason == "split"
