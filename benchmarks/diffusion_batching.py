"""Iteration-level (continuous) vs request-level (static, dynamic) batching on one diffusion model.

For each policy a real server process serves the default tiny UNet (WATTSERVE_MODEL=
tiny_unet); the project's load generator (``loadgen.runner.run_load``, open-loop Poisson, in
this process) sends KServe v2 infer requests with random seeds and step counts drawn from
``--steps``, at each of ``--rates``. Latency runs from each request's *intended* send time
(no coordinated omission); percentiles come from an HDR histogram; after the window the
arrivals go on until every measured request is answered (static needs the company). Output: a table on the terminal, JSON and
a latency-CDF plot under ``--out`` (default results/diffusion_batching/, gitignored).

    python -m benchmarks.diffusion_batching --rates 1.5,3,5 --requests 120
    python -m benchmarks.diffusion_batching --pipeline text_to_image --mixes "10,20,40;20" --rates 2,4,6

``--pipeline text_to_image`` serves a tiny Stable Diffusion folder (built by
``scripts/build_tiny_sd.py`` into ``--out``, or ``--sd-folder``) as ``stable_diffusion``:
prompts drawn from a few sentences, guidance drawn from {1, 5, 7.5}. ``--mixes`` runs each
rate once per step-count mix (mixes separated by ``;``). The summary prints, per mix and rate,
the iteration-level (continuous) over dynamic mean-latency ratio.

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
TEXT_MODEL = "stable_diffusion"
PROMPTS = ("a photo of a cat", "a painting of a dog in the snow", "an astronaut riding a horse",
           "a blue house by the sea at sunset", "the quick brown fox")  # fmt: skip
GUIDANCE = (1.0, 5.0, 7.5)
COMMON_ENV = {
    "WATTSERVE_MODEL": MODEL,
    "WATTSERVE_TORCH_THREADS": "1",
    "WATTSERVE_MAX_QUEUE_SIZE": "1024",
    # count bound only: the default 3 s time bound sheds static's waiting requests (503),
    # and this benchmark measures latency, not shedding
    "WATTSERVE_MAX_QUEUE_WAIT_S": "0",
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
    mix: str = ""  # the step counts drawn from, e.g. "10,20,40"
    joules_per_image: float | None = None  # metered energy (busy + idle) / images computed, over the run


def infer_body(seed: int, steps: int) -> bytes:
    return json.dumps({"inputs": [
        {"name": "seed", "shape": [1], "datatype": "INT64", "data": [seed]},
        {"name": "steps", "shape": [1], "datatype": "INT32", "data": [steps]},
    ]}).encode()  # fmt: skip


def text_body(rng: np.random.Generator, steps: int) -> bytes:
    """A text-to-image request: a prompt, seed, step count and guidance scale."""
    return json.dumps({"inputs": [
        {"name": "prompt", "shape": [1, 1], "datatype": "BYTES", "data": [str(rng.choice(PROMPTS))]},
        {"name": "seed", "shape": [1, 1], "datatype": "INT64", "data": [int(rng.integers(0, 2**31))]},
        {"name": "steps", "shape": [1, 1], "datatype": "INT32", "data": [steps]},
        {"name": "guidance_scale", "shape": [1, 1], "datatype": "FP32", "data": [float(rng.choice(GUIDANCE))]},
    ]}).encode()  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    wanted = {"wattserve_iteration_state_steps_total", "wattserve_iterations_total", "wattserve_inferences_total",
              "wattserve_energy_joules_total"}  # fmt: skip
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in wanted:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def prepared_requests(count: int, steps: list[int], seed: int, model: str = MODEL) -> list[PreparedRequest]:
    """Distinct requests (random seed, step count drawn from ``steps``), cycled by the loadgen."""
    rng = np.random.default_rng(seed)
    path = f"/v2/models/{model}/infer"
    headers = {"Content-Type": "application/json"}
    if model == TEXT_MODEL:
        return [PreparedRequest(path, text_body(rng, int(rng.choice(steps))), headers) for _ in range(count)]
    return [
        PreparedRequest(path, infer_body(int(rng.integers(0, 2**31)), int(rng.choice(steps))), headers)
        for _ in range(count)
    ]


async def measure(url: str, rate: float, duration_s: float, warmup_s: float, reqs: list[PreparedRequest],
                  seed: int, model: str = MODEL) -> RunResult:  # fmt: skip
    """One open-loop Poisson run with the project's load generator (loadgen.runner.run_load)."""
    target = Target(url, model, "json", reqs, metrics_url=f"{url}/metrics")
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
    latencies = sorted(r.latency_s * 1e3 for r in result.measured() if r.ok)
    steps = after.get("wattserve_iteration_state_steps_total", 0) - before.get(
        "wattserve_iteration_state_steps_total", 0
    )
    calls = after.get("wattserve_iterations_total", 0) - before.get("wattserve_iterations_total", 0)
    images = after.get("wattserve_inferences_total", 0) - before.get("wattserve_inferences_total", 0)
    joules = after.get("wattserve_energy_joules_total", 0) - before.get("wattserve_energy_joules_total", 0)
    nan = float("nan")
    return Run(
        policy=policy, rate=rate, requests=s["sent"], ok=s["completed"], errors=s["errors_by_status"],
        mean_ms=lat["mean"] or nan, p50_ms=lat["p50"] or nan, p95_ms=lat["p95"] or nan,
        p99_ms=lat["p99"] or nan, max_ms=lat["max"] or nan,
        throughput_rps=s["achieved_rate"], achieved_rate_rps=s["offered_rate"],
        client_lag_p99_ms=(s["lag_ms"] or {}).get("p99") or 0.0, valid=s["valid"],
        mean_occupancy=steps / calls if calls else None,
        steps_per_s=steps / wall_s if wall_s > 0 else None,
        latencies_ms=latencies, joules_per_image=joules / images if joules and images else None,
    )  # fmt: skip


