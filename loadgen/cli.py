"""argparse front end: ``wattserve loadgen ...``, ``wattserve study STUDY.toml`` and
``wattserve report compare A B`` (compare.add_report_parser).

The server's CLI registers both with ``add_loadgen_parser(subparsers)`` and
``add_study_parser(subparsers)``; each sets ``func``, which takes the parsed namespace and
returns the process exit code. ``python -m wattserve.loadgen`` offers the same commands on its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported lazily: `wattserve serve` should not pay for the generator
    from rich.console import Console

    from .runner import LoadSpec

EXIT_INVALID = 3


def parse_rates(text: str) -> list[float]:
    """``"5,10,20"`` or ``"5:50:5"`` (inclusive range) -> list of rates."""
    text = text.strip()
    if ":" in text:
        start, stop, step = (float(p) for p in text.split(":"))
        if step <= 0 or stop < start:
            raise argparse.ArgumentTypeError("range must be start:stop:step with step > 0")
        count = int((stop - start) / step + 1e-9) + 1
        return [round(start + i * step, 9) for i in range(count)]
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad list {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("rates must be positive")
    return values


def parse_ints(text: str) -> list[int]:
    return [int(v) for v in parse_rates(text)]


def _name_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    name, value = text.split("=", 1)
    return name.strip(), value.strip()


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a length >= 0, got {value}")
    return value


def add_loadgen_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "loadgen",
        help="drive a KServe v2 server with open- or closed-loop load and report latency/energy",
        description="Open-loop (scheduled) or closed-loop load against a KServe v2 model; "
        "writes results.json, summary.csv, requests.csv, PNG plots and report.html to --out.",
    )
    add_loadgen_arguments(p)
    p.set_defaults(func=run_loadgen_command, loadgen_parser=p)
    return p


def conflicting_options(args: argparse.Namespace) -> str | None:
    """Why this combination of options cannot mean one thing (one line), or None.

    A combination that would silently ignore an option is refused: ``--slo-ms`` searches for
    the rate, so a rate list next to it would be dropped without a word."""
    closed = args.arrival == "closed"
    if args.slo_ms is not None:
        if args.rates:
            return "--slo-ms searches for the rate itself; it cannot be combined with --rates (drop one)"
        if closed or args.concurrencies:
            return (
                "--slo-ms searches an open-loop rate; "
                "it cannot be combined with --arrival closed or --concurrencies"
            )
        if args.arrival == "trace":
            return "--slo-ms searches a rate; a --arrival trace has its own timestamps"
    elif args.search_start is not None:
        return "--search-start is the first rate of an SLO search: give --slo-ms too"
    if args.rate is not None and args.rates:
        return "--rate and --rates: give one"
    if closed and (args.rate is not None or args.rates):
        return "--arrival closed runs at a concurrency: use --concurrency/--concurrencies, not --rate/--rates"
    if args.concurrencies and not closed:
        return "--concurrencies is for --arrival closed"
    return lm_conflict(args)


def lm_conflict(args: argparse.Namespace) -> str | None:
    """The language-model options' contradictions (one line), or None."""
    lm_only = {"--prompt-len": args.prompt_len, "--output-len": args.output_len, "--dataset": args.dataset,
               "--tokenizer": args.tokenizer, "--ignore-eos": args.ignore_eos or None}  # fmt: skip
    if args.api is None:
        given = [k for k, v in lm_only.items() if v is not None]
        return f"{', '.join(given)}: language-model options need --api" if given else None
    if args.images or args.protocol != "auto" or args.input_data != "random":
        return "--api streams text to a language model: no --images, --binary/--json or --input-data"
    if args.dataset and args.prompt_len:
        return "--dataset gives the prompts: it cannot be combined with --prompt-len"
    if args.tokenizer and not args.dataset:
        return "--tokenizer counts a --dataset's answer lengths: give --dataset too"
    return None


