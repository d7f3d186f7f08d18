"""The adaptive batcher's decision, as a pure function of plain data.

Each time an engine instance is free and requests are queued: dispatch ``n`` now, or wait
(up to ``wait_s``, re-deciding on every arrival) for a bigger batch. The rule:

1. A full batch (``max_batch_size`` queued) goes at once.
2. Overload: when even the largest batch the objective allows (``cap``, below) cannot keep
   up with the arrival rate, whatever is queued goes at once (up to the maximum). The
   queue refills during each batch, so batches come out full: work-conserving is what
   maximizes throughput there.
3. Otherwise, among the batch sizes ``k`` the queue can grow to while the oldest request
   still meets the objective (its age + expected time for ``k - queued`` more arrivals +
   predicted compute of ``k`` + margin <= budget), pick the one that serves the most
   requests per engine-second (per joule where measured). If that is the size queued now,
   dispatch; else wait for it, at most until the moment the oldest request must go.
   Because predicted cost is non-decreasing in size, dispatching fewer requests at that
   moment still meets the objective: the policy never waits past it.
4. ``cap``: a request that arrives just after a batch starts waits for that batch and then
   for its own, so waiting is only for batches whose compute fits in half the budget.
   (Batches larger than ``cap`` still go when that many are already queued.)

``budget`` = objective - headroom (time outside the batcher: HTTP, network); ``margin`` is
the cost model's percentile of prediction error, so the objective's percentile survives
the error of the model itself. The margin used is capped at a quarter of the budget: a
larger one says the machine cannot hold the objective anyway (stalls longer than the
compute), and planning for it would only shrink batches, cut throughput and lengthen the
queue, which makes every request later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_WAIT_S = 0.0002  # a shorter wait costs more in wake-ups than it can gain
MAX_MARGIN_SHARE = 0.25  # of the budget


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
    joules: Sequence[float] | None = None

    @property
    def max_batch_size(self) -> int:
        return len(self.seconds) - 1

    def held_back(self, objective: Objective) -> float:
        """The margin the decision plans with (capped; see the module docstring)."""
        return min(self.margin_s, MAX_MARGIN_SHARE * objective.budget_s)


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


def decide(queue: QueueState, cost: CostView, arrival_rate: float, objective: Objective) -> Decision:
    """Dispatch now, or wait for a bigger batch (see the module docstring)."""
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
    slack = objective.budget_s - cost.held_back(objective) - queue.oldest_age_s  # wait + compute
    if slack <= seconds[now_n] or arrival_rate <= 0:
        return Decision(now_n, 0.0, now_n, "deadline")
    value = cost.joules if cost.joules is not None else seconds
    best, best_eff = now_n, now_n / value[now_n] if value[now_n] > 0 else math.inf
    for k in range(now_n + 1, max(cap, now_n) + 1):
        if (k - queued) / arrival_rate + seconds[k] > slack:
            break  # both terms grow with k: no larger k fits either
        eff = k / value[k] if value[k] > 0 else math.inf
        if eff > best_eff * (1 + 1e-9):
            best, best_eff = k, eff
    if best == now_n:
        return Decision(now_n, 0.0, now_n, "efficient now")
    wait = slack - seconds[best]
    if wait < MIN_WAIT_S:
        return Decision(now_n, 0.0, now_n, "deadline")
    return Decision(0, wait, best, "wait")


def doomed(ages_s: Sequence[float], cost: CostView, objective: Objective, instances: int = 1) -> list[int]:
    """Positions (FIFO order) of queued requests that cannot meet the objective even if
    every batch from now on is full: the one at position ``i`` rides in batch ``i // max``
    of the ones ahead, each taking the full batch's predicted time (spread over
    ``instances``). Used only when the user turns early rejection on."""
    full = cost.max_batch_size
    per_batch = cost.seconds[full]
    first = cost.seconds[min(len(ages_s), full)]  # the first batch may be a partial one
    margin = cost.held_back(objective)
    out = []
    for i, age in enumerate(ages_s):
        rounds = i // (full * instances)
        if age + first + rounds * per_batch + margin > objective.budget_s:
            out.append(i)
    return out
