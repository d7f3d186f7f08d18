"""Iteration-level (continuous) vs request-level (static, dynamic) batching on one diffusion model.

For each policy a real server process serves the default tiny UNet (WATTSERVE_MODEL=
tiny_unet); the project's load generator (``loadgen.runner.run_load``, open-loop Poisson, in
this process) sends KServe v2 infer requests with random seeds and step counts drawn from
``--steps``, at each of ``--rates``. Latency runs from each request's *intended* send time
(no coordinated omission); percentiles come from an HDR histogram; after the window the
arrivals go on until every measured request is answered (static needs the company). Output: a table on the terminal, JSON and
a latency-CDF plot under ``--out`` (default results/diffusion_batching/, gitignored).

    python -m benchmarks.diffusion_batching --rates 1.5,3,5 --requests 120

The server runs torch on one thread (WATTSERVE_TORCH_THREADS=1) so that the client has the
other core of a 2-core machine; the policies' settings are in POLICIES below.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from wattserve.loadgen.payloads import PreparedRequest
from wattserve.loadgen.runner import LoadSpec, RunResult, Target, run_load
from wattserve.loadgen.server_process import running_wattserve

from benchmarks._harness import RESULTS, ROOT

MODEL = "tiny_unet"
COMMON_ENV = {
    "WATTSERVE_MODEL": MODEL,
    "WATTSERVE_TORCH_THREADS": "1",
    "WATTSERVE_MAX_QUEUE_SIZE": "1024",
}
POLICIES: dict[str, dict[str, str]] = {
    # static(N): only full batches of N; the lone request waits for N-1 others.
    "static": {"WATTSERVE_BATCHER": "static", "WATTSERVE_MAX_BATCH_SIZE": "4"},
    # dynamic: Triton semantics, up to 8, the oldest waits at most 50 ms for company.
    "dynamic": {
        "WATTSERVE_BATCHER": "dynamic",
        "WATTSERVE_MAX_BATCH_SIZE": "8",
        "WATTSERVE_MAX_QUEUE_DELAY_MS": "50",
    },
    # continuous: the batch is re-formed at every UNet step, up to 8 states.
    "continuous": {"WATTSERVE_BATCHER": "continuous", "WATTSERVE_MAX_BATCH_SIZE": "8"},
}
MAX_LAG_MS = 50.0  # a run whose client sent later than this (p99) is marked invalid


@dataclass
class Run:
    policy: str
    rate: float
    requests: int  # sent inside the measurement window
    ok: int
    errors: dict[str, int]
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    throughput_rps: float  # answers finished inside the window / window length (loadgen's achieved)
    achieved_rate_rps: float  # requests sent inside the window / window length (loadgen's offered)
    client_lag_p99_ms: float
    valid: bool
    mean_occupancy: float | None  # state-steps per UNet call over the whole run (server metric)
    steps_per_s: float | None  # denoising state-steps per second over the run
    latencies_ms: list[float] = field(repr=False, default_factory=list)


def infer_body(seed: int, steps: int) -> bytes:
    return json.dumps({"inputs": [
        {"name": "seed", "shape": [1], "datatype": "INT64", "data": [seed]},
        {"name": "steps", "shape": [1], "datatype": "INT32", "data": [steps]},
    ]}).encode()  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    wanted = {"wattserve_iteration_state_steps_total", "wattserve_iterations_total"}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in wanted:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def prepared_requests(count: int, steps: list[int], seed: int) -> list[PreparedRequest]:
    """Distinct requests (random seed, step count drawn from ``steps``), cycled by the loadgen."""
    rng = np.random.default_rng(seed)
    path = f"/v2/models/{MODEL}/infer"
    headers = {"Content-Type": "application/json"}
    return [
        PreparedRequest(path, infer_body(int(rng.integers(0, 2**31)), int(rng.choice(steps))), headers)
        for _ in range(count)
    ]


async def measure(url: str, rate: float, duration_s: float, warmup_s: float, reqs: list[PreparedRequest],
                  seed: int) -> RunResult:  # fmt: skip
    """One open-loop Poisson run with the project's load generator (loadgen.runner.run_load)."""
    target = Target(url, MODEL, "json", reqs, metrics_url=f"{url}/metrics")
    spec = LoadSpec(arrival="poisson", rate=rate, warmup_s=warmup_s, duration_s=duration_s, seed=seed,
                    max_lag_ms=MAX_LAG_MS, cooldown_s=120.0, label=f"{rate:g}/s")  # fmt: skip
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=300)
    ) as session:
        return await run_load(session, target, spec)


def summarize(policy: str, rate: float, result: RunResult, before: dict, after: dict, wall_s: float) -> Run:
    s = result.summary
    lat = s["latency_ms"]
    w0, w1 = result.spec.warmup_s, result.spec.warmup_s + result.spec.duration_s
    latencies = sorted(r.latency_s * 1e3 for r in result.records if r.ok and w0 <= r.intended_s < w1)
    steps = after.get("wattserve_iteration_state_steps_total", 0) - before.get(
        "wattserve_iteration_state_steps_total", 0
    )
    calls = after.get("wattserve_iterations_total", 0) - before.get("wattserve_iterations_total", 0)
    nan = float("nan")
    return Run(
        policy=policy, rate=rate, requests=s["sent"], ok=s["completed"], errors=s["errors_by_status"],
        mean_ms=lat["mean"] or nan, p50_ms=lat["p50"] or nan, p95_ms=lat["p95"] or nan,
        p99_ms=lat["p99"] or nan, max_ms=lat["max"] or nan,
        throughput_rps=s["achieved_rate"], achieved_rate_rps=s["offered_rate"],
        client_lag_p99_ms=(s["lag_ms"] or {}).get("p99") or 0.0, valid=s["valid"],
        mean_occupancy=steps / calls if calls else None,
        steps_per_s=steps / wall_s if wall_s > 0 else None,
        latencies_ms=latencies,
    )  # fmt: skip


