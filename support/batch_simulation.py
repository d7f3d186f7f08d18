"""An event simulation of one engine instance under a batching policy, with no clocks:
the adaptive policy is the real one (the real ``decide``, ``CostModel``, ``ArrivalModel``
and latency feedback, fed as ``batchers/adaptive.py`` feeds them); the fixed policies are
their dispatch rules restated in a few lines each (static, dynamic, continuous, AIMD).

Shared by ``benchmarks.adaptive_simulation`` (a simulated engine), ``benchmarks.
adaptive_host_replay`` (a measured host's slowdowns, ``support/host_replay.py``) and their
tests. A batch of n takes ``cost(n)`` times a noise factor plus a hand-off; each response
costs ``RESPONSE_S`` outside the batcher.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

import numpy as np
from wattserve.batchers.adaptive import CAUTION, calibration_sizes, miss_ceiling
from wattserve.batchers.adaptive_decision import (
    Ages,
    CostView,
    Objective,
    QueueState,
    allowed_cap,
    decide,
    doomed_prefix,
    late_batch,
    offered_load,
    split_size,
)
from wattserve.batchers.aimd import AimdConfig, next_limit
from wattserve.batchers.arrival_model import ArrivalModel
from wattserve.batchers.cost_model import CostModel
from wattserve.batchers.slo_feedback import LatencyMargin, MissBackoff, outcomes

HANDOFF_S = 0.0002
RESPONSE_S = 0.0005


class Policy(ABC):
    """Given the engine is free at ``t`` with ``queue`` (arrival times, FIFO): how many to
    dispatch now (0: none), and until when to wait otherwise (math.inf: next arrival)."""

    max_batch = 32  # make_policy sets the experiment's

    def arrived(self, t: float) -> None:
        return None

    @abstractmethod
    def decide(self, t: float, queue: deque[float]) -> tuple[int, float]: ...

    def finished(self, n: int, seconds: float) -> None:
        return None

    def answered(self, t: float, arrivals: list[float]) -> None:
        """The batch just finished answered requests that arrived at ``arrivals`` at ``t``."""
        return None

    def late_age(self) -> float:
        """Requests queued longer go behind the rest (the adaptive batcher's rule 10)."""
        return math.inf

    def late_count(self, t: float, queue: deque[float]) -> int:
        """How many of the oldest queued requests go behind the rest now: by default those
        older than ``late_age``."""
        cutoff = t - self.late_age()
        return next((i for i, arrival in enumerate(queue) if arrival >= cutoff), len(queue))

    def decide_late(self, t: float, queue: deque[float], late: int) -> int:
        """How many to send while ``late`` requests wait behind ``queue`` (asked only while
        ``late_count`` has moved some there): by default no waiting, everything up to the
        maximum, the on-time ones first (the adaptive policy sizes it by the on-time ones'
        slack)."""
        return min(len(queue) + late, self.max_batch)


class Static(Policy):
    def __init__(self, n: int) -> None:
        self.max_batch = n

    def decide(self, t, queue):
        return (self.max_batch, t) if len(queue) >= self.max_batch else (0, math.inf)


class Dynamic(Policy):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def decide(self, t, queue):
        if len(queue) >= self.max_batch or t >= queue[0] + self.delay_s:  # (same sum as the wake)
            return min(len(queue), self.max_batch), t
        return 0, queue[0] + self.delay_s


class Continuous(Policy):
    def decide(self, t, queue):
        return min(len(queue), self.max_batch), t


class Aimd(Policy):
    def __init__(self, slo_s: float, max_batch: int = Policy.max_batch) -> None:
        self.max_batch = max_batch
        self.config = AimdConfig(max_batch_size=max_batch, slo_s=slo_s)
        self.limit = 1

    def decide(self, t, queue):
        return min(len(queue), self.limit), t

    def finished(self, n, seconds):
        self.limit = next_limit(self.limit, seconds, self.config)


class Adaptive(Policy):
    def __init__(
        self,
        objective: Objective,
        cost: Callable[[int], float],
        max_batch: int | None = None,
        late_last: bool = True,
    ) -> None:
        self.late_last = late_last  # rule 10, on by default as in the batcher
        if max_batch is not None:
            self.max_batch = max_batch
        self.objective = objective
        self.costs = CostModel(self.max_batch, percentile=objective.percentile)
        self.costs.seed({b: cost(b) for b in calibration_sizes(self.max_batch, None)})
        self.arrivals = ArrivalModel()
        self.latency = LatencyMargin(objective.percentile)  # as batchers/adaptive.py feeds them
        self.backoff = MissBackoff(objective.percentile)
        self._view: CostView | None = None
        self._plan = (0.0, 0.0)  # last dispatch: (when, predicted seconds)

    def arrived(self, t):
        self.arrivals.arrived(t)

    def decide(self, t, queue):
        view = self._cost_view()
        state = QueueState(len(queue), t - queue[0])
        rate, sustained = self.arrivals.rate_and_long(t)
        load = self._load(sustained)  # as batchers/adaptive.py asks
        d = decide(
            state,
            view,
            rate,
            self.objective,
            self.backoff.hold_s(self.objective.budget_s, load),
            sustained_rate=sustained,
            caution=self.backoff.caution(*CAUTION, load=load),
        )
        if d.dispatch:
            self._plan = (t, view.seconds[min(d.dispatch, len(queue))])
        return (d.dispatch, t) if d.dispatch else (0, t + d.wait_s)

    def answered(self, t, arrivals):
        dispatched, predicted = self._plan
        oldest = min(arrivals)
        self.latency.observe(t - oldest, dispatched - oldest + predicted, len(arrivals))
        met, missed = outcomes(arrivals, t, miss_ceiling(self.objective))  # as the batcher does
        self.backoff.record(met, missed, self._load(self.arrivals.rate_and_long(t)[1]))
        self._view = None

    def late_count(self, t, queue):
        if not self.late_last or not queue:
            return 0
        view = self._cost_view()
        batch = split_size(view.seconds, self.max_batch, view.bias_s)
        return doomed_prefix(Ages(queue, t), 0, view, self.objective, batch)

    def decide_late(self, t, queue, late):
        view = self._cost_view()
        n = late_batch(len(queue), late, t - queue[0] if queue else None, view, self.objective)
        n = split_size(view.seconds, n, view.bias_s)  # as the batcher does
        self._plan = (t, self._cost_view().seconds[n])
        return n

    def _cost_view(self) -> CostView:
        if self._view is None:
            self._view = CostView(
                self.costs.curve().tolist(),
                max(self.costs.margin(), self.latency.margin()),
                bias_s=self.costs.bias(),
            )
        return self._view

    def _load(self, rate: float) -> float:
        view = self._cost_view()
        return offered_load(view, rate, allowed_cap(view, self.objective))

    def finished(self, n, seconds):
        self.costs.observe(n, seconds - HANDOFF_S)
        self.costs.observe_overhead(HANDOFF_S)
        self._view = None


def make_policy(config: str, cost: Callable[[int], float], objective: Objective, max_batch: int) -> Policy:
    """The policy a configuration names: ``adaptive`` (with ``objective``, its cost model
    seeded from ``cost`` as the server seeds itself with timed batches), ``adaptive-fifo``
    (without rule 10: late requests served in arrival order), ``aimd``, ``continuous``,
    ``static-<n>`` (its size is its batch) or ``dynamic-<ms>ms``; at most ``max_batch``."""
    if config in ("adaptive", "adaptive-fifo"):
        return Adaptive(objective, cost, max_batch=max_batch, late_last=config == "adaptive")
    if config == "aimd":
        return Aimd(objective.slo_s, max_batch)
    kind, _, arg = config.partition("-")
    if kind == "static":
        return Static(int(arg))
    policy: Policy
    if config == "continuous":
        policy = Continuous()
    elif kind == "dynamic":
        policy = Dynamic(float(arg.removesuffix("ms")) / 1000)
    else:
        raise ValueError(config)
    policy.max_batch = max_batch
    return policy


def simulate(
    policy: Policy,
    arrivals: np.ndarray,
    cost: Callable[[int], float],
    rng: np.random.Generator,
    noise: float,
    slowdown: Callable[[int], float] | None = None,
):
    """One engine instance; returns (finish time per request or inf, [(size, seconds, end)]).
    Each batch of n takes cost(n) times a lognormal(0, noise) factor, or ``slowdown(n)``."""
    finish = np.full(len(arrivals), math.inf)
    queue: deque[float] = deque()
    index: deque[int] = deque()
    late: deque[tuple[float, int]] = deque()  # behind ``queue`` (rule 10): (arrival, index)
    batches: list[tuple[int, float, float]] = []
    t, nxt = 0.0, 0
    while True:
        while nxt < len(arrivals) and arrivals[nxt] <= t:
            policy.arrived(arrivals[nxt])
            queue.append(arrivals[nxt])
            index.append(nxt)
            nxt += 1
        for _ in range(policy.late_count(t, queue)):
            late.append((queue.popleft(), index.popleft()))
        if not queue and not late:
            if nxt == len(arrivals):
                break
            t = arrivals[nxt]
            continue
        if late:
            n, wake = policy.decide_late(t, queue, len(late)), t
        else:
            n, wake = policy.decide(t, queue)
        if n:
            n = min(n, len(queue) + len(late))
            factor = slowdown(n) if slowdown is not None else float(rng.lognormal(0.0, noise))
            seconds = cost(n) * factor + HANDOFF_S
            t += seconds
            answered = []
            for _ in range(n):  # on time first, then the late ones
                arrival, i = (queue.popleft(), index.popleft()) if queue else late.popleft()
                answered.append(arrival)
                finish[i] = t + RESPONSE_S
            batches.append((n, seconds, t))
            policy.answered(t, answered)  # before the cost model learns: the plan it made
            policy.finished(n, seconds)
        else:
            upcoming = arrivals[nxt] if nxt < len(arrivals) else math.inf
            if wake == math.inf and upcoming == math.inf:
                break  # static with a partial batch and no more arrivals: never served
            if wake <= t and upcoming > t:
                raise RuntimeError(f"{type(policy).__name__} neither dispatched nor waited at t={t}")
            t = max(min(wake, upcoming), t)
    return finish, batches
