"""The same comparison as ``benchmarks.adaptive_batching``, on a simulated engine.

    python -m benchmarks.adaptive_simulation [--duration 20] [--seeds 3] [--noise 0.03]   # ~4 min

Why: the live benchmark shares a 2-core machine with the load generator and with whatever
else runs there, so at high rates it partly measures the machine. Here one engine instance
is simulated (event by event, no clocks): a batch of n takes (10 + 0.5 n) ms times a
lognormal noise factor, plus a 0.2 ms hand-off; each response costs 0.5 ms outside the
batcher. The arrival schedules are the load generator's own (``loadgen.arrivals``: Poisson
and MMPP bursts, same seeds as the live run). The adaptive policy is the real one: the
real ``decide`` with the real ``CostModel`` (seeded as the server seeds it, then learning
from every simulated batch) and ``ArrivalModel``. The fixed policies are their dispatch
rules restated in a few lines each (static, dynamic, continuous, AIMD). Same table, claim
check, JSON and plot as the live benchmark, under results/adaptive_simulation.*.
"""

from __future__ import annotations

import argparse
import math
import time
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
from wattserve.loadgen import stats
from wattserve.loadgen.arrivals import make_schedule

from benchmarks import adaptive_batching as live
from benchmarks._harness import RESULTS, save

HANDOFF_S = 0.0002
RESPONSE_S = 0.0005


class Policy(ABC):
    """Given the engine is free at ``t`` with ``queue`` (arrival times, FIFO): how many to
    dispatch now (0: none), and until when to wait otherwise (math.inf: next arrival)."""

    max_batch = live.MAX_BATCH

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
    def __init__(self, slo_s: float) -> None:
        self.config = AimdConfig(max_batch_size=self.max_batch, slo_s=slo_s)
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


def make_policy(config: str, cost: Callable[[int], float]) -> Policy:
    slo_s = live.SLO_MS / 1000
    if config in ("adaptive", "adaptive-fifo"):  # -fifo: without rule 10 (late last)
        return Adaptive(Objective(slo_s, live.PERCENTILE, 0.1 * slo_s), cost, late_last=config == "adaptive")
    if config == "aimd":
        return Aimd(slo_s)
    if config == "continuous":
        return Continuous()
    kind, _, arg = config.partition("-")
    if kind == "static":
        return Static(int(arg))
    if kind == "dynamic":
        return Dynamic(float(arg.removesuffix("ms")) / 1000)
    raise ValueError(config)


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


def run(config: str, arrival: str, load: float, duration: float, noise: float, seeds: list[int]) -> live.Row:
    """Every seed's schedule is simulated; latencies, counts and batches are pooled, so
    every configuration is judged on exactly the same requests."""

    def cost(n: int) -> float:
        return (live.FIXED_MS + live.PER_ITEM_MS * n) / 1000

    rate = load * live.CAPACITY
    warmup, cooldown = 5.0, 5.0
    burst = live.BURST if arrival == "bursty" else None
    ok_all, measured, done_inside = [], 0, 0
    served = busy = batches_in = 0.0
    for seed in seeds:
        arrivals = make_schedule(arrival, rate, warmup + duration + cooldown, seed, burst)
        finish, batches = simulate(
            make_policy(config, cost), arrivals, cost, np.random.default_rng(seed + 1), noise
        )
        inside = (arrivals >= warmup) & (arrivals < warmup + duration)
        latency = finish[inside] - arrivals[inside]
        ok_all.append(latency[np.isfinite(latency)])
        measured += int(inside.sum())
        done_inside += int(np.sum((finish >= warmup) & (finish < warmup + duration)))
        # batch sizes and busy seconds over the batches that ended inside the window
        sizes, secs, ends = (np.array(col, dtype=float) for col in zip(*batches, strict=True))
        in_window = (ends >= warmup) & (ends < warmup + duration)
        served += sizes[in_window].sum()
        busy += secs[in_window].sum()
        batches_in += in_window.sum()
    ok = np.concatenate(ok_all)
    return live.Row(
        config=config,
        arrival=arrival,
        load=load,
        rate=rate,
        p50_ms=float(np.percentile(ok, 50) * 1000) if len(ok) else None,
        p99_ms=_p99_with_failures(ok, measured - len(ok)),
        throughput=done_inside / (duration * len(seeds)),
        attainment=float(np.sum(ok * 1000 <= live.SLO_MS) / max(measured, 1)),
        mean_batch=float(served / batches_in) if batches_in else None,
        busy_ms_per_inf=float(busy / served * 1000) if served else None,
        valid=True,
        invalid_reasons=[],
    )


def _p99_with_failures(ok_s: np.ndarray, failures: int) -> float:
    return stats.slo_percentile_ms(list(ok_s), failures, live.PERCENTILE)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=20.0, help="simulated window per load, s")
    parser.add_argument("--noise", type=float, default=0.03, help="lognormal sigma of each batch's cost")
    parser.add_argument("--seeds", type=int, default=3, help="schedules per workload, pooled")
    parser.add_argument("--name", default="adaptive_simulation")
    args = parser.parse_args()
    started = time.time()
    rows: list[live.Row] = []
    for arrival in ("poisson", "bursty"):
        for config in live.CONFIGS:
            for i, load in enumerate(live.LOADS):
                seeds = [100 * s + i for s in range(args.seeds)]
                rows.append(run(config, arrival, load, args.duration, args.noise, seeds))
    rows.sort(key=lambda r: (r.arrival != "poisson", r.load, list(live.CONFIGS).index(r.config)))
    live.print_table(rows)
    check = live.claim_check(rows)
    print()
    live.print_claim(check)
    RESULTS.mkdir(exist_ok=True)
    png = RESULTS / f"{args.name}.png"
    live.plot(rows, png)
    doc = {
        "benchmark": "adaptive_simulation",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "model": {
            "fixed_ms": live.FIXED_MS,
            "per_item_ms": live.PER_ITEM_MS,
            "max_batch": live.MAX_BATCH,
            "noise_sigma": args.noise,
            "handoff_s": HANDOFF_S,
            "response_s": RESPONSE_S,
        },
        "objective": {"percentile": live.PERCENTILE, "slo_ms": live.SLO_MS},
        "duration_s": args.duration,
        "seeds": args.seeds,
        "rows": [{**vars(r), "meets": r.meets} for r in rows],
        "claim": check,
    }
    print(f"saved {save(args.name, doc)} and {png}")


if __name__ == "__main__":
    main()