@contextlib.contextmanager
def server(policy: str, log_dir: Path, timeout: float = 300) -> Iterator[str]:
    """``python -m wattserve serve`` for one policy, its output in ``log_dir/<policy>.log``."""
    env = {**COMMON_ENV, **POLICIES[policy], "WATTSERVE_LOG_LEVEL": "warning"}
    log_path = log_dir / f"{policy}.log"
    with running_wattserve(env, root=ROOT, log_path=log_path, ready_timeout_s=timeout) as proc:
        yield proc.url
        if not proc.alive:
            raise RuntimeError(f"{policy} server died (exit {proc.proc.returncode}); see {log_path}")


def wait_idle(url: str, timeout: float = 120) -> None:
    """Wait until the server has nothing queued or running (between rates)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=10).text
        inflight = sum(
            s.value
            for f in text_string_to_metric_families(text)
            if f.name == "wattserve_inflight_requests"
            for s in f.samples
        )
        if inflight == 0:
            return
        time.sleep(0.5)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    rates = sorted({r.rate for r in runs})
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4), sharey=True, squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        for run in (r for r in runs if r.rate == rate):
            lat = np.asarray(run.latencies_ms) / 1e3
            if len(lat):
                ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post",
                        label=f"{run.policy} (p95 {run.p95_ms / 1e3:.2f}s)")  # fmt: skip
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"Poisson {rate:g} req/s")
        ax.set_xlabel("latency from intended send (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0][0].set_ylabel("fraction of requests")
    fig.suptitle(f"{MODEL}: request-level vs iteration-level batching (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(runs: list[Run]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="diffusion batching: latency from intended send time")
    for col in ("rate", "policy", "ok/n", "mean ms", "p50 ms", "p95 ms", "p99 ms", "thru req/s",
                "occupancy", "steps/s", "lag p99 ms", "valid"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            f"{r.rate:g}", r.policy, f"{r.ok}/{r.requests}", f"{r.mean_ms:.0f}", f"{r.p50_ms:.0f}",
            f"{r.p95_ms:.0f}", f"{r.p99_ms:.0f}", f"{r.throughput_rps:.2f}",
            f"{r.mean_occupancy:.2f}" if r.mean_occupancy else "-",
            f"{r.steps_per_s:.0f}" if r.steps_per_s else "-",
            f"{r.client_lag_p99_ms:.1f}", "yes" if r.valid else "NO",
        )  # fmt: skip
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1.5,3,5", help="Poisson rates, requests/s")
    parser.add_argument(
        "--requests",
        type=int,
        default=120,
        help="expected measured requests per run (window = requests / rate)",
    )
    parser.add_argument(
        "--warmup", type=int, default=10, help="expected warm-up requests per run (warm-up = warmup / rate)"
    )
    parser.add_argument("--steps", default="10,20,40", help="step counts, drawn uniformly")
    parser.add_argument("--policies", default="static,dynamic,continuous")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "diffusion_batching")
    parser.add_argument("--replot", action="store_true", help="redraw table and plot from --out's JSON")
    args = parser.parse_args(argv)
    if args.replot:
        doc = json.loads((args.out / "diffusion_batching.json").read_text())
        runs = [Run(**r) for r in doc["runs"]]
        print_table(runs)
        plot(runs, args.out / "latency_cdf.png")
        return
    rates = [float(r) for r in args.rates.split(",")]
    steps = [int(s) for s in args.steps.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)

    policies = args.policies.split(",")
    reqs = prepared_requests(4096, steps, args.seed)
    runs: list[Run] = []
    with contextlib.ExitStack() as stack:
        # All servers up at once (idle ones cost no CPU), policies interleaved within each
        # rate: on a shared machine, side by side in time is what makes them comparable.
        urls = {p: stack.enter_context(server(p, args.out)) for p in policies}
        for rate in rates:
            for policy in policies:
                url = urls[policy]
                wait_idle(url)
                before, t0 = scrape(url), time.monotonic()
                duration, warmup = args.requests / rate, args.warmup / rate
                result = asyncio.run(measure(url, rate, duration, warmup, reqs, args.seed))
                wait_idle(url)
                run = summarize(policy, rate, result, before, scrape(url), time.monotonic() - t0)
                runs.append(run)
                print(f"{policy:>10} @ {rate:g}/s: mean {run.mean_ms:.0f} ms, p95 {run.p95_ms:.0f} ms, "
                      f"{run.throughput_rps:.2f} req/s, errors {run.errors}", flush=True)  # fmt: skip
    runs.sort(key=lambda r: (r.rate, list(POLICIES).index(r.policy)))
    print_table(runs)
    doc = {
        "model": MODEL,
        "steps_choices": steps,
        "requests_per_run": args.requests,
        "warmup": args.warmup,
        "policies": {p: {**COMMON_ENV, **POLICIES[p]} for p in policies},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": [asdict(r) for r in runs],
    }
    (args.out / "diffusion_batching.json").write_text(json.dumps(doc, indent=1))
    plot(runs, args.out / "latency_cdf.png")
    print(f"saved {args.out / 'diffusion_batching.json'} and {args.out / 'latency_cdf.png'}")


if __name__ == "__main__":
    main()
