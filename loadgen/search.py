"""Find the highest arrival rate whose latency percentile meets an objective.

As MLPerf's Server scenario does: run at a rate, check the percentile, and bisect on the rate.
The search first doubles (or halves) from the start rate until it has a passing and a failing
rate, then bisects until the two are within ``tolerance`` of each other. Every step is a full
run with warm-up, long enough for 1.2 x ``min_queries`` expected queries (see
stats.min_queries_for); a step with fewer than ``min_queries`` in its window is invalid.
A step passes when the run is valid (the generator kept up) and the percentile, counting every
failed request as infinitely slow, is within the objective.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from . import stats
from .runner import LoadSpec, ProgressSink, RunResult, Target, run_load

QUERY_HEADROOM = 1.2
PROBE_CONCURRENCY = 8
PROBE_WARMUP_S = 0.5
PROBE_WINDOW_S = 2.0
PROBE_FRACTION = 0.5  # start the search at half the probe's closed-loop throughput

StepCallback = Callable[[int, RunResult, dict[str, Any]], None]


@dataclass(frozen=True)
class Objective:
    slo_ms: float
    percentile: float = 95.0


@dataclass(frozen=True)
class SearchLimits:
    start_rate: float = 10.0
    min_rate: float = 0.1
    max_rate: float = 100_000.0
    tolerance: float = 0.05  # stop when (fail - pass) / fail <= tolerance
    max_steps: int = 12
    min_queries: int | None = None  # default: stats.min_queries_for(percentile)


async def probe_start_rate(
    session: aiohttp.ClientSession, target: Target, base: LoadSpec
) -> tuple[float, dict[str, Any]]:
    """A first rate that answers in seconds: half the throughput of a short closed loop.

    A fixed default (10/s) with p99's 2,500 queries per step makes the first step last five
    minutes; starting near the server's capacity makes it last about one window, and the
    doubling or halving takes it from there."""
    spec = dataclasses.replace(
        base,
        arrival="closed",
        rate=None,
        concurrency=PROBE_CONCURRENCY,
        warmup_s=PROBE_WARMUP_S,
        duration_s=PROBE_WINDOW_S,
        burst=None,
        trace=None,
        min_queries=0,
        label=f"probe closed c={PROBE_CONCURRENCY}",
    )
    run = await run_load(session, target, spec)
    achieved = run.summary["achieved_rate"] or 0.0
    start = float(f"{achieved * PROBE_FRACTION:.2g}") if achieved > 0 else SearchLimits.start_rate
    line = (
        f"probe: closed loop, {PROBE_CONCURRENCY} workers, {PROBE_WINDOW_S:g} s: "
        f"{achieved:.4g} req/s -> the search starts at {start:g}/s"
    )
    return start, {
        "concurrency": PROBE_CONCURRENCY,
        "window_s": PROBE_WINDOW_S,
        "achieved_rate": achieved,
        "latency_ms": run.summary["latency_ms"],
        "start_rate": start,
        "line": line,
    }


def step_verdict(run: RunResult, objective: Objective) -> dict[str, Any]:
    """Does this run meet the objective? Failed requests count as misses."""
    value = run.slo_percentile_ms(objective.percentile)
    meets = value <= objective.slo_ms
    return {
        "rate": run.spec.rate,
        "label": run.label,
        "percentile_ms": value,
        "meets_objective": meets,
        "valid": run.summary["valid"],
        "passed": bool(meets and run.summary["valid"]),
        "achieved_rate": run.summary["achieved_rate"],
        "invalid_reasons": run.summary["invalid_reasons"],
    }


async def find_max_rate(
    session: aiohttp.ClientSession,
    target: Target,
    base: LoadSpec,
    objective: Objective,
    limits: SearchLimits = SearchLimits(),
    progress: ProgressSink | None = None,
    on_step: StepCallback | None = None,
) -> tuple[dict[str, Any], list[RunResult]]:
    """Bisection on rate; returns the search summary and every step's run.

    ``on_step(index, run, verdict)`` is called as each step finishes (a line per step)."""
    search = _RateSearch(session, target, base, objective, limits, progress, on_step)
    await search.bracket()
    await search.bisect()
    return search.summary(), search.runs


class _RateSearch:
    """One search: every step's run and verdict, the highest passing and lowest failing rate."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        base: LoadSpec,
        objective: Objective,
        limits: SearchLimits,
        progress: ProgressSink | None,
        on_step: StepCallback | None = None,
    ) -> None:
        self.session, self.target, self.base, self.progress = session, target, base, progress
        self.on_step = on_step
        self.objective, self.limits = objective, limits
        self.min_queries = limits.min_queries or stats.min_queries_for(objective.percentile)
        self.runs: list[RunResult] = []
        self.steps: list[dict[str, Any]] = []
        self.passed: float | None = None
        self.failed: float | None = None
        self.generator_limited = False

    def _steps_left(self) -> bool:
        return len(self.runs) < self.limits.max_steps

    async def _attempt(self, rate: float) -> bool:
        """One full run at ``rate``; it becomes the new highest pass or lowest fail."""
        # 20% headroom: a Poisson count falls short of its mean half the time.
        duration = max(self.base.duration_s, QUERY_HEADROOM * self.min_queries / rate)
        spec = dataclasses.replace(
            self.base,
            rate=rate,
            duration_s=duration,
            min_queries=self.min_queries,
            seed=self.base.seed + len(self.runs),
            label=f"search {rate:.4g}/s",
        )
        run = await run_load(self.session, self.target, spec, self.progress)
        verdict = step_verdict(run, self.objective)
        self.runs.append(run)
        self.steps.append(verdict)
        if self.on_step is not None:
            self.on_step(len(self.runs) - 1, run, verdict)
        if not run.summary["valid"] and any("generator" in r for r in run.summary["invalid_reasons"]):
            self.generator_limited = True
        if verdict["passed"]:
            self.passed = rate
        else:
            self.failed = rate
        return verdict["passed"]

    async def bracket(self) -> None:
        """Double from the start rate while it passes, halve while it fails, until one of
        each is known (or a rate limit or the step limit is reached)."""
        limits = self.limits
        rate = min(max(limits.start_rate, limits.min_rate), limits.max_rate)
        while self._steps_left():
            if await self._attempt(rate):
                if self.failed is not None or rate >= limits.max_rate:
                    break
                rate = min(rate * 2, limits.max_rate)
            else:
                if self.passed is not None or rate <= limits.min_rate:
                    break
                rate = max(rate / 2, limits.min_rate)

    def _gap_too_wide(self) -> bool:
        assert self.passed is not None and self.failed is not None
        return (self.failed - self.passed) / self.failed > self.limits.tolerance

    async def bisect(self) -> None:
        """Halve the gap between the highest pass and the lowest fail down to the tolerance."""
        while (
            self.passed is not None
            and self.failed is not None
            and self._gap_too_wide()
            and self._steps_left()
        ):
            await self._attempt((self.passed + self.failed) / 2)

    def stopped_by(self) -> str:
        if self.passed is None:
            return "no rate down to min_rate met the objective"
        if self.failed is None:
            if self.passed >= self.limits.max_rate:
                return "max_rate reached while still meeting the objective"
            return "step limit"
        if self._gap_too_wide():
            return "step limit reached before the tolerance"
        return "objective"

    def summary(self) -> dict[str, Any]:
        best = next((s for s in self.steps if s["passed"] and s["rate"] == self.passed), None)
        return {
            "objective": {"percentile": self.objective.percentile, "slo_ms": self.objective.slo_ms},
            "min_queries_per_step": self.min_queries,
            "best_rate": self.passed,
            "best_achieved_rate": best["achieved_rate"] if best else None,
            "lowest_failing_rate": self.failed,
            "stopped_by": self.stopped_by(),
            "generator_limited": self.generator_limited,
            "steps": self.steps,
        }