def add_loadgen_arguments(p: argparse.ArgumentParser) -> None:
    """Every ``loadgen`` option, one argument group per concern (as ``--help`` shows them)."""
    _add_target_arguments(p)
    _add_lm_arguments(p)
    _add_load_arguments(p)
    _add_validity_arguments(p)
    _add_search_arguments(p)
    _add_output_arguments(p)


def _add_target_arguments(p: argparse.ArgumentParser) -> None:
    """What to load: server, model, protocol, inputs, timeouts."""
    t = p.add_argument_group("target")
    t.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    t.add_argument("--model", required=True, help="model name on the server")
    proto = t.add_mutually_exclusive_group()
    proto.add_argument(
        "--binary",
        dest="protocol",
        action="store_const",
        const="binary",
        help="binary tensor data extension",
    )
    proto.add_argument("--json", dest="protocol", action="store_const", const="json", help="JSON tensors")
    proto.add_argument(
        "--images",
        metavar="DIR",
        help="upload the images in DIR to /v2/models/{m}/classify instead of tensors",
    )
    p.set_defaults(protocol="auto")
    t.add_argument(
        "--input-shape",
        action="append",
        type=_name_value,
        default=[],
        metavar="NAME=D1,D2",
        help="concrete shape for an input with variable dimensions (with batch dim 1)",
    )
    t.add_argument(
        "--input-value",
        action="append",
        type=_name_value,
        default=[],
        metavar="NAME=V",
        help="fill an input with a constant instead of random data (e.g. steps=20; a string for BYTES)",
    )
    t.add_argument(
        "--input-data",
        default="random",
        metavar="random|zero|FILE|DIR",
        help="what to send, as perf_analyzer's --input-data: random (default), zero, a JSON file "
        '{"data": [{INPUT: VALUE, ...}, ...]} sent round robin, or a directory of one raw file per input',
    )
    t.add_argument(
        "--string-length",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="characters in each random string of a BYTES input (default 128, as perf_analyzer)",
    )
    t.add_argument(
        "--string-data",
        default=None,
        metavar="TEXT",
        help="send TEXT in every element of every BYTES input instead of random strings",
    )
    t.add_argument(
        "--metrics-url",
        default="",
        help="Prometheus metrics of the server (default URL/metrics; 'none' to skip; "
        "Triton: http://host:8002/metrics)",
    )
    t.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    t.add_argument("--ready-timeout", type=float, default=60.0, help="wait this long for /v2/health/ready")


def _add_lm_arguments(p: argparse.ArgumentParser) -> None:
    """A language model's routes, prompts and output lengths (docs/llm.md)."""
    g = p.add_argument_group("language model (streamed tokens: TTFT, TPOT, tokens/s)")
    g.add_argument(
        "--api",
        choices=["generate", "openai-completions", "openai-chat"],
        help="stream from Triton's /v2/models/{m}/generate_stream or OpenAI's /v1/completions or "
        "/v1/chat/completions (stream=true) instead of sending KServe v2 tensors",
    )
    g.add_argument(
        "--prompt-len",
        metavar="DIST",
        help="prompt length in words: fixed:N, uniform:LO,HI or normal:MEAN,STD (default fixed:32)",
    )
    g.add_argument(
        "--output-len",
        metavar="DIST",
        help="max_tokens of each request, same forms (default fixed:64; with --dataset, "
        "the answer's length unless given)",
    )
    g.add_argument(
        "--dataset",
        metavar="FILE",
        help="ShareGPT-like JSON: a list of conversations; the first human turn is the prompt, "
        "the first model turn's length max_tokens",
    )
    g.add_argument(
        "--tokenizer",
        metavar="FOLDER",
        help="count a --dataset's answer lengths in this local tokenizer's tokens (default: words)",
    )
    g.add_argument("--prompts", type=int, default=1000, help="distinct prompts drawn (sent round robin)")
    g.add_argument("--temperature", type=float, default=0.0, help="sent with every request (0: greedy)")
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask the server to generate max_tokens whatever the model says (a field of the body)",
    )


