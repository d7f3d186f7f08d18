"""Several wattserve replicas behind a real HAProxy on loopback, under the built-in load generator.

What a Kubernetes Service / ingress does to a Deployment, shown on one machine with real parts:

- ``rolling``: a rolling restart under steady open-loop load. One replica at a time gets SIGTERM
  (wattserve drains: ready -> false, accepted work answered, then exit), is started again, and
  the next one goes only when HAProxy's health check (``GET /v2/health/ready``) sees it up
  again (Kubernetes: ``maxUnavailable: 0`` and the readiness probe). Counted over every
  request of the run: answers other than 200 (lost or 5xx).
- ``kill``: SIGKILL one replica mid-run (no drain), restart it; what clients see.
- each of those with ``-noretry``: the same with HAProxy's layer-7 retries off (only
  connection failures are retried), to show what the retries are for.
- ``scale``: throughput and latency through the balancer with 1, 2 and 3 replicas (closed loop
  at fixed concurrency, and open loop at a fixed rate).

The model is Triton's identity with ``WATTSERVE_IDENTITY_DELAY_MS``: compute is a sleep, so the
replicas do not compete for the two cores the way real models would (say so in any figure).

Run: ``python -m benchmarks.replicas`` (or ``scripts/replicas.sh``); prints a table and saves
``results/replicas/results.json``. Needs ``haproxy`` (Debian: ``apt-get install haproxy``).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from wattserve.loadgen import client
from wattserve.loadgen.runner import LoadSpec, RunResult, Target, prepare_target, run_load
from wattserve.loadgen.search import Objective, SearchLimits, find_max_rate
from wattserve.loadgen.server_process import DEFAULT_COMMAND, ServerProcess, free_port, server_env

from support.haproxy import BalancerSpec, haproxy_binary, haproxy_config

ROOT = Path(__file__).resolve().parent.parent
MODEL = "identity"
# Answers the runner records for requests it cancelled itself after the window: not failures.
NOT_FAILURES = {"200", "cancelled"}


class HAProxy:
    """One haproxy process in the foreground (``-db``) with a generated configuration."""

    def __init__(self, spec: BalancerSpec, workdir: Path) -> None:
        self.spec = spec
        self.workdir = workdir
        self.port = free_port()
        self.stats_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        binary = haproxy_binary() or "haproxy"
        config = self.workdir / f"haproxy-{self.port}.cfg"
        config.write_text(haproxy_config(self.spec, self.port, self.stats_port))
        check = await asyncio.create_subprocess_exec(
            binary,
            "-c",
            "-q",
            "-f",
            str(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await check.communicate()
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected its configuration:\n{out.decode(errors='replace')}")
        log = (self.workdir / f"haproxy-{self.port}.log").open("wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                binary, "-db", "-f", str(config), stdout=log, stderr=asyncio.subprocess.STDOUT
            )
        finally:
            log.close()
        await self.wait_up(len(self.spec.backends), timeout_s=15)

    async def stats(self) -> list[dict[str, str]]:
        """HAProxy's own counters (CSV stats page), one row per frontend/backend/server."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.stats_port}/stats;csv") as resp,
        ):
            text = await resp.text()
        return list(csv.DictReader(io.StringIO(text.lstrip("# "))))

    async def server_status(self) -> dict[str, str]:
        rows = await self.stats()
        return {
            r["svname"]: r["status"]
            for r in rows
            if r["pxname"] == "replicas" and r["svname"].startswith("r")
        }

    async def wait_up(
        self, count: int | None = None, name: str | None = None, timeout_s: float = 30
    ) -> float:
        """Seconds until ``count`` servers (or server ``name``) are UP in HAProxy's view."""
        t0 = time.monotonic()
        while True:
            try:
                status = await self.server_status()
                up = [n for n, s in status.items() if s.startswith("UP")]
                if (name is not None and name in up) or (name is None and len(up) >= (count or 0)):
                    return time.monotonic() - t0
            except (aiohttp.ClientError, OSError):
                pass
            if self.proc is not None and self.proc.returncode is not None:
                log = (self.workdir / f"haproxy-{self.port}.log").read_text(errors="replace")
                raise RuntimeError(f"haproxy exited with code {self.proc.returncode}:\n{log}")
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"haproxy: servers not up after {timeout_s} s")
            await asyncio.sleep(0.05)

    async def backend_counters(self) -> dict[str, int]:
        """Retries, redispatches and errors of the replicas backend, and the 5xx clients got.

        A replica's 503 that HAProxy retried elsewhere counts in the backend's ``hrsp_5xx``
        but never reaches the client; ``client_5xx`` (the frontend's) is what clients saw.
        """
        rows = await self.stats()
        backend = next(r for r in rows if r["pxname"] == "replicas" and r["svname"] == "BACKEND")
        frontend = next(r for r in rows if r["pxname"] == "wattserve" and r["svname"] == "FRONTEND")
        keys = ("wretr", "wredis", "econ", "eresp", "hrsp_2xx", "hrsp_5xx")
        counters = {k: int(backend.get(k) or 0) for k in keys}
        counters["client_5xx"] = int(frontend.get("hrsp_5xx") or 0)
        return counters

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


