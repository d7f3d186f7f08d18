"""Run one load configuration: open-loop (scheduled arrivals) or closed-loop (fixed concurrency).

Timeline of a run, in seconds from its start ``t0``::

    0 ........ warmup_s ......................... warmup_s + duration_s ... (stragglers)
    warm-up    | measurement window                |   wait for in-flight answers

Open loop: request i is due at ``t0 + schedule[i]`` whatever happened before; its latency runs
from that intended time to the end of its response, so a stall in the server (or in the
generator) is charged to every request it held up. Requests whose intended time falls inside
the window are the measured ones. The generator's send lag (actual start of the HTTP call minus
intended time) is recorded per request.

Closed loop: ``concurrency`` workers each send, wait for the answer, and send again. Latency
runs from the actual send; this is the classic closed-loop measurement that hides queueing
(coordinated omission), offered for comparison and for capacity probing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
import numpy as np

from . import client, payloads, promwindow, stats
from .arrivals import BurstSpec, make_schedule
from .input_data import load_input_data, zero_data
from .payloads import PreparedRequest
from .stats import RequestRecord

CLOSED = "closed"
PROBE_TIMEOUT_S = 5.0
# A probe unanswered after this long: look at the server's queue gauges for it (see _probe).
PROBE_QUEUE_CHECK_S = 0.25
QUEUED = "queued"
QUEUE_GAUGES = ("wattserve_queue_depth{", "nv_inference_pending_request_count{")
# Timestamps come from perf_counter, not loop.time(): uvloop's loop clock is cached per loop
# iteration at millisecond resolution, which is too coarse for sub-millisecond latencies.
now = time.perf_counter


async def sleep_until(deadline: float) -> None:
    """Sleep until ``now() >= deadline`` (timers may fire up to a millisecond early)."""
    while (delay := deadline - now()) > 0:  # noqa: ASYNC110 - a deadline, not a condition
        await asyncio.sleep(delay)


Sender = Callable[..., Awaitable[client.Outcome]]


@dataclass
class Target:
    """A model on a KServe v2 server, with its request bodies prepared."""

    url: str
    model: str
    protocol: str  # resolved: binary, json or image
    requests: list[PreparedRequest]
    metrics_url: str | None  # None when the server has no /metrics
    metadata: dict[str, Any] = field(default_factory=dict)
    # how one request is sent: KServe v2 (read whole) or a language model's stream (lm_client)
    send: Sender = client.send
    workload: dict[str, Any] | None = None  # a language model's prompts and lengths, described

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "protocol": self.protocol,
            "metrics": self.metrics_url is not None,
            "platform": self.metadata.get("platform"),
            "inputs": self.metadata.get("inputs"),
            **({"workload": self.workload} if self.workload else {}),
        }


@dataclass
class LoadSpec:
    """One load configuration. ``arrival`` is poisson/constant/bursty/trace, or closed."""

    arrival: str = "poisson"
    rate: float | None = None
    concurrency: int = 1  # closed loop: workers
    max_outstanding: int = 1024  # open loop: cap on requests in flight (0 = none)
    warmup_s: float = 2.0
    duration_s: float = 10.0
    seed: int = 0
    burst: BurstSpec | None = None
    trace: np.ndarray | None = None
    max_lag_ms: float = 10.0
    # Open loop: the longest the arrivals continue after the window while requests due in
    # it are unanswered (set it to the request timeout: by then every one has an answer).
    cooldown_s: float = 60.0
    min_send_ratio: float = 0.95
    min_queries: int = 0
    scrape_interval_s: float = 1.0
    label: str = ""

    @property
    def closed(self) -> bool:
        return self.arrival == CLOSED

    def describe(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["burst"] = dataclasses.asdict(self.burst) if self.burst else None
        d["trace"] = None if self.trace is None else f"{len(self.trace)} timestamps"
        return d


@dataclass
class RunResult:
    label: str
    spec: LoadSpec
    target: dict[str, Any]
    records: list[RequestRecord]
    summary: dict[str, Any]
    server: dict[str, Any] | None
    power_series: dict[str, list[tuple[float, float]]]
    started_at: str
    extra: dict[str, Any] = field(default_factory=dict)  # study/search labels

    def measured(self) -> list[RequestRecord]:
        """The requests due inside the measurement window (after warm-up), by intended time."""
        w0 = self.spec.warmup_s
        w1 = w0 + self.spec.duration_s
        return [r for r in self.records if w0 <= r.intended_s < w1]

    def slo_percentile_ms(self, percentile: float) -> float:
        """The window's latency percentile with every failed request counted as a miss."""
        inside = self.measured()
        ok = [r.latency_s for r in inside if r.ok]
        return stats.slo_percentile_ms(ok, len(inside) - len(ok), percentile)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            **self.extra,
            "started_at": self.started_at,
            "load": self.spec.describe(),
            "target": self.target,
            **self.summary,
            "server": self.server,
            "power_series": self.power_series,
        }