def _add_load_arguments(p: argparse.ArgumentParser) -> None:
    """How to load it: arrival process, rate or concurrency, window, bursts, trace."""
    a = p.add_argument_group("load")
    a.add_argument(
        "--arrival",
        default="poisson",
        choices=["poisson", "constant", "bursty", "trace", "closed"],
        help="open-loop arrival process, or 'closed' for fixed concurrency",
    )
    a.add_argument("--rate", type=float, help="target arrival rate, requests/s (open loop)")
    a.add_argument("--rates", type=parse_rates, help="sweep: '5,10,20' or '5:50:5'")
    a.add_argument("--concurrency", type=int, default=1, help="closed loop: concurrent workers")
    a.add_argument("--concurrencies", type=parse_ints, help="closed-loop sweep: '1,2,4,8'")
    a.add_argument(
        "--max-outstanding",
        type=int,
        default=1024,
        help="open loop: most requests in flight; a request held back by this cap counts as generator lag",
    )
    a.add_argument("--duration", type=float, default=10.0, help="measurement window, seconds")
    a.add_argument("--warmup", type=float, default=2.0, help="warm-up before the window, seconds")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--trace", help="trace file: one timestamp (s) per line, or CSV first column")
    a.add_argument("--trace-scale", type=float, default=1.0, help="stretch (>1) or compress the trace")
    a.add_argument("--burst-factor", type=float, default=4.0, help="bursty: peak rate / mean rate")
    a.add_argument(
        "--burst-low",
        type=float,
        default=0.0,
        help="bursty: low-state rate / mean rate (0 = on/off)",
    )
    a.add_argument("--burst-on", type=float, default=0.5, help="bursty: mean burst length, seconds")
    a.add_argument("--burst-dwell", default="exponential", choices=["exponential", "fixed"])


def _add_validity_arguments(p: argparse.ArgumentParser) -> None:
    """When a run does not count: generator lag and send ratio."""
    v = p.add_argument_group("validity")
    v.add_argument(
        "--max-lag-ms",
        type=float,
        default=10.0,
        help="run invalid when the generator's send lag p99 exceeds this",
    )
    v.add_argument(
        "--min-send-ratio",
        type=float,
        default=0.95,
        help="run invalid when fewer of the window's scheduled requests were sent within it",
    )