@dataclass
class ReplicaSet:
    """``count`` wattserve processes on fixed ports, so a restarted one comes back where the
    balancer expects it (a pod IP behind a Service does not, but the effect is the same)."""

    count: int
    settings: dict[str, object]
    logdir: Path
    ports: list[int] = field(default_factory=list)
    procs: list[ServerProcess] = field(default_factory=list)
    starts: Counter[int] = field(default_factory=Counter)

    def _process(self, i: int) -> ServerProcess:
        self.starts[i] += 1
        env = server_env(log_level="warning", **self.settings)
        log = self.logdir / f"replica{i}-{self.starts[i]}.log"
        return ServerProcess(DEFAULT_COMMAND, env, self.ports[i], log, cwd=ROOT)

    async def start(self) -> None:
        self.ports = [free_port() for _ in range(self.count)]
        self.procs = [self._process(i) for i in range(self.count)]
        for p in self.procs:
            await p.astart()
        await asyncio.gather(*(p.await_ready(180) for p in self.procs))

    async def restart(self, i: int) -> float:
        """Start replica ``i`` again; seconds until it answers ready."""
        self.procs[i] = self._process(i)
        await self.procs[i].astart()
        return await self.procs[i].await_ready(180)

    def kill(self, i: int) -> None:
        proc = self.procs[i].proc
        assert proc is not None
        proc.kill()

    async def stop(self) -> None:
        await asyncio.gather(*(p.astop(30) for p in self.procs))


async def rolling_restart(replicas: ReplicaSet, lb: HAProxy, t0: float) -> list[dict[str, Any]]:
    """SIGTERM each replica in turn, start it again, wait until the balancer has it back."""
    events = []
    for i in range(replicas.count):
        ev: dict[str, Any] = {"replica": i, "sigterm_at_s": time.monotonic() - t0}
        t = time.monotonic()
        ev["exit_code"] = await replicas.procs[i].astop(60)
        ev["drain_and_exit_s"] = time.monotonic() - t
        ev["ready_after_s"] = await replicas.restart(i)
        ev["lb_up_after_s"] = await lb.wait_up(name=f"r{i}")
        ev["done_at_s"] = time.monotonic() - t0
        events.append(ev)
    return events


async def kill_one(replicas: ReplicaSet, lb: HAProxy, t0: float, down_s: float) -> list[dict[str, Any]]:
    """SIGKILL replica 0 (no drain), leave it dead ``down_s``, start it again."""
    ev: dict[str, Any] = {"replica": 0, "sigkill_at_s": time.monotonic() - t0}
    replicas.kill(0)
    await asyncio.sleep(down_s)
    await replicas.procs[0].astop(5)  # reap it
    ev["ready_after_s"] = await replicas.restart(0)
    ev["lb_up_after_s"] = await lb.wait_up(name="r0")
    ev["done_at_s"] = time.monotonic() - t0
    return [ev]


WINDOW_KEYS = ("sent", "completed", "achieved_rate", "latency_ms", "lag_ms", "valid", "invalid_reasons")


def failures(run: RunResult) -> dict[str, int]:
    """Every request of the run (warm-up, window and after) not answered 200, by status."""
    return dict(Counter(r.status for r in run.records if r.status not in NOT_FAILURES))


def failure_times(run: RunResult) -> list[float]:
    return sorted(round(r.done_s, 3) for r in run.records if r.status not in NOT_FAILURES)


async def load_with(
    session: aiohttp.ClientSession, target: Target, spec: LoadSpec, disruption, tail_s: float
) -> tuple[RunResult, list[dict[str, Any]], float]:
    """Run the load and, ``spec.warmup_s + 1`` s into it, the disruption; the window ends
    ``tail_s`` after the disruption is over (steady load on the restored set), or at
    ``spec.duration_s`` if that comes first: then the disruption was not inside the window."""
    t0 = time.monotonic()
    over = asyncio.Event()
    load = asyncio.create_task(run_load(session, target, spec, end_window=over))
    await asyncio.sleep(spec.warmup_s + 1.0)
    events = await disruption(t0)
    await asyncio.sleep(tail_s)
    over.set()
    run = await load
    return run, events, time.monotonic() - t0