@contextlib.contextmanager
def server(policy: str, log_dir: Path, timeout: float = 300, extra: dict | None = None) -> Iterator[str]:
    """``python -m wattserve serve`` for one policy, its output in ``log_dir/<policy>.log``."""
    env = {**COMMON_ENV, **POLICIES[policy], **(extra or {}), "WATTSERVE_LOG_LEVEL": "warning"}
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


def plot(runs: list[Run], path: Path, model: str = MODEL) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    rates = sorted({r.rate for r in runs})
    mixes = list(dict.fromkeys(r.mix for r in runs))
    fig, axes = plt.subplots(len(mixes), len(rates), figsize=(4.2 * len(rates), 3.4 * len(mixes)),
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, (mix, rate) in zip(axes.flat, [(m, r) for m in mixes for r in rates], strict=True):
        for run in (r for r in runs if r.rate == rate and r.mix == mix):
            lat = np.asarray(run.latencies_ms) / 1e3
            if len(lat):
                ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post",
                        label=f"{run.policy} (p95 {run.p95_ms / 1e3:.2f}s)")  # fmt: skip
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"Poisson {rate:g} req/s" + (f", steps {{{mix}}}" if mix else ""), fontsize=9)
        ax.set_xlabel("latency from intended send (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    for row in axes:
        row[0].set_ylabel("fraction of requests")
    fig.suptitle(f"{model}: request-level vs iteration-level batching (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=80 if len(mixes) * len(rates) > 3 else 120)
    plt.close(fig)


def print_table(runs: list[Run]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="diffusion batching: latency from intended send time")
    for col in ("mix", "rate", "policy", "ok/n", "mean ms", "p50 ms", "p95 ms", "p99 ms", "thru req/s",
                "occupancy", "steps/s", "J/image", "lag p99 ms", "valid"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            r.mix, f"{r.rate:g}", r.policy, f"{r.ok}/{r.requests}", f"{r.mean_ms:.0f}", f"{r.p50_ms:.0f}",
            f"{r.p95_ms:.0f}", f"{r.p99_ms:.0f}", f"{r.throughput_rps:.2f}",
            f"{r.mean_occupancy:.2f}" if r.mean_occupancy else "-",
            f"{r.steps_per_s:.0f}" if r.steps_per_s else "-",
            f"{r.joules_per_image:.3g}" if r.joules_per_image else "-",
            f"{r.client_lag_p99_ms:.1f}", "yes" if r.valid else "NO",
        )  # fmt: skip
    Console(width=200).print(table)
    for mix, rate, ratio in ratios(runs):
        print(f"steps {{{mix}}} @ {rate:g}/s: iteration-level / dynamic mean latency = {ratio:.2f}")


def ratios(runs: list[Run]) -> list[tuple[str, float, float]]:
    """(mix, rate, continuous mean / dynamic mean) where both ran."""
    means = {(r.mix, r.rate, r.policy): r.mean_ms for r in runs}
    return [(mix, rate, means[(mix, rate, "continuous")] / means[(mix, rate, "dynamic")])
            for mix, rate, policy in means if policy == "continuous" and (mix, rate, "dynamic") in means]  # fmt: skip


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
    parser.add_argument(
        "--mixes", default=None, help="several step-count mixes, ';' between them (overrides --steps)"
    )
    parser.add_argument("--pipeline", choices=("tiny_unet", "text_to_image"), default="tiny_unet")
    parser.add_argument("--sd-folder", type=Path, default=None,
                        help="text_to_image: a local Stable Diffusion folder (default: build the tiny one)")  # fmt: skip
    parser.add_argument("--device", default=None, help="WATTSERVE_DEVICE of the servers (e.g. cuda:0)")
    parser.add_argument("--fp16", action="store_true", help="WATTSERVE_FP16=1 (CUDA only)")
    parser.add_argument("--policies", default="static,dynamic,continuous")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "diffusion_batching")
    parser.add_argument("--replot", action="store_true", help="redraw table and plot from --out's JSON")
    args = parser.parse_args(argv)
    if args.replot:
        doc = json.loads((args.out / "diffusion_batching.json").read_text())
        runs = [Run(**r) for r in doc["runs"]]
        print_table(runs)
        plot(runs, args.out / "latency_cdf.png", doc.get("model", MODEL))
        return
    rates = [float(r) for r in args.rates.split(",")]
    mixes = [[int(s) for s in mix.split(",")] for mix in (args.mixes or args.steps).split(";")]
    args.out.mkdir(parents=True, exist_ok=True)
    model, extra = MODEL, {}
    if args.pipeline == "text_to_image":
        folder = args.sd_folder or args.out / "tiny-sd"
        if args.sd_folder is None and not (folder / "model_index.json").is_file():
            from scripts.build_tiny_sd import build

            build(folder)
        model = TEXT_MODEL
        extra = {"WATTSERVE_MODEL": model, "WATTSERVE_DIFFUSION_MODEL": str(folder.resolve())}
    if args.device:
        extra["WATTSERVE_DEVICE"] = args.device
    if args.fp16:
        extra["WATTSERVE_FP16"] = "1"

    policies = args.policies.split(",")
    runs: list[Run] = []
    with contextlib.ExitStack() as stack:
        # All servers up at once (idle ones cost no CPU), policies interleaved within each
        # rate: on a shared machine, side by side in time is what makes them comparable.
        urls = {p: stack.enter_context(server(p, args.out, extra=extra)) for p in policies}
        for steps in mixes:
            mix = ",".join(map(str, steps))
            reqs = prepared_requests(4096, steps, args.seed, model)
            for rate in rates:
                for policy in policies:
                    url = urls[policy]
                    wait_idle(url)
                    before, t0 = scrape(url), time.monotonic()
                    duration, warmup = args.requests / rate, args.warmup / rate
                    result = asyncio.run(measure(url, rate, duration, warmup, reqs, args.seed, model))
                    wait_idle(url)
                    run = summarize(policy, rate, result, before, scrape(url), time.monotonic() - t0)
                    run.mix = mix
                    runs.append(run)
                    print(f"{policy:>10} @ {rate:g}/s steps {{{mix}}}: mean {run.mean_ms:.0f} ms, "
                          f"p95 {run.p95_ms:.0f} ms, {run.throughput_rps:.2f} req/s, errors {run.errors}",
                          flush=True)  # fmt: skip
    order = [",".join(map(str, m)) for m in mixes]
    runs.sort(key=lambda r: (order.index(r.mix), r.rate, list(POLICIES).index(r.policy)))
    print_table(runs)
    doc = {
        "model": model,
        "pipeline": args.pipeline,
        "steps_choices": mixes,
        "ratios_continuous_over_dynamic": [
            {"mix": m, "rate": r, "mean_ratio": x} for m, r, x in ratios(runs)
        ],
        "requests_per_run": args.requests,
        "warmup": args.warmup,
        "policies": {p: {**COMMON_ENV, **POLICIES[p], **extra} for p in policies},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": [asdict(r) for r in runs],
    }
    (args.out / "diffusion_batching.json").write_text(json.dumps(doc, indent=1))
    plot(runs, args.out / "latency_cdf.png", model)
    print(f"saved {args.out / 'diffusion_batching.json'} and {args.out / 'latency_cdf.png'}")


if __name__ == "__main__":
    main()