def _add_search_arguments(p: argparse.ArgumentParser) -> None:
    """``--slo-ms``: bisect the rate for the highest one meeting the objective."""
    s = p.add_argument_group("SLO search (bisection on rate)")
    s.add_argument("--slo-ms", type=float, help="find the highest rate whose percentile <= this")
    s.add_argument("--percentile", type=float, default=95.0)
    s.add_argument(
        "--search-start",
        type=float,
        help="first rate tried (default --rate, else half the throughput of a 2 s closed-loop probe)",
    )
    s.add_argument("--search-min", type=float, default=0.1)
    s.add_argument("--search-max", type=float, default=100_000.0)
    s.add_argument("--search-tolerance", type=float, default=0.05)
    s.add_argument("--search-steps", type=int, default=12)
    s.add_argument(
        "--min-queries",
        type=int,
        help="queries per step (default: 25 beyond the percentile, e.g. 500 for p95)",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Where results go and what is shown while running."""
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, help="output folder (default results/loadgen-TIMESTAMP)")
    o.add_argument("--title", default=None)
    o.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between /metrics scrapes")
    o.add_argument("--no-progress", action="store_true", help="no live progress display")
    o.add_argument(
        "--fail-invalid",
        action="store_true",
        help=f"exit with status {EXIT_INVALID} when any run is invalid",
    )


def add_study_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "study",
        help="run a grid of models x batching configurations x workloads from a TOML file",
        description="Start the server for each model x batching configuration, run every "
        "workload against it, and write one report with tables, plots and a verdict.",
    )
    add_study_arguments(p)
    p.set_defaults(func=run_study_command)
    return p


def add_study_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", type=Path, help="study TOML file (see studies/example.toml)")
    p.add_argument("--out", type=Path, help="output folder (overrides the file's [study].out)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="print the grid and exit")
    p.add_argument(
        "--short",
        action="store_true",
        help="the CI variant: every configuration and workload with [study.short]'s shorter windows",
    )


def add_report_parser(subparsers: Any) -> argparse.ArgumentParser:
    """``report compare A B [...]``: saved loadgen or study folders on the same plots."""
    p = subparsers.add_parser("report", help="compare saved loadgen or study results")
    sub = p.add_subparsers(dest="report_command", required=True)
    c = sub.add_parser(
        "compare",
        help="draw two or more result folders on the same plots, with a table of ratios",
        description="Each RUN is a folder written by `wattserve loadgen --out` or `wattserve study`. "
        "The first is the baseline of the ratio table (other / baseline at matched rates).",
    )
    c.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="results folders (baseline first)")
    c.add_argument("--names", help="comma-separated names for the folders (default: folder names)")
    c.add_argument("--out", type=Path, help="output folder (default results/compare-A-vs-B)")
    c.set_defaults(func=run_compare_command, compare_parser=c)
    return p


def run_compare_command(args: argparse.Namespace) -> int:
    from .compare import run_compare

    return run_compare(args)


def base_spec(args: argparse.Namespace) -> LoadSpec:
    from .arrivals import BurstSpec, load_trace
    from .runner import LoadSpec

    trace = load_trace(args.trace, args.trace_scale) if args.trace else None
    if args.arrival == "trace" and trace is None:
        raise SystemExit("--arrival trace needs --trace FILE")
    burst = BurstSpec(args.burst_factor, args.burst_low, args.burst_on, args.burst_dwell)
    return LoadSpec(
        arrival=args.arrival,
        rate=args.rate,
        concurrency=args.concurrency,
        max_outstanding=args.max_outstanding,
        warmup_s=args.warmup,
        duration_s=args.duration,
        seed=args.seed,
        burst=burst if args.arrival == "bursty" else None,
        trace=trace,
        max_lag_ms=args.max_lag_ms,
        cooldown_s=args.timeout,
        min_send_ratio=args.min_send_ratio,
        min_queries=args.min_queries or 0,
        scrape_interval_s=args.scrape_interval,
    )


def sweep_specs(args: argparse.Namespace, base: LoadSpec) -> list[LoadSpec]:
    """The run list: one run, a rate sweep, or a concurrency sweep."""
    import dataclasses

    if base.closed:
        levels = args.concurrencies or [args.concurrency]
        return [dataclasses.replace(base, concurrency=c, seed=base.seed + i) for i, c in enumerate(levels)]
    if base.arrival == "trace":
        return [base]
    rates = args.rates or ([args.rate] if args.rate else [])
    if not rates:
        raise SystemExit(f"--arrival {base.arrival} needs --rate or --rates (or --slo-ms to search)")
    return [dataclasses.replace(base, rate=r, seed=base.seed + i) for i, r in enumerate(rates)]


def run_loadgen_command(args: argparse.Namespace) -> int:
    from .runner import run_async

    problem = conflicting_options(args)
    if problem:
        parser = getattr(args, "loadgen_parser", None)
        if parser is None:
            raise SystemExit(f"loadgen: error: {problem}")
        parser.error(problem)  # one line after the usage, exit status 2
    return run_async(_loadgen(args))


async def _loadgen(args: argparse.Namespace) -> int:
    from . import client, report
    from .progress import RichProgress, make_console, step_line
    from .runner import prepare_target, run_load
    from .search import Objective, SearchLimits, find_max_rate, probe_start_rate

    console = make_console()
    base = base_spec(args)
    out = args.out or Path("results") / f"loadgen-{datetime.now():%Y%m%d-%H%M%S}"
    progress = None if args.no_progress else RichProgress(console)
    shapes = {k: [int(d) for d in v.split(",")] for k, v in args.input_shape}
    fixed: dict[str, float | str] = dict(args.input_value)
    protocol = "image" if args.images else args.protocol
    extra: dict[str, Any] = {}
    async with client.make_session(args.timeout) as session:
        try:  # a model that cannot be driven as asked (a variable dimension without
            # --input-shape, input data that does not fit it, a probe it refused): one line
            target = (
                await _lm_target(session, args)
                if args.api
                else await prepare_target(
                    session,
                    args.url,
                    args.model,
                    protocol,
                    args.images,
                    args.seed,
                    shapes,
                    fixed,
                    args.ready_timeout,
                    metrics_url=None if args.metrics_url == "none" else args.metrics_url,
                    string_data=args.string_data,
                    string_length=args.string_length,
                    input_data=args.input_data,
                )
            )
        except (ValueError, RuntimeError) as exc:
            raise SystemExit(f"loadgen: error: {exc}") from None
        console.print(
            f"target {target.url} model {target.model} protocol {target.protocol} "
            f"metrics {'yes' if target.metrics_url else 'not available'}"
        )
        if args.slo_ms is not None:
            objective = Objective(args.slo_ms, args.percentile)
            start = args.search_start or args.rate
            if start is None:
                start, probe = await probe_start_rate(session, target, base)
                extra["search_probe"] = probe
                console.print(probe["line"])
            limits = SearchLimits(
                start_rate=start,
                min_rate=args.search_min,
                max_rate=args.search_max,
                tolerance=args.search_tolerance,
                max_steps=args.search_steps,
                min_queries=args.min_queries,
            )
            summary, runs = await find_max_rate(
                session,
                target,
                base,
                objective,
                limits,
                progress,
                on_step=lambda i, run, verdict: console.print(
                    step_line(i, limits.max_steps, run, objective, verdict)
                ),
            )
            extra["search"] = summary
        else:
            runs = []
            specs = sweep_specs(args, base)
            for i, spec in enumerate(specs):
                runs.append(await run_load(session, target, spec, progress))
                console.print(step_line(i, len(specs), runs[-1]))
    title = args.title or f"wattserve loadgen: {target.model} at {target.url}"
    intro = _search_html(extra.get("search"))
    lm_html = ""
    if args.api:
        from .lm_table import lm_html as make_lm_html

        lm_html = make_lm_html(runs)
    paths = report.write_all(out, runs, title, sys.argv, extra, intro_html=intro, extra_html=lm_html)
    _print_table(console, runs, extra.get("search"))
    if args.api:
        from .lm_table import print_lm_table

        print_lm_table(console, runs)
    console.print(f"wrote {paths['results']} and {paths['report']}")
    if args.fail_invalid and not all(r.summary["valid"] for r in runs):
        return EXIT_INVALID
    return 0


async def _lm_target(session: Any, args: argparse.Namespace) -> Any:
    """The language-model target: items from --dataset or the length distributions."""
    from .lm_target import prepare_lm_target
    from .lm_workload import LengthDist, read_sharegpt, synthetic_items, tokenizer_counter, word_count

    output = LengthDist.parse(args.output_len) if args.output_len else None
    if args.dataset:
        counter = tokenizer_counter(args.tokenizer) if args.tokenizer else word_count
        items = read_sharegpt(args.dataset, counter, args.prompts)
        if output is not None:  # the file's prompts with drawn output lengths
            import dataclasses

            import numpy as np

            lengths = output.sample(len(items), np.random.default_rng(args.seed))
            items = [dataclasses.replace(it, max_tokens=int(n)) for it, n in zip(items, lengths, strict=True)]
        unit = "tokens" if args.tokenizer else "words"
        described = output.describe() if output else f"the first model turn's length in {unit}"
        workload = {"dataset": str(args.dataset), "prompts": len(items), "output_len": described}
    else:
        prompt = LengthDist.parse(args.prompt_len or "fixed:32")
        output = output or LengthDist.parse("fixed:64")
        items = synthetic_items(args.prompts, prompt, output, args.seed)
        workload = {"prompt_len_words": prompt.describe(), "output_len": output.describe(),
                    "prompts": len(items)}  # fmt: skip
    workload.update(api=args.api, temperature=args.temperature, ignore_eos=args.ignore_eos)
    return await prepare_lm_target(
        session, args.url, args.model, args.api, items, workload, args.ready_timeout,
        metrics_url=None if args.metrics_url == "none" else args.metrics_url,
        temperature=args.temperature, ignore_eos=args.ignore_eos,
    )  # fmt: skip


def _search_html(search: dict[str, Any] | None) -> str:
    if not search:
        return ""
    from .htmlreport import fmt, table

    obj = search["objective"]
    head = (
        f"<h2>SLO search</h2><p>Objective: p{obj['percentile']:g} &le; {obj['slo_ms']:g} ms "
        f"(failed requests count as misses; at least {search['min_queries_per_step']} "
        "queries per step). "
        f"Highest passing rate: <b>{fmt(search['best_rate'])}</b> req/s "
        f"(achieved {fmt(search['best_achieved_rate'])} req/s); lowest failing rate "
        f"{fmt(search['lowest_failing_rate'])}; stopped by: {fmt(search['stopped_by'])}.</p>"
    )
    rows = [
        [s["label"], s["rate"], s["achieved_rate"], s["percentile_ms"], s["valid"], s["passed"]]
        for s in search["steps"]
    ]
    return head + table(["step", "rate", "achieved", f"p{obj['percentile']:g} ms", "valid", "passed"], rows)


def _print_table(console: Console, runs: Sequence[Any], search: dict[str, Any] | None) -> None:
    from rich.table import Table

    from .htmlreport import SIMULATED_BANNER, is_simulated

    if is_simulated(runs):
        console.print(f"[bold yellow]{SIMULATED_BANNER}[/bold yellow]")
    table = Table(title="loadgen results (latency ms from intended send time)")
    for col in (
        "run",
        "offered/s",
        "achieved/s",
        "ok",
        "err",
        "p50",
        "p95",
        "p99",
        "p99.9",
        "max",
        "lag p99",
        "avg batch",
        "J/inf",
        "valid",
    ):
        table.add_column(col, justify="right")
    for run in runs:
        s, lat, server = run.summary, run.summary["latency_ms"], run.server or {}
        lag = (s["lag_ms"] or {}).get("p99")
        table.add_row(
            run.label,
            _f(s["offered_rate"]),
            _f(s["achieved_rate"]),
            str(s["completed"]),
            str(s["failed"]),
            _f(lat["p50"]),
            _f(lat["p95"]),
            _f(lat["p99"]),
            _f(lat["p99.9"]),
            _f(lat["max"]),
            _f(lag),
            _f(server.get("avg_batch_size")),
            _f(server.get("energy_per_inference_j")) if server else "n/a",
            "yes" if s["valid"] else "NO",
        )
    console.print(table)
    for run in runs:
        for reason in run.summary["invalid_reasons"]:
            console.print(f"[red]{run.label}: {reason}[/red]")
    if search:
        obj = search["objective"]
        console.print(
            f"highest rate meeting p{obj['percentile']:g} <= {obj['slo_ms']:g} ms: "
            f"{_f(search['best_rate'])} req/s (stopped by {search['stopped_by']})"
        )


def _f(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def run_study_command(args: argparse.Namespace) -> int:
    from .runner import run_async
    from .study import load_study, run_study

    study = load_study(args.study)
    if args.short:
        study = study.shortened()
    if args.out:
        study.study.out = str(args.out)
    if args.dry_run:
        for cfg in study.server_configs():
            print(cfg.label, "->", ", ".join(w.name for w in study.workload))
        return 0
    return run_async(run_study(study, progress=not args.no_progress))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m wattserve.loadgen``: loadgen, study and calibration-server subcommands."""
    from . import calibration_server

    parser = argparse.ArgumentParser(prog="python -m wattserve.loadgen")
    sub = parser.add_subparsers(dest="command", required=True)
    add_loadgen_parser(sub)
    add_study_parser(sub)
    add_report_parser(sub)
    cal = sub.add_parser("calibration-server", help="a trivial KServe v2 identity endpoint")
    calibration_server.add_arguments(cal)
    cal.set_defaults(func=calibration_server.serve)  # returns None: exit status 0 (below)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
