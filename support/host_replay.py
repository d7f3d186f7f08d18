"""A measured host's batch times and stalls (a ``HostProfile`` from load generator runs)
and the replay of a batching policy on them (``support/batch_simulation.py``): what
``benchmarks.adaptive_host_replay`` runs and prints, shared with its test.

A profile (JSON, a few KB): the median compute of each batch size seen at least
``MIN_BATCHES`` times (``median_ms``), 201 quantiles of each batch's compute over its
size's median (``slowdown_quantiles``) and of each request's time outside its batch
(``outside_ms_quantiles``: HTTP, the event loop, the generator's own lag). Stalls are drawn
independently, batch by batch.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from wattserve.batchers.adaptive_decision import Objective
from wattserve.loadgen.arrivals import make_schedule

from support.batch_simulation import RESPONSE_S, make_policy, simulate

MIN_BATCHES = 5  # batches of one size before its median counts
MIN_OWN_SLOWDOWNS = 50  # batches of one size before it gets a slowdown table of its own
QUANTILES = np.linspace(0.0, 1.0, 201)
WARMUP_S = 5.0


@dataclass(frozen=True)
class HostProfile:
    """How long a batch of each size took on a host, and how that varied."""

    median_ms: dict[int, float]
    slowdown_quantiles: list[float]  # all sizes together
    outside_ms_quantiles: list[float]
    slowdown_by_size: dict[int, list[float]] = field(default_factory=dict)  # sizes seen often
    source: str = ""

    def slowdowns(self, size: int) -> list[float]:
        """The slowdown table a batch of ``size`` draws from: its own where the runs had
        enough of them (bigger batches stall for longer here), else every size's."""
        own = [b for b in self.slowdown_by_size if b <= size]
        return self.slowdown_by_size[max(own)] if own else self.slowdown_quantiles

    def compute_s(self, size: int) -> float:
        """Median seconds of a batch of ``size``: measured, else the least-squares line
        through the measured sizes (never below the largest measured size under it)."""
        if size in self.median_ms:
            return self.median_ms[size] / 1000
        sizes = np.array(sorted(self.median_ms), dtype=float)
        values = np.array([self.median_ms[int(s)] for s in sizes])
        if len(sizes) == 1:
            slope, intercept = 0.0, float(values[0])
        else:
            slope, intercept = np.polyfit(sizes, values, 1)
        below = [self.median_ms[s] for s in self.median_ms if s < size]
        return max(intercept + slope * size, max(below, default=0.0)) / 1000

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["median_ms"] = {str(k): v for k, v in self.median_ms.items()}
        doc["slowdown_by_size"] = {str(k): v for k, v in self.slowdown_by_size.items()}
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> HostProfile:
        return cls(
            median_ms={int(k): float(v) for k, v in doc["median_ms"].items()},
            slowdown_quantiles=[float(x) for x in doc["slowdown_quantiles"]],
            outside_ms_quantiles=[float(x) for x in doc["outside_ms_quantiles"]],
            slowdown_by_size={
                int(k): [float(x) for x in v] for k, v in doc.get("slowdown_by_size", {}).items()
            },
            source=str(doc.get("source", "")),
        )


def profile_from_runs(run_dirs: Iterable[Path]) -> HostProfile:
    """A profile from load generator run folders (their measured-phase ``requests.csv``).

    A batch is the requests of one run that share its size and compute time (to the
    microsecond): the generator writes the server's per-batch figures into each row."""
    batches: dict[tuple[int, str, str], float] = {}
    outside: list[float] = []
    dirs = [Path(d) for d in run_dirs]
    for folder in dirs:
        with (folder / "requests.csv").open() as f:
            for row in csv.DictReader(f):
                if row["phase"] != "measure" or row["status"] != "200" or not row["compute_ms"]:
                    continue
                size, compute = int(row["batch_size"]), float(row["compute_ms"])
                batches[(size, row["compute_ms"], str(folder))] = compute
                outside.append(float(row["latency_ms"]) - float(row["queue_ms"]) - compute)
    by_size: dict[int, list[float]] = defaultdict(list)
    for (size, _, _), compute in batches.items():
        by_size[size].append(compute)
    median = {b: float(np.median(v)) for b, v in sorted(by_size.items()) if len(v) >= MIN_BATCHES}
    if not median or not outside:
        raise ValueError(f"no measured batches in {', '.join(map(str, dirs))}")
    slowdowns = [c / median[b] for b, cs in by_size.items() if b in median for c in cs]
    own = {
        b: np.quantile(np.array(cs) / median[b], QUANTILES).round(4).tolist()
        for b, cs in sorted(by_size.items())
        if len(cs) >= MIN_OWN_SLOWDOWNS
    }
    return HostProfile(
        median_ms=median,
        slowdown_quantiles=np.quantile(slowdowns, QUANTILES).round(4).tolist(),
        outside_ms_quantiles=np.quantile(outside, QUANTILES).round(3).tolist(),
        slowdown_by_size=own,
        source=", ".join(map(str, dirs)),
    )


class Draws:
    """Draws from a quantile table (inverse transform, linear between quantiles)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def draw(self, quantiles: list[float], n: int | None = None):
        return np.interp(self.rng.random(n), QUANTILES, quantiles)


@dataclass
class ReplayRow:
    config: str
    rate: float
    requests: int
    p50_ms: float
    p99_ms: float
    missed_pct: float
    mean_batch: float
    busy_ms_per_inf: float


def replay(
    config: str,
    rate: float,
    profile: HostProfile,
    objective: Objective,
    *,
    max_batch: int = 16,
    duration: float = 60.0,
    seeds: int = 15,
) -> ReplayRow:
    """Every seed's Poisson schedule, pooled; latency = arrival to the batch's end plus
    the request's own time outside the batch (drawn from the profile)."""
    latencies, sizes, busy = [], [], 0.0
    cost: Callable[[int], float] = profile.compute_s
    for seed in range(seeds):
        arrivals = make_schedule("poisson", rate, WARMUP_S + duration + 5.0, 1000 + seed, None)
        policy = make_policy(config, cost, objective, max_batch)
        draws = Draws(np.random.default_rng(seed + 7))
        finish, batches = simulate(
            policy, arrivals, cost, draws.rng, 0.0, lambda n, d=draws: float(d.draw(profile.slowdowns(n)))
        )
        outside = (
            Draws(np.random.default_rng(seed + 99)).draw(profile.outside_ms_quantiles, len(arrivals)) / 1000
        )
        inside = (arrivals >= WARMUP_S) & (arrivals < WARMUP_S + duration)
        latencies.append((finish - arrivals - RESPONSE_S + outside)[inside])
        for n, seconds, end in batches:
            if WARMUP_S <= end < WARMUP_S + duration:
                sizes.append(n)
                busy += seconds
    lat = np.concatenate(latencies) * 1000
    served = float(np.sum(sizes))
    return ReplayRow(
        config=config,
        rate=rate,
        requests=len(lat),
        p50_ms=float(np.percentile(lat, 50)),
        p99_ms=float(np.percentile(lat, objective.percentile)) if np.isfinite(lat).all() else math.inf,
        missed_pct=float(np.mean(lat > objective.slo_s * 1000) * 100),
        mean_batch=served / len(sizes) if sizes else 0.0,
        busy_ms_per_inf=busy / served * 1000 if served else 0.0,
    )
