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
from dataclasses import dataclass
from typing import Any

import aiohttp

from . import stats
from .runner import LoadSpec, ProgressSink, RunResult, Target, run_load

QUERY_HEADROOM = 1.2


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


def step_verdict(run: RunResult, objective: Objective) -> dict[str, Any]:
    """Does this run meet the objective? Failed requests count as misses."""
    w0, w1 = run.spec.warmup_s, run.spec.warmup_s + run.spec.duration_s
    inside = [r for r in run.records if w0 <= r.intended_s < w1]
    ok = [r.latency_s for r in inside if r.ok]
    value = stats.slo_percentile_ms(ok, len(inside) - len(ok), objective.percentile)
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
) -> tuple[dict[str, Any], list[RunResult]]:
    """Bisection on rate; returns the search summary and every step's run."""
    min_queries = limits.min_queries or stats.min_queries_for(objective.percentile)
    runs: list[RunResult] = []
    steps: list[dict[str, Any]] = []
    passed: float | None = None
    failed: float | None = None
    generator_limited = False

    async def attempt(rate: float) -> bool:
        nonlocal generator_limited
        # 20% headroom: a Poisson count falls short of its mean half the time.
        duration = max(base.duration_s, QUERY_HEADROOM * min_queries / rate)
        spec = dataclasses.replace(
            base,
            rate=rate,
            duration_s=duration,
            min_queries=min_queries,
            seed=base.seed + len(runs),
            label=f"search {rate:.4g}/s",
        )
        run = await run_load(session, target, spec, progress)
        verdict = step_verdict(run, objective)
        runs.append(run)
        steps.append(verdict)
        if not run.summary["valid"] and any("generator" in r for r in run.summary["invalid_reasons"]):
            generator_limited = True
        return verdict["passed"]

    rate = min(max(limits.start_rate, limits.min_rate), limits.max_rate)
    # Phase 1: bracket the answer.
    while len(runs) < limits.max_steps:
        if await attempt(rate):
            passed = rate
            if failed is not None or rate >= limits.max_rate:
                break
            rate = min(rate * 2, limits.max_rate)
        else:
            failed = rate
            if passed is not None or rate <= limits.min_rate:
                break
            rate = max(rate / 2, limits.min_rate)
    # Phase 2: bisect between the highest pass and the lowest fail.
    while (
        passed is not None
        and failed is not None
        and (failed - passed) / failed > limits.tolerance
        and len(runs) < limits.max_steps
    ):
        mid = (passed + failed) / 2
        if await attempt(mid):
            passed = mid
        else:
            failed = mid
    if passed is None:
        bound = "no rate down to min_rate met the objective"
    elif failed is None:
        bound = (
            "max_rate reached while still meeting the objective"
            if passed >= limits.max_rate
            else "step limit"
        )
    elif (failed - passed) / failed > limits.tolerance:
        bound = "step limit reached before the tolerance"
    else:
        bound = "objective"
    best = next((s for s in steps if s["passed"] and s["rate"] == passed), None)
    summary = {
        "objective": {"percentile": objective.percentile, "slo_ms": objective.slo_ms},
        "min_queries_per_step": min_queries,
        "best_rate": passed,
        "best_achieved_rate": best["achieved_rate"] if best else None,
        "lowest_failing_rate": failed,
        "stopped_by": bound,
        "generator_limited": generator_limited,
        "steps": steps,
    }
    return summary, runs