class ProgressSink(Protocol):
    def start(self, label: str, total_s: float) -> None: ...
    def update(self, elapsed_s: float, live: LiveCounts) -> None: ...
    def stop(self) -> None: ...


@dataclass
class LiveCounts:
    """Counters the progress display reads while the run is going."""

    sent: int = 0
    done: int = 0
    errors: int = 0
    max_lag_ms: float = 0.0

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


async def prepare_target(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    protocol: str = "auto",
    images: str | None = None,
    seed: int = 0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    fixed_values: Mapping[str, float | str] | None = None,
    ready_timeout_s: float = 60.0,
    distinct: int = 16,
    metrics_url: str | None = "",
    string_length: int | None = None,
    string_data: str | None = None,
    input_data: str | None = None,
) -> Target:
    """Wait for readiness, read model metadata, build bodies, and check one request works.

    ``auto`` tries the binary tensor extension first and falls back to JSON when the server
    refuses it. A probe that gets no answer within ``PROBE_TIMEOUT_S``, or that the server's
    queue gauge shows waiting before then, passed validation and sits in the queue (a static
    batcher waiting for a full batch does that), so it counts as accepted; only an error
    answer fails it. ``metrics_url``: "" for ``{url}/metrics``,
    None to read no server metrics. BYTES inputs get random strings of ``string_length`` (None: 128), or
    ``string_data`` in every element (perf_analyzer's ``--string-length``, ``--string-data``);
    ``fixed_values`` names one input's value and comes first. ``input_data``: perf_analyzer's
    ``--input-data`` (``random``, the default; ``zero``; a JSON file or a directory, see
    ``input_data.py``), one request per entry, sent round robin.
    """
    url = url.rstrip("/")
    await client.wait_ready(session, url, ready_timeout_s)
    metadata = await client.get_json(session, f"{url}/v2/models/{model}")
    if images or protocol == "image":
        if not images:
            raise ValueError("protocol image needs --images DIR")
        chosen, reqs = "image", payloads.image_requests(model, images)
    else:
        data_file = input_data if input_data not in (None, "random", "zero") else None
        specs = payloads.input_specs(metadata, shapes, allow_variable=data_file is not None)
        length = payloads.STRING_LENGTH if string_length is None else string_length
        if string_data is not None:
            strings = {s.name: string_data for s in specs if s.datatype == "BYTES"}
            fixed_values = {**strings, **(fixed_values or {})}
        if input_data == "zero":
            fixed_values = {**zero_data(specs), **(fixed_values or {})}
        tensor_sets = None if data_file is None else load_input_data(data_file, specs)
        candidates = ["binary", "json"] if protocol == "auto" else [protocol]
        chosen, reqs, errors = "", [], []
        for proto in candidates:
            count = distinct if proto == "binary" else max(2, distinct // 4)
            try:
                if tensor_sets is not None:
                    trial = payloads.encode_requests(model, specs, proto, tensor_sets)
                else:
                    trial = payloads.tensor_requests(model, specs, proto, count, seed, fixed_values, length)
            except payloads.UnencodableError as exc:  # e.g. non-UTF-8 strings in JSON
                errors.append(f"{proto}: {exc}")
                continue
            out = await _probe(session, url, trial[0], model, metrics_url)
            if out.status in (stats.OK, "timeout", QUEUED):
                chosen, reqs = proto, trial
                break
            errors.append(f"{proto}: HTTP {out.status} {out.detail or ''}".strip())
        if not chosen:
            hint = ""
            if tensor_sets is None and string_data is None and any(s.datatype == "BYTES" for s in specs):
                hint = " (random strings: a model that parses them needs --input-data or --string-data)"
            raise RuntimeError(f"probe request to {model} failed: {'; '.join(errors)}{hint}")
    if chosen == "image":
        out = await _probe(session, url, reqs[0], model, metrics_url)
        if out.status not in (stats.OK, "timeout", QUEUED):
            raise RuntimeError(f"probe image request failed: HTTP {out.status} {out.detail or ''}")
    if metrics_url == "":  # default: the server's own /metrics (Triton serves it on :8002)
        metrics_url = f"{url}/metrics"
    if metrics_url and await client.get_text(session, metrics_url) is None:
        metrics_url = None
    return Target(url, model, chosen, reqs, metrics_url or None, metadata)


async def _probe(
    session: aiohttp.ClientSession, url: str, req: PreparedRequest, model: str, metrics_url: str | None
) -> client.Outcome:
    """The probe's answer; ``QUEUED`` as soon as the server's metrics show a request waiting in
    the model's queue while the probe is unanswered (a static batcher holding it for a full
    batch), instead of waiting out ``PROBE_TIMEOUT_S`` for the same verdict. The probe is then
    cancelled, as on a timeout (the server drops a queued request whose client left)."""
    send = asyncio.ensure_future(client.send(session, url, req, keep_detail=True, timeout_s=PROBE_TIMEOUT_S))
    metrics = f"{url}/metrics" if metrics_url == "" else metrics_url
    while metrics:
        done, _ = await asyncio.wait({send}, timeout=PROBE_QUEUE_CHECK_S)
        if done:
            break
        text = await client.get_text(session, metrics)
        if text is None:
            break
        if _queued(text, model):
            send.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await send
            return client.Outcome(QUEUED)
    return await send


def _queued(metrics_text: str, model: str) -> bool:
    """True when a Prometheus text shows at least one request waiting in ``model``'s queue
    (wattserve's ``wattserve_queue_depth``, Triton's ``nv_inference_pending_request_count``)."""
    label = f'model="{model}"'
    for line in metrics_text.splitlines():
        if line.startswith(QUEUE_GAUGES) and label in line:
            try:
                if float(line.rsplit(" ", 1)[1]) >= 1:
                    return True
            except (IndexError, ValueError):
                continue
    return False


async def run_load(
    session: aiohttp.ClientSession,
    target: Target,
    spec: LoadSpec,
    progress: ProgressSink | None = None,
    end_window: asyncio.Event | None = None,
) -> RunResult:
    """Run one configuration and summarise it (latencies, lag, validity, server window).

    ``end_window`` (open loop): set it to end the measurement window before ``spec.duration_s``
    is up, for a window that must hold an event of unknown length (a rolling restart). The
    window then ends when it is set (at the earliest one scrape interval after the warm-up),
    the load goes on as after any window until every request due in it is answered, and the
    result's ``spec`` has the window's real duration.
    """
    if end_window is not None and spec.closed:
        raise ValueError("end_window ends an open-loop window; a closed loop has none to end")
    loop = asyncio.get_running_loop()
    schedule = None
    if not spec.closed:
        horizon = spec.warmup_s + spec.duration_s + spec.cooldown_s
        schedule = make_schedule(spec.arrival, spec.rate, horizon, spec.seed, spec.burst, spec.trace)
    records: list[RequestRecord] = []
    live = LiveCounts()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    total_s = spec.warmup_s + spec.duration_s
    label = spec.label or _default_label(spec)
    gc.collect()
    t0 = now() + 0.1
    scraper = _Scraper(session, target.metrics_url, t0, spec)
    scrape_task = loop.create_task(scraper.run())
    if progress:
        progress.start(label, total_s)
    ticker = loop.create_task(_tick(progress, live, t0, total_s)) if progress else None
    ender: asyncio.Task[float] | None = None
    try:
        if spec.closed:
            await _closed_loop(session, target, spec, t0, records, live)
        else:
            assert schedule is not None
            open_loop = _OpenLoop(session, target, spec, t0, records, live)
            if end_window is not None:
                ender = loop.create_task(_end_window_on(end_window, t0, spec, open_loop, scraper))
            await open_loop.run(schedule)
        await scrape_task
    finally:
        for task in (ticker, scrape_task, ender):
            if task and not task.done():
                task.cancel()
        if progress:
            progress.stop()
    if ender is not None and ender.done() and not ender.cancelled():
        total_s = ender.result()
        spec = dataclasses.replace(spec, duration_s=total_s - spec.warmup_s)
    records.sort(key=lambda r: r.index)
    scheduled = None if schedule is None else _count_in(schedule, spec.warmup_s, total_s)
    summary = summarize(records, spec, scheduled)
    server, power = scraper.window(target.model, spec)
    return RunResult(label, spec, target.describe(), records, summary, server, power, started_at)


def summarize(records: Sequence[RequestRecord], spec: LoadSpec, scheduled: int | None) -> dict[str, Any]:
    """Counts, rates, latency and lag percentiles, and the validity verdict for one run."""
    w0, w1 = spec.warmup_s, spec.warmup_s + spec.duration_s
    in_window = [r for r in records if w0 <= r.intended_s < w1]
    ok = [r for r in in_window if r.ok]
    failures = len(in_window) - len(ok)
    finished_in_window = sum(1 for r in records if r.ok and w0 <= r.done_s < w1)
    lag = stats.summarize_ms([max(r.lag_s, 0.0) for r in in_window]) if not spec.closed else None
    offered = len(in_window) / spec.duration_s
    target_rate = spec.rate if spec.arrival in ("poisson", "constant", "bursty") else None
    if spec.arrival == "trace" and scheduled is not None:
        target_rate = scheduled / spec.duration_s
    reasons: list[str] = []
    if not in_window:
        reasons.append("no requests were sent inside the measurement window")
    if lag is not None and lag["p99"] is not None and lag["p99"] > spec.max_lag_ms:
        reasons.append(
            f"generator could not keep up: send lag p99 {lag['p99']:.1f} ms > {spec.max_lag_ms:g} ms"
        )
    if not spec.closed and scheduled:
        sent_inside = sum(1 for r in records if w0 <= r.sent_s < w1)
        ratio = sent_inside / scheduled
        if ratio < spec.min_send_ratio:
            reasons.append(
                f"generator could not keep up: sent {100 * ratio:.1f}% of the {scheduled} requests "
                f"scheduled in the window within it (< {100 * spec.min_send_ratio:g}%)"
            )
    if spec.min_queries and len(in_window) < spec.min_queries:
        reasons.append(
            f"{len(in_window)} queries in the window; the percentile needs at least {spec.min_queries}"
        )
    return {
        "mode": "closed" if spec.closed else "open",
        "arrival": spec.arrival,
        "target_rate": target_rate,
        "concurrency": spec.concurrency if spec.closed else None,
        "warmup_s": spec.warmup_s,
        "duration_s": spec.duration_s,
        "scheduled": scheduled,
        "sent": len(in_window),
        "completed": len(ok),
        "failed": failures,
        "error_rate": failures / len(in_window) if in_window else None,
        "errors_by_status": stats.errors_by_status(in_window),
        "offered_rate": offered,
        "achieved_rate": finished_in_window / spec.duration_s,
        "latency_ms": stats.summarize_ms([r.latency_s for r in ok]),
        "lag_ms": lag,
        "client_headers": stats.header_means(ok),
        **lm_summary(ok, records, w0, w1),
        "valid": not reasons,
        "invalid_reasons": reasons,
    }


def lm_summary(
    ok: Sequence[RequestRecord], records: Sequence[RequestRecord], w0: float, w1: float
) -> dict[str, Any]:
    """A language model's figures (``{"lm": ...}``), or nothing for other models: TTFT, TPOT
    and latency percentiles of the window's answered requests, their output tokens and who
    counted them, and tokens/s (the output tokens of the requests answered inside the window,
    over its length: the rule ``achieved_rate`` follows)."""
    if not any(r.output_tokens is not None for r in ok):
        return {}
    finished = [r for r in records if r.ok and w0 <= r.done_s < w1 and r.output_tokens is not None]
    ttft = [t for r in ok if (t := r.ttft_s) is not None]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    tokens = [r.output_tokens for r in ok if r.output_tokens is not None]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "lm": {
            "ttft_ms": stats.summarize_ms(ttft),
            "tpot_ms": stats.summarize_ms(tpot),
            "latency_ms": stats.summarize_ms([r.latency_s for r in ok]),
            "output_tokens": sum(tokens),
            "mean_output_tokens": sum(tokens) / len(tokens) if tokens else None,
            "mean_prompt_tokens": sum(prompts) / len(prompts) if prompts else None,
            "token_source": sorted({r.token_source for r in ok if r.token_source}),
            "output_tokens_per_s": sum(r.output_tokens or 0 for r in finished) / (w1 - w0),
        }
    }