async def disruption_scenario(
    name: str, replicas: ReplicaSet, workdir: Path, args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    l7 = not name.endswith("-noretry")
    lb = HAProxy(BalancerSpec(replicas.ports, l7_retries=l7, check_inter_ms=args.check_inter_ms), workdir)
    await lb.start()
    try:
        async with client.make_session(timeout_s=30) as session:
            target = await prepare_target(session, lb.url, MODEL, protocol="binary", metrics_url=None)
            # The window covers the whole disruption (3 restarts take ~3 x (drain + start)) and
            # ends --tail-s after it: the window's length is only the most it may take.
            duration = args.rolling_window_s if name.startswith("rolling") else args.kill_window_s
            spec = LoadSpec(
                arrival="poisson", rate=args.rate, warmup_s=2.0, duration_s=duration, seed=seed,
                max_lag_ms=args.max_lag_ms, cooldown_s=10.0, label=name,
            )  # fmt: skip

            async def disruption(t0: float) -> list[dict[str, Any]]:
                if name.startswith("rolling"):
                    return await rolling_restart(replicas, lb, t0)
                return await kill_one(replicas, lb, t0, args.kill_down_s)

            run, events, _ = await load_with(session, target, spec, disruption, args.tail_s)
        counters = await lb.backend_counters()
    finally:
        await lb.stop()
    window_end = run.spec.warmup_s + run.spec.duration_s  # the window as it ran (load_with)
    s = run.summary
    return {
        "scenario": name,
        "l7_retries": l7,
        "rate": args.rate,
        "requests": len([r for r in run.records if r.status != "cancelled"]),
        "failures": failures(run),
        "failure_times_s": failure_times(run)[:50],
        "disruption_inside_window": all(e["done_at_s"] <= window_end for e in events),
        "events": events,
        "window": {k: s[k] for k in WINDOW_KEYS},
        "haproxy": counters,
    }


async def scale_scenario(
    replicas: ReplicaSet, workdir: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """1..N replicas behind the balancer: closed loop (capacity) and open loop (latency at a rate)."""
    rows = []
    model = str(replicas.settings["model"])
    for n in range(1, replicas.count + 1):
        lb = HAProxy(BalancerSpec(replicas.ports[:n], check_inter_ms=args.check_inter_ms), workdir)
        await lb.start()
        runs = []
        try:
            async with client.make_session(timeout_s=30) as session:
                target = await prepare_target(session, lb.url, model, protocol="binary", metrics_url=None)
                closed = LoadSpec(
                    arrival="closed", concurrency=args.concurrency, warmup_s=1.0,
                    duration_s=args.scale_window_s, label=f"concurrency {args.concurrency}",
                )  # fmt: skip
                opened = LoadSpec(
                    arrival="poisson", rate=args.scale_rate, warmup_s=1.0, duration_s=args.scale_window_s,
                    max_lag_ms=args.max_lag_ms, cooldown_s=10.0, seed=7, label=f"poisson {args.scale_rate:g}/s",
                )  # fmt: skip
                for spec in (closed, opened):
                    runs.append(await run_load(session, target, spec))
        finally:
            await lb.stop()
        for run in runs:
            s = run.summary
            rows.append(
                {
                    "replicas": n,
                    "model": model,
                    "mode": s["mode"],
                    "load": run.label,
                    "achieved_rate": s["achieved_rate"],
                    "p50_ms": s["latency_ms"]["p50"],
                    "p99_ms": s["latency_ms"]["p99"],
                    "failed": s["failed"],
                    "errors": s["errors_by_status"],
                    "valid": s["valid"],
                    "invalid_reasons": s["invalid_reasons"],
                }
            )
    return rows


async def slo_scenario(replicas: ReplicaSet, workdir: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The SLO search (highest Poisson rate meeting the objective) on 1 replica and on all of
    them behind the balancer: per-replica capacity, and how far N replicas get from N times it."""
    rows = []
    model = str(replicas.settings["model"])
    objective = Objective(args.slo_ms, args.slo_percentile)
    single: float | None = None
    for n in sorted({1, replicas.count}):
        lb = HAProxy(BalancerSpec(replicas.ports[:n], check_inter_ms=args.check_inter_ms), workdir)
        await lb.start()
        try:
            async with client.make_session(timeout_s=30) as session:
                target = await prepare_target(session, lb.url, model, protocol="binary", metrics_url=None)
                base = LoadSpec(arrival="poisson", warmup_s=1.0, duration_s=3.0, max_lag_ms=args.max_lag_ms,
                                cooldown_s=10.0, seed=11)  # fmt: skip
                start = args.slo_start_rate * n
                limits = SearchLimits(start_rate=start, tolerance=0.05, max_steps=args.slo_steps)
                summary, _ = await find_max_rate(session, target, base, objective, limits)
        finally:
            await lb.stop()
        best = summary["best_rate"]
        if n == 1:
            single = best
        rows.append(
            {
                "replicas": n,
                "model": model,
                "objective": f"p{args.slo_percentile:g} <= {args.slo_ms:g} ms",
                "best_rate": best,
                "lowest_failing_rate": summary["lowest_failing_rate"],
                "stopped_by": summary["stopped_by"],
                "generator_limited": summary["generator_limited"],
                "per_replica": best / n if best else None,
                "vs_n_times_one": best / (n * single) if best and single else None,
                "steps": [
                    {
                        k: step[k]
                        for k in (
                            "rate",
                            "percentile_ms",
                            "passed",
                            "valid",
                            "achieved_rate",
                            "invalid_reasons",
                        )
                    }
                    for step in summary["steps"]
                ],
            }
        )
    return rows


def print_report(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(
        f"\nwattserve replicas behind HAProxy on {cfg['cpus']} CPUs (shared by replicas, HAProxy and generator)"
    )
    if report["disruptions"]:
        d_cfg = cfg["disruptions"]
        print(
            f"\nDisruptions: {d_cfg['model']}, {d_cfg['identity_delay_ms']} ms per batch, max batch "
            f"{d_cfg['max_batch_size']}, {cfg['replicas']} replicas, Poisson {cfg['args']['rate']} req/s"
        )
        print(f"{'scenario':<17}{'L7 retries':>11}{'requests':>10}{'not 200':>9}  {'by status':<26}"
              f"{'p50 ms':>8}{'p99 ms':>9}{'retries':>9}{'redisp.':>9}")  # fmt: skip
        for d in report["disruptions"]:
            lat = d["window"]["latency_ms"]
            bad = sum(d["failures"].values())
            by = ", ".join(f"{k}: {v}" for k, v in sorted(d["failures"].items())) or "-"
            hp = d["haproxy"]
            print(
                f"{d['scenario']:<17}{'on' if d['l7_retries'] else 'off':>11}{d['requests']:>10}{bad:>9}  "
                f"{by:<26}{lat['p50'] or 0:>8.1f}{lat['p99'] or 0:>9.1f}{hp['wretr']:>9}{hp['wredis']:>9}"
            )
    if report["scale"]:
        s_cfg = cfg["scale"]
        print(
            f"\nScaling: {s_cfg['model']}, {s_cfg.get('identity_delay_ms', '-')} ms per batch, max batch "
            f"{s_cfg['max_batch_size']}"
        )
        print(f"{'replicas':>8}  {'load':<18}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'failed':>8}{'valid':>7}")
        for r in report["scale"]:
            print(
                f"{r['replicas']:>8}  {r['load']:<18}{r['achieved_rate']:>9.1f}{r['p50_ms'] or 0:>9.1f}"
                f"{r['p99_ms'] or 0:>9.1f}{r['failed']:>8}{'yes' if r['valid'] else 'no':>7}"
            )


SCENARIOS = ("rolling", "rolling-noretry", "kill", "kill-noretry", "scale", "slo")
DISRUPTIONS = SCENARIOS[:4]
DEFAULT_SCENARIOS = SCENARIOS[:-1]  # the SLO search takes ~3 minutes more: ask for it


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--scenarios", default=",".join(DEFAULT_SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}"
    )
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument(
        "--delay-ms", type=float, default=20.0, help="disruptions: identity compute time per batch"
    )
    p.add_argument("--max-batch-size", type=int, default=8, help="disruptions: max batch")
    p.add_argument(
        "--identity-elements", type=int, default=16, help="disruptions: FP32 elements per request (body size)"
    )
    p.add_argument("--rate", type=float, default=100.0, help="disruptions: Poisson rate (req/s)")
    p.add_argument("--rolling-window-s", type=float, default=20.0,
                   help="the longest window: it must hold the whole rolling restart")  # fmt: skip
    p.add_argument("--kill-window-s", type=float, default=12.0, help="the longest window (kill)")
    p.add_argument("--tail-s", type=float, default=2.0,
                   help="disruptions: the window ends this long after the disruption is over")  # fmt: skip
    p.add_argument("--kill-down-s", type=float, default=2.0, help="how long the killed replica stays dead")
    p.add_argument("--scale-model", default=MODEL, help="scale: model (identity, or e.g. mobilenet_v2)")
    p.add_argument(
        "--scale-delay-ms", type=float, default=100.0, help="scale: identity compute time per batch"
    )
    p.add_argument("--scale-max-batch-size", type=int, default=4)
    p.add_argument("--scale-window-s", type=float, default=6.0)
    p.add_argument("--scale-rate", type=float, default=60.0, help="scale: open-loop Poisson rate (req/s)")
    p.add_argument("--concurrency", type=int, default=24, help="scale: closed-loop concurrency")
    p.add_argument("--slo-ms", type=float, default=400.0, help="slo: latency objective (scale settings)")
    p.add_argument("--slo-percentile", type=float, default=95.0)
    p.add_argument("--slo-start-rate", type=float, default=20.0, help="slo: first rate tried, per replica")
    p.add_argument("--slo-steps", type=int, default=7, help="slo: most runs per search")
    p.add_argument("--check-inter-ms", type=int, default=250, help="HAProxy health check interval")
    p.add_argument("--max-lag-ms", type=float, default=25.0)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "replicas")
    return p.parse_args(argv)


def replica_settings(
    model: str, delay_ms: float, max_batch_size: int, elements: int = 16
) -> dict[str, object]:
    settings: dict[str, object] = {
        "model": model, "max_batch_size": max_batch_size, "max_queue_delay_ms": 2, "batcher": "dynamic",
        "telemetry": "false", "drain_timeout_s": 30,
    }  # fmt: skip
    if model == MODEL:
        settings["identity_delay_ms"] = delay_ms
        settings["identity_elements"] = elements
    return settings


async def run_set(settings: dict[str, object], args: argparse.Namespace, logdir: Path, body) -> Any:
    replicas = ReplicaSet(args.replicas, settings, logdir)
    await replicas.start()
    try:
        return await body(replicas)
    finally:
        await replicas.stop()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    names = [s for s in args.scenarios.split(",") if s]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}; choose from {SCENARIOS}")
    if haproxy_binary() is None:
        raise SystemExit("needs haproxy (Debian: apt-get install haproxy)")
    disruption_settings = replica_settings(MODEL, args.delay_ms, args.max_batch_size, args.identity_elements)
    scale_settings = replica_settings(args.scale_model, args.scale_delay_ms, args.scale_max_batch_size)
    report: dict[str, Any] = {
        "config": {
            "replicas": args.replicas, "cpus": os.cpu_count(), "disruptions": disruption_settings,
            "scale": scale_settings, "args": {k: str(v) for k, v in vars(args).items()},
        },
        "disruptions": [], "scale": [], "slo": [],
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wattserve-replicas-") as tmp:
        workdir = Path(tmp)
        disruptions = [n for n in names if n in DISRUPTIONS]

        async def run_disruptions(replicas: ReplicaSet) -> list[dict[str, Any]]:
            return [
                await disruption_scenario(n, replicas, workdir, args, seed)
                for seed, n in enumerate(disruptions)
            ]

        if disruptions:
            report["disruptions"] = await run_set(
                disruption_settings, args, args.out / "logs", run_disruptions
            )

        async def run_scaling(replicas: ReplicaSet) -> None:
            if "scale" in names:
                report["scale"] = await scale_scenario(replicas, workdir, args)
            if "slo" in names:
                report["slo"] = await slo_scenario(replicas, workdir, args)

        if {"scale", "slo"} & set(names):
            await run_set(scale_settings, args, args.out / "logs-scale", run_scaling)
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    return report


def print_slo(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    print(f"\nSLO search ({rows[0]['objective']}, failures count as misses), scale settings")
    print(
        f"{'replicas':>8}{'best req/s':>12}{'first fail':>12}{'per replica':>13}{'vs n x 1':>10}  stopped by"
    )
    for r in rows:
        ratio = f"{r['vs_n_times_one']:.2f}" if r["vs_n_times_one"] else "-"
        per = f"{r['per_replica']:.1f}" if r["per_replica"] else "-"
        print(
            f"{r['replicas']:>8}{r['best_rate'] or 0:>12.1f}{r['lowest_failing_rate'] or 0:>12.1f}{per:>13}"
            f"{ratio:>10}  {r['stopped_by']}{' (generator limited)' if r['generator_limited'] else ''}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    print_report(report)
    print_slo(report["slo"])
    print(f"\nsaved {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
