"""The batching policies on a simulated engine that stalls as a measured host did.

    python -m benchmarks.adaptive_host_replay PROFILE [--rates 20,30,40] [--seeds 15]
    python -m benchmarks.adaptive_host_replay --profile-from RUN_DIR... --save PROFILE

Why: on a shared 2-core machine a live comparison of two batchers at one rate is decided
by a few host stalls a minute (a batch taking 2-20x its usual time), so two 60 s runs of
the *same* configuration can land either side of the objective. This replays the host
instead: a profile taken from load generator runs on it (``requests.csv``: each batch's
compute by size, each request's time outside the batch) drives the event simulation of
``support/batch_simulation.py`` (one engine instance, the real adaptive ``decide``,
cost model and latency feedback; the fixed policies restated), on the same Poisson
schedules for every policy. What it shows is the policies' difference on that host's
distribution of slowdowns, free of which minute a stall fell in; what it does not show is
a correlation between stalls (they are drawn independently, batch by batch). The profile
and the replay are ``support/host_replay.py``.

A profile (JSON, a few KB): the median compute of each batch size seen at least
``MIN_BATCHES`` times (``median_ms``), 201 quantiles of each batch's compute over its
size's median (``slowdown_quantiles``) and of each request's time outside its batch
(``outside_ms_quantiles``: HTTP, the event loop, the generator's own lag).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from wattserve.batchers.adaptive_decision import Objective

from benchmarks._harness import save
from support.host_replay import HostProfile, ReplayRow, profile_from_runs, replay


def print_rows(rows: list[ReplayRow], slo_ms: float) -> None:
    print("| rate/s | config | requests | p50 ms | p99 ms | missed | mean batch | busy ms/inf | meets |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        meets = "yes" if r.p99_ms <= slo_ms else "no"
        print(
            f"| {r.rate:g} | {r.config} | {r.requests} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
            f"{r.missed_pct:.2f}% | {r.mean_batch:.2f} | {r.busy_ms_per_inf:.2f} | {meets} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", nargs="?", help="a profile JSON (see --profile-from)")
    parser.add_argument("--profile-from", nargs="+", metavar="RUN_DIR", help="loadgen run folders to profile")
    parser.add_argument("--save", help="write the profile here (with --profile-from)")
    parser.add_argument("--rates", default="20,30,40")
    parser.add_argument("--configs", default="dynamic-5ms,adaptive")
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--percentile", type=float, default=99.0)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--duration", type=float, default=60.0, help="simulated seconds per seed")
    parser.add_argument("--seeds", type=int, default=15)
    parser.add_argument("--name", default="adaptive_host_replay")
    args = parser.parse_args()
    if args.profile_from:
        profile = profile_from_runs(Path(d) for d in args.profile_from)
        if args.save:
            Path(args.save).write_text(json.dumps(profile.to_json(), indent=1) + "\n")
            print(f"wrote {args.save}")
    elif args.profile:
        profile = HostProfile.from_json(json.loads(Path(args.profile).read_text()))
    else:
        parser.error("give a profile, or --profile-from RUN_DIR...")
    objective = Objective(args.slo_ms / 1000, args.percentile, 0.1 * args.slo_ms / 1000)
    started = time.time()
    rows = [
        replay(
            config,
            float(rate),
            profile,
            objective,
            max_batch=args.max_batch,
            duration=args.duration,
            seeds=args.seeds,
        )
        for rate in args.rates.split(",")
        for config in args.configs.split(",")
    ]
    print_rows(rows, args.slo_ms)
    doc = {
        "benchmark": "adaptive_host_replay",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "profile": profile.to_json(),
        "objective": {"slo_ms": args.slo_ms, "percentile": args.percentile, "max_batch": args.max_batch},
        "duration_s": args.duration,
        "seeds": args.seeds,
        "rows": [asdict(r) for r in rows],
    }
    print(f"saved {save(args.name, doc)}")


if __name__ == "__main__":
    main()