async def _end_window_on(
    event: asyncio.Event, t0: float, spec: LoadSpec, open_loop: _OpenLoop, scraper: _Scraper
) -> float:
    """When ``event`` is set, end the open loop's window and the scraper's (see run_load);
    the window's new end, in seconds after ``t0``."""
    await event.wait()
    total = spec.warmup_s + spec.duration_s
    end = min(max(now() - t0, spec.warmup_s + _scrape_step(spec)), total)
    open_loop.window_end = t0 + end
    scraper.end_at(end)
    return end


class _OpenLoop:
    """One open-loop run: send on schedule; after the window, keep the arrivals coming until
    every request due before the window's end has its answer, then cancel whatever is still
    out. ``owed``: the requests due inside the window; ``extra``: those sent after it only to
    keep the load on.

    Continuing the load past the window keeps the last measured requests in the same
    conditions as the others: a static batcher still gets the arrivals that fill their batch,
    a dynamic one the same queueing. The requests sent after the window are not measured.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        spec: LoadSpec,
        t0: float,
        records: list[RequestRecord],
        live: LiveCounts,
    ) -> None:
        self.session, self.reqs, self.url = session, target.requests, target.url
        self.send = target.send
        self.t0, self.records, self.live = t0, records, live
        self.sem = asyncio.Semaphore(spec.max_outstanding) if spec.max_outstanding > 0 else None
        self.window_end = t0 + spec.warmup_s + spec.duration_s
        self.owed: set[asyncio.Task[None]] = set()  # due before the window's end: must be answered
        self.extra: set[asyncio.Task[None]] = set()  # due after it: load only, cancelled at the end
        self.owed_done = asyncio.Event()

    async def run(self, schedule: np.ndarray) -> None:
        loop = asyncio.get_running_loop()
        behind = 0
        for index, offset in enumerate(schedule.tolist()):
            due = self.t0 + offset
            after = due >= self.window_end
            if after and await self._nothing_owed_by(due):
                break
            if due > now():
                await sleep_until(due)
                behind = 0
            else:
                behind += 1
                if behind >= 64:  # let responses be read while catching up
                    await asyncio.sleep(0)
                    behind = 0
            task = loop.create_task(self._send(index, offset, due))
            if after:
                self.extra.add(task)
                task.add_done_callback(self.extra.discard)
            else:
                self.owed.add(task)
                task.add_done_callback(self._settle)
        await self._finish()

    async def _nothing_owed_by(self, due: float) -> bool:
        """After the window: wait until ``due`` or the last owed answer, whichever is first;
        True when no answer is owed any more (the run is over)."""
        if not self.owed:
            return True
        self.owed_done.clear()
        if due > now():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.owed_done.wait(), due - now())
            if not self.owed:
                return True
        return False

    async def _send(self, index: int, offset: float, due: float) -> None:
        sem, live = self.sem, self.live
        sent = done = due
        out = client.Outcome("cancelled")
        try:
            if sem is not None:
                await sem.acquire()
            try:
                sent = now()
                live.sent += 1
                lag_ms = (sent - due) * 1000.0
                if lag_ms > live.max_lag_ms:
                    live.max_lag_ms = lag_ms
                out = await self.send(self.session, self.url, self.reqs[index % len(self.reqs)])
            finally:
                if sem is not None:
                    sem.release()
        finally:
            done = now()
            # The schedule's own offset, not due - t0: rounding must not move a request
            # across the window's edge.
            _record(self.records, live, index, offset, sent - self.t0, done - self.t0, out, self.t0)

    def _settle(self, task: asyncio.Task[None]) -> None:
        self.owed.discard(task)
        if not self.owed:
            self.owed_done.set()

    async def _finish(self) -> None:
        if self.owed:  # the schedule ran out (trace, or the cooldown limit) before they were answered
            await asyncio.gather(*self.owed)
        for task in list(self.extra):
            task.cancel()
        if self.extra:
            await asyncio.gather(*self.extra, return_exceptions=True)


async def _closed_loop(
    session: aiohttp.ClientSession,
    target: Target,
    spec: LoadSpec,
    t0: float,
    records: list[RequestRecord],
    live: LiveCounts,
) -> None:
    end = t0 + spec.warmup_s + spec.duration_s
    counter = itertools.count()
    reqs, url, send = target.requests, target.url, target.send
    await sleep_until(t0)

    async def worker() -> None:
        while (sent := now()) < end:
            index = next(counter)
            live.sent += 1
            out = await send(session, url, reqs[index % len(reqs)])
            done = now()
            _record(records, live, index, sent - t0, sent - t0, done - t0, out, t0)

    await asyncio.gather(*(worker() for _ in range(max(1, spec.concurrency))))


def _record(
    records: list[RequestRecord],
    live: LiveCounts,
    index: int,
    intended: float,
    sent: float,
    done: float,
    out: client.Outcome,
    t0: float = 0.0,
) -> None:
    record = RequestRecord(
        index, intended, sent, done, out.status, out.queue_ms, out.compute_ms, out.batch_size
    )
    if out.stream is not None:  # a language model's stream: its token times, as offsets
        st = out.stream
        record.first_token_s = None if st.first_s is None else st.first_s - t0
        record.last_token_s = None if st.last_s is None else st.last_s - t0
        record.output_tokens, record.prompt_tokens = st.tokens, st.prompt_tokens
        record.token_source = st.token_source
        if st.tokens > 1 and st.token_events > 1 and st.first_token_s is not None and st.last_s is not None:
            record.tpot_s = (st.last_s - st.first_token_s) / (st.tokens - 1)
    records.append(record)
    live.done += 1
    if out.status != stats.OK:
        live.errors += 1


class _Scraper:
    """Fetches /metrics at window start and end and every ``scrape_interval_s``; parses later."""

    def __init__(self, session: aiohttp.ClientSession, url: str | None, t0: float, spec: LoadSpec):
        self.session, self.url, self.t0, self.spec = session, url, t0, spec
        self.texts: dict[float, str] = {}
        self.start: tuple[float, str] | None = None
        self.end: tuple[float, str] | None = None
        self.w1 = spec.warmup_s + spec.duration_s  # the window's end, s after t0
        self._moved = asyncio.Event()

    def end_at(self, w1: float) -> None:
        """The window ends at ``w1`` (not before the first sample after the warm-up): take the
        end sample then and none after it."""
        self.w1 = w1
        self._moved.set()

    async def run(self) -> None:
        if self.url is None:
            return
        w0 = self.spec.warmup_s
        times = sorted({*np.arange(0.0, self.w1, _scrape_step(self.spec)).round(6).tolist(), w0, self.w1})
        for planned in times:
            t = min(planned, self.w1)
            if self.t0 + t > now():
                with contextlib.suppress(TimeoutError):  # woken early if the window's end moves
                    await asyncio.wait_for(self._moved.wait(), self.t0 + t - now())
                t = min(t, self.w1)
                await sleep_until(self.t0 + t)
            elif t not in (w0, self.w1):
                continue  # behind schedule: skip periodic samples, never the window edges
            text = await client.get_text(self.session, self.url)
            if text is None:
                continue
            at = now() - self.t0
            self.texts[at] = text
            if t == w0:
                self.start = (at, text)
            if t == self.w1:
                self.end = (at, text)
                break

    def window(
        self, model: str, spec: LoadSpec
    ) -> tuple[dict[str, Any] | None, dict[str, list[tuple[float, float]]]]:
        if self.start is None or self.end is None:
            return None, {}
        series = promwindow.merge_texts(self.texts, model)
        start = promwindow.parse(self.start[1], model)
        end = promwindow.parse(self.end[1], model)
        server = promwindow.window_stats(start, end, series, (self.start[0], self.end[0]))
        server["window_s"] = self.end[0] - self.start[0]
        power = promwindow.gauge_series(series, promwindow.is_power)
        return server, power


def _scrape_step(spec: LoadSpec) -> float:
    return max(spec.scrape_interval_s, 0.05)


async def _tick(progress: ProgressSink | None, live: LiveCounts, t0: float, total_s: float) -> None:
    while progress is not None:
        progress.update(min(max(now() - t0, 0.0), total_s), live)
        await asyncio.sleep(0.25)


def _count_in(schedule: np.ndarray, lo: float, hi: float) -> int:
    return int(np.count_nonzero((schedule >= lo) & (schedule < hi)))


def _default_label(spec: LoadSpec) -> str:
    if spec.closed:
        return f"closed c={spec.concurrency}"
    if spec.rate is not None and spec.arrival != "trace":
        return f"{spec.arrival} {spec.rate:g}/s"
    return spec.arrival


def run_async(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed (lower per-request overhead)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)
