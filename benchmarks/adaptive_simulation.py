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
rules restated in a few lines each (static, dynamic, continuous, AIMD): the simulation is
``support/batch_simulation.py``. Same table, claim check, JSON and plot as the live
benchmark, under results/adaptive_simulation.*.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from wattserve.batchers.adaptive_decision import Objective
from wattserve.loadgen import stats
from wattserve.loadgen.arrivals import make_schedule

from benchmarks import adaptive_batching as live
from benchmarks._harness import RESULTS, save
from support.batch_simulation import HANDOFF_S, RESPONSE_S, Policy, make_policy, simulate


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
            policy(config, cost), arrivals, cost, np.random.default_rng(seed + 1), noise
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


def policy(config: str, cost: Callable[[int], float]) -> Policy:
    """The configuration's policy with the live benchmark's objective and batch limit."""
    slo_s = live.SLO_MS / 1000
    return make_policy(config, cost, Objective(slo_s, live.PERCENTILE, 0.1 * slo_s), live.MAX_BATCH)


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
