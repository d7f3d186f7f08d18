"""The adaptive batcher's decision, as a pure function of plain data.

Each time an engine instance is free and requests are queued: dispatch ``n`` now, or wait
(up to ``wait_s``, re-deciding on every arrival) for a bigger batch. The rule:

1. A full batch (``max_batch_size`` queued) goes at once.
2. Overload: when even the largest batch the objective allows (``cap``, below) cannot keep
   up with the arrival rate, whatever is queued goes at once (up to the maximum). The
   queue refills during each batch, so batches come out full: work-conserving is what
   maximizes throughput there.
3. Otherwise, if some bigger batch (up to ``cap``) would serve more requests per
   engine-second (per joule where measured: see "Joules" below) and still fits the oldest
   request's slack,
   wait: at most until the last moment the batch expected by then could still go
   (age + wait + predicted compute of ``queued + rate * wait`` + margin = budget, and
   never past the moment for ``queued + 1``). Waiting costs no engine time, only latency
   the objective allows; each arrival re-decides. The arrival
   model says whether waiting is worth it at all: if one more request within that time
   is less than ``MIN_CHANCE`` likely, the queue goes now. Whatever is dispatched when the
   wait ends still meets the objective (predicted cost is non-decreasing in size).
4. ``cap``: a request that arrives just after a batch starts waits for that batch and then
   for its own, so waiting is only for batches whose compute fits in half the budget.
   (Batches larger than ``cap`` still go when that many are already queued.)
5. Queueing reserve (``caution``): a wait idles the engine, and near capacity the requests
   that arrive after it queue behind the batch it built. A wait keeps back, out of its
   slack, ``caution`` times the percentile of an M/M/1 queue's wait,
   ``ln(rho / miss) * s / (1 - rho)``, at the load ``rho`` the plan's cheapest batch
   (``cap``, ``s`` seconds per request) would carry the arrival rate at (the higher of
   the short and the long window's: a lull does not make the queue behind a burst
   shorter). The batcher's ``caution`` is 1 while its misses
   stay within the percentile's allowance and rises to 2 as the miss back-off cuts the
   hold (6. below; ``CAUTION`` in ``adaptive.py``), in the band of load it is asked
   at: a cut at 160 req/s raises it there and at 200, where the hold alone, one figure
   for every load, came back at low load and was missed again at high load; at 30 req/s
   it stays what that load taught.
6. ``max_hold_s``: no wait holds the oldest request past this age (its time queued behind
   a running batch included, as a dynamic batcher's delay counts from arrival). The
   batcher's miss back-off sets it: the whole budget while the objective holds, down to a
   few milliseconds while more requests miss than the percentile allows, learned per
   band of offered load ``rho`` (``offered_load``; ``slo_feedback.MissBackoff``).
7. A lone request (``pairing_wait``): where 3. would send one request alone (near
   capacity, the reserve leaves no room for a planned wait), it waits instead for a
   second one, if a pair costs less per request: each wait at most the time its own batch
   would hold the engine, re-decided when it ends, while the pair still fits the slack
   (reserve aside) and the hold. A request arriving in that time would queue behind the
   lone one and then run alone too; paired, the engine saves ``2 * seconds[1] -
   seconds[2]``, which near capacity is what the queue behind needs (a dynamic batcher's
   fixed delay does the same, at every load).
8. Split (``split_size``): whatever 1-7 send at once goes as two batches, the larger
   part first, where the two take less engine time than the one (by 3% at least): the
   first part is answered sooner, the rest no later, and a backlog drains faster. Where
   the cost per request rises at the top of the curve (served on a shared CPU, batches of
   16 cost 5-10% more per image than batches of 8), full batches are not what maximizes
   throughput in overload. Decided in engine seconds, also in joule mode: it is about
   draining a queue.

10. Late last (``doomed_prefix``, ``late_batch``; the batcher's ``late_last``, on by
   default): the fewest of the oldest queued requests that, served first, would make
   others late too move behind the rest (the queue's delayed lane, as Triton's
   ``timeout_action: DELAY``). Counted with the batches the queue will really drain in
   (``answered_after``: full ones of the split size, first come first served), so in a
   burst's backlog it moves about the burst's excess, early, and the requests behind it
   still meet the objective, where first come first served would make most of the
   backlog late. A request that cannot meet the objective even alone is always among
   them. While any late request is queued nothing waits: ``late_batch`` sends the on-time
   ones, filled up with late ones as far as the oldest on-time request's slack allows
   (then split, rule 8).

``budget`` = objective - headroom (time outside the batcher: HTTP, network); ``margin`` is
the cost model's percentile of prediction error, so the objective's percentile survives
the error of the model itself. For ``cap`` the margin is capped at a quarter of the
budget: a larger one says the machine stalls for longer than the compute, and shrinking
the batches the objective allows would only cut throughput and lengthen the queue, which
makes every request later. For *waiting* it is not capped: a wait is engine time given up
on purpose, and on a host whose stalls eat the budget there is none to give up, so the
queue goes at once (work-conserving, as a dynamic batcher without a delay), whatever the
batch size.

Joules: where a meter measures (``CostView.joules``, busy joules per batch from window
attribution, and ``idle_w``, the device's idle power), the decision minimizes joules per
request including idle energy. Waiting for a bigger batch spends idle power over the wait;
dispatching now spends the same idle power after the batch, until the next one. At arrival
rate r with batches of b, one cycle lasts b/r and costs J(b) + P_idle * (b/r - t(b)), so a
request costs (J(b) - P_idle * t(b)) / b + P_idle / r: the second term is the same for
every b, and the first, the batch's joules above what the device draws anyway, is what
batching changes. So ``value[b] = J(b) - P_idle * t(b)`` (floored at a millionth of J(b):
where batching saves nothing above idle, the busy joules decide) and the batch with the
most requests per ``value`` wins; without ``idle_w``, ``value = J(b)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

MIN_WAIT_S = 0.0002  # a shorter wait costs more in wake-ups than it can gain
MAX_MARGIN_SHARE = 0.25  # of the budget
MIN_CHANCE = 0.05  # wait only if at least this likely to bring one more request
SPLIT_GAIN = 0.03  # of the one batch's engine time: less is within a cost model's noise


@dataclass(frozen=True, slots=True)
class Objective:
    """``percentile`` of request latency <= ``slo_s``; ``headroom_s`` is spent outside."""

    slo_s: float
    percentile: float = 99.0
    headroom_s: float = 0.0

    @property
    def budget_s(self) -> float:
        return self.slo_s - self.headroom_s


@dataclass(frozen=True, slots=True)
class CostView:
    """A snapshot of the cost model: ``seconds[b]`` (and ``joules[b]``) for b in 0..max."""

    seconds: Sequence[float]
    margin_s: float = 0.0
    joules: Sequence[float] | None = None  # busy joules per batch (its windows' share)
    idle_w: float | None = None  # the metered device's idle power
    bias_s: float = 0.0  # a batch's mean time beyond ``seconds`` (hand-off): per batch of a backlog

    def values(self) -> Sequence[float]:
        """What one batch of each size costs in the unit the decision minimizes per request:
        joules above idle where metered (module docstring), else engine seconds."""
        if self.joules is None:
            return self.seconds
        if self.idle_w is None:
            return self.joules
        return [max(j - self.idle_w * t, 1e-6 * j) for j, t in zip(self.joules, self.seconds, strict=True)]

    @property
    def max_batch_size(self) -> int:
        return len(self.seconds) - 1

    def held_back(self, objective: Objective) -> float:
        """The margin the batch-size cap plans with (capped; see the module docstring)."""
        return min(self.margin_s, MAX_MARGIN_SHARE * objective.budget_s)

    def held_back_waiting(self, objective: Objective) -> float:
        """The margin a wait plans with: all of it (see the module docstring)."""
        return min(self.margin_s, objective.budget_s)


@dataclass(frozen=True, slots=True)
class QueueState:
    queued: int
    oldest_age_s: float  # now - arrival of the longest-waiting request


@dataclass(frozen=True, slots=True)
class Decision:
    """``dispatch`` > 0: send that many now. Else wait up to ``wait_s`` for ``target``."""

    dispatch: int
    wait_s: float
    target: int
    reason: str


def allowed_cap(cost: CostView, objective: Objective) -> int:
    """Largest batch whose compute fits half the budget (at least 1)."""
    half = (objective.budget_s - cost.held_back(objective)) / 2
    cap = 1
    for b in range(1, cost.max_batch_size + 1):
        if cost.seconds[b] <= half:
            cap = b
        else:
            break
    return cap


def offered_load(cost: CostView, arrival_rate: float, cap: int) -> float:
    """``rho``: the share of the engine the arrival rate would take in batches of ``cap``
    (the plan's cheapest; 1 and more: overload). What the queueing reserve and the miss
    back-off's load bands are sized by."""
    return arrival_rate * cost.seconds[cap] / cap


def queueing_reserve(
    cost: CostView, arrival_rate: float, objective: Objective, cap: int, caution: float
) -> float:
    """Time kept out of a wait's plan for queueing behind earlier work at this load:
    ``caution`` times the objective's percentile of an M/M/1 queue's wait at the load the
    plan's cheapest batch (``cap``) would carry (module docstring, "Queueing reserve")."""
    if caution <= 0:
        return 0.0
    per_request = cost.seconds[cap] / cap
    rho = offered_load(cost, arrival_rate, cap)
    if rho >= 1:
        return math.inf
    miss = max(1 - objective.percentile / 100, 1e-4)
    if rho <= miss:
        return 0.0
    return caution * math.log(rho / miss) * per_request / (1 - rho)


def decide(
    queue: QueueState,
    cost: CostView,
    arrival_rate: float,
    objective: Objective,
    max_hold_s: float = math.inf,
    *,
    sustained_rate: float = 0.0,
    caution: float = 0.0,
) -> Decision:
    """Dispatch now, or wait for a bigger batch (see the module docstring)."""
    decision = _plan(queue, cost, arrival_rate, objective, max_hold_s, sustained_rate, caution)
    if decision.dispatch > 1:
        first = split_size(cost.seconds, decision.dispatch, cost.bias_s)
        if first < decision.dispatch:
            return Decision(first, 0.0, first, "split")
    return decision


def split_size(seconds: Sequence[float], n: int, extra_s: float = 0.0) -> int:
    """Rule 8: how many of ``n`` requests about to go should go first. All of them, unless
    two batches, ``k`` and then the other ``n - k``, take less engine time than one of
    ``n`` (by ``SPLIT_GAIN`` at least): then the first ``k`` are answered sooner and the
    rest no later, and a backlog drains faster. A curve whose cost per request rises at
    the top does this (measured on this host, ONNX Runtime, while serving: 4.6-4.7 ms
    per image at 8, 4.9-5.1 at 16); an affine one never does. ``extra_s``: what one more
    batch costs beyond its compute (the cost model's mean hand-off, ``bias_s``): on a
    slow host, splitting small batches to save a few percent of compute cost more in
    hand-offs and drained the backlog slower."""
    if n < 2 or seconds[n] <= 0:
        return n
    first, best = n, seconds[n] * (1 - SPLIT_GAIN)
    for k in range(n - 1, (n - 1) // 2, -1):  # the larger part first; of equals, the larger
        both = seconds[k] + seconds[n - k] + extra_s
        if both < best * (1 - 1e-9):
            first, best = k, both
    return first


def _plan(
    queue: QueueState,
    cost: CostView,
    arrival_rate: float,
    objective: Objective,
    max_hold_s: float,
    sustained_rate: float,
    caution: float,
) -> Decision:
    """Rules 1-7 (the module docstring)."""
    full = cost.max_batch_size
    queued = queue.queued
    if queued <= 0:
        return Decision(0, math.inf, 0, "empty")
    now_n = min(queued, full)
    if queued >= full:
        return Decision(full, 0.0, full, "full")
    seconds = cost.seconds
    if seconds[full] <= 0:  # nothing learned yet: no basis for waiting
        return Decision(now_n, 0.0, now_n, "no cost model")
    cap = allowed_cap(cost, objective)
    if arrival_rate * seconds[cap] >= cap:
        return Decision(now_n, 0.0, now_n, "overload")
    slack = objective.budget_s - cost.held_back_waiting(objective) - queue.oldest_age_s  # wait + compute
    if seconds[now_n] > slack:  # late already: all of it goes (holding some back for a
        return Decision(now_n, 0.0, now_n, "deadline")  # later batch makes the next one late too)
    if now_n >= cap:
        return Decision(now_n, 0.0, now_n, "cap")
    value = cost.values()
    here = now_n / value[now_n] if value[now_n] > 0 else math.inf
    reserved = slack - queueing_reserve(cost, max(arrival_rate, sustained_rate), objective, cap, caution)
    bigger = [k for k in range(now_n + 1, cap + 1) if seconds[k] <= reserved]
    if not bigger or max(k / value[k] if value[k] > 0 else math.inf for k in bigger) <= here * (1 + 1e-9):
        if now_n == 1:  # and so cap >= 2
            pair = pairing_wait(queue, cost, value, here, slack, arrival_rate, max_hold_s)
            if pair is not None:
                return pair
        return Decision(now_n, 0.0, now_n, "efficient now")
    slack = reserved
    # Plan the wait for the batch expected at its end, not just one more request: wait w
    # with slack = w + compute(queued + arrivals expected in w). At low rates that is
    # nearly the whole slack; near capacity it is short, so the engine does not idle while
    # a batch too big to serve the next arrivals in time builds up.
    planned = now_n + 1
    wait = slack - seconds[planned]  # the longest wait after which one more still fits
    for _ in range(8):  # fixed point; ``wait`` only shrinks
        expected = min(cap, now_n + max(1, math.ceil(arrival_rate * max(wait, 0.0))))
        if expected <= planned:
            break
        planned, wait = expected, slack - seconds[expected]
    held = max_hold_s - queue.oldest_age_s
    if held < wait:  # the back-off holds the oldest request for less: expect fewer by then
        wait = held
        planned = min(planned, now_n + max(1, math.ceil(arrival_rate * max(wait, 0.0))))
        if wait < MIN_WAIT_S:
            return Decision(now_n, 0.0, now_n, "held enough")
    if wait < MIN_WAIT_S:
        return Decision(now_n, 0.0, now_n, "deadline")
    if arrival_rate <= 0 or -math.expm1(-arrival_rate * wait) < MIN_CHANCE:
        return Decision(now_n, 0.0, now_n, "nobody coming")
    return Decision(0, wait, planned, "wait")


def pairing_wait(
    queue: QueueState,
    cost: CostView,
    value: Sequence[float],
    alone: float,
    slack: float,
    arrival_rate: float,
    max_hold_s: float,
) -> Decision | None:
    """Rule 7: a lone request that rule 3 would send now waits for a second one instead,
    where a pair costs less per request: each wait at most the time its own batch would
    hold the engine (a request arriving then would queue behind it anyway, and then run
    alone), and only while the pair still fits ``slack`` (the oldest request's, without
    the queueing reserve) and the back-off's hold. Each wait re-decides when it ends, so a
    lone request keeps looking for a partner within those bounds while one is at least
    ``MIN_CHANCE`` likely to come; paired, the engine saves ``2 * seconds[1] - seconds[2]``,
    which near capacity is what the queue behind needs (a dynamic batcher's delay does
    the same, at every load)."""
    seconds = cost.seconds
    if value[2] <= 0 or 2 / value[2] <= alone:  # ``alone``: requests per unit as a batch of one
        return None
    wait = min(seconds[1], slack - seconds[2], max_hold_s - queue.oldest_age_s)
    if wait < MIN_WAIT_S or -math.expm1(-arrival_rate * wait) < MIN_CHANCE:
        return None
    return Decision(0, wait, 2, "pair")


def answered_after(cost: CostView, batch: int, n: int, total: int, instances: int = 1) -> float:
    """Rule 10: when the ``n``-th of ``total`` queued requests is answered, batches taken
    first come first served, at most ``batch`` (what a backlog drains in: the full batch,
    or its split) on each of ``instances`` engines: whole rounds of ``batch``, then the
    last round's share of what is left; each batch with its mean time beyond the
    prediction (``bias_s``). Non-decreasing in ``n``."""
    per_round = batch * instances
    rounds = (n - 1) // per_round
    full_round = cost.seconds[batch] + cost.bias_s
    if rounds < (total - 1) // per_round:  # not the last round
        return (rounds + 1) * full_round
    last = -(-(total - rounds * per_round) // instances)  # the larger share of the last round
    return rounds * full_round + cost.seconds[min(last, batch)] + cost.bias_s


def doomed_prefix(
    ages_s: Sequence[float],
    ahead: int,
    cost: CostView,
    objective: Objective,
    batch: int,
    instances: int = 1,
) -> int:
    """Rule 10 (late last): how many of the oldest of these on-time requests (``ages_s``,
    oldest first, ``ahead`` more queued in front of them) to move behind the rest so that
    every other one still meets the objective, by the cost model (``answered_after``, the
    margin held back): the fewest that do.

    Requests of one size and one deadline offset make first come first served the
    earliest-deadline order, in which moving the oldest is as good as moving any one
    (Moore-Hodgson's rule for equal jobs), and the fewest moved is the most answered in
    time. Moving more never makes a remaining one later, so the fewest is found by
    bisection. A request that cannot meet the objective even alone is always among them.
    0 while nothing is learned, and at once (one comparison) while the oldest would meet
    it even answered last."""
    count = len(ages_s)
    if not count or cost.seconds[-1] <= 0:
        return 0
    limit = objective.budget_s - cost.held_back(objective)  # capped, as for ``cap``: see late_batch
    total = ahead + count
    if ages_s[0] + answered_after(cost, batch, total, total, instances) <= limit:
        return 0

    def all_meet(moved: int) -> bool:
        served = total - moved
        return all(
            ages_s[p] + answered_after(cost, batch, ahead + p - moved + 1, served, instances) <= limit
            for p in range(moved, count)
        )

    low, high = 0, count  # all_meet(count): nobody left to be late
    while high - low > 1:
        mid = (low + high) // 2
        if all_meet(mid):
            high = mid
        else:
            low = mid
    return high


def late_batch(
    on_time: int, late: int, oldest_on_time_age_s: float | None, cost: CostView, objective: Objective
) -> int:
    """Rule 10: the batch to send while late requests (``late``, queued behind the
    ``on_time`` ones) wait: no waiting (they are late already), the on-time ones first
    (up to the maximum), then as many late ones in the same batch as still lets the oldest
    on-time request meet the objective; the late ones alone, up to the maximum, when
    nothing is on time."""
    full = cost.max_batch_size
    queued = min(on_time + late, full)
    if oldest_on_time_age_s is None or on_time <= 0:
        return queued
    n = min(on_time, full)
    # the capped margin, as for ``cap``: rule 10 forms batches from what is queued, and on a
    # host whose stalls inflate the margin, sizing them by all of it kept the batches that
    # drain a backlog at 2-3 requests where dynamic's were 7-8, and the backlog lasted
    slack = objective.budget_s - cost.held_back(objective) - oldest_on_time_age_s
    while n < queued and cost.seconds[n + 1] <= slack:
        n += 1
    return n


def doomed(ages_s: Sequence[float], cost: CostView, objective: Objective, instances: int = 1) -> list[int]:
    """Positions (FIFO order) of queued requests that cannot meet the objective even if
    every batch from now on is full (``answered_after``, the drain rule 10 counts with).
    Used only when the user turns early rejection on: unlike rule 10 it refuses only
    requests that cannot make it whatever else is moved."""
    full, total = cost.max_batch_size, len(ages_s)
    limit = objective.budget_s - cost.held_back(objective)
    return [
        i for i, age in enumerate(ages_s) if age + answered_after(cost, full, i + 1, total, instances) > limit
    ]


class Ages(Sequence[float]):
    """Queued requests' ages at ``now``, computed as read: ``doomed_prefix`` reads only the
    oldest unless a backlog makes it look further, and the decision runs on every
    arrival. ``arrival`` reads an item's arrival time (items are arrival times by default)."""

    __slots__ = ("_arrival", "_items", "_now")

    def __init__(self, items: Sequence[Any], now: float, arrival: Callable[[Any], float] = float) -> None:
        self._items, self._now, self._arrival = items, now, arrival

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(self)[index]
        return self._now - self._arrival(self._items[index])

    def __iter__(self) -> Iterator[float]:
        now, arrival = self._now, self._arrival
        return (now - arrival(item) for item in self._items)
