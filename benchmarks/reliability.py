"""Hostile-but-realistic traffic against real wattserve servers on loopback (issue 9).

    python -m benchmarks.reliability [--quick] [--probe NAME ...] [--repo PATH] [--label L]
                                     [--soak-seconds S] [--soak-minutes M] [--json OUT]

Each probe starts its own server exactly as a user would (``python -m wattserve serve`` with
WATTSERVE_* env; ``--repo`` serves another checkout, e.g. an older main, with the same
client), misbehaves in one way, prints a table and adds a row to
``results/reliability-<label>.json``. Probes: overload_identity, overload_mobilenet,
slowloris, idle_connections, odd_bodies, disconnect_storm, fuzz_json, drain, soak,
queue_bound, keepalive_race, mixed_soak (the last is a slow-lane command: not in the default run).
Every loop is bounded in count and time; traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import io
import json
import re
import resource
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table
from wattserve.loadgen.server_process import ServerProcess, wattserve_process

from benchmarks import _hostile_clients as hc
from benchmarks._harness import RESULTS, ROOT, save
from support.fuzz_bodies import IDENTITY, MOBILENET_V2, ModelShape, fuzz_cases, valid_data_json

console = Console(width=160)
HOST = "127.0.0.1"
JSON = {"Content-Type": "application/json"}

# identity with a compute time, so it has a capacity: batches of 2 every 20 ms ~ 100/s
IDENTITY_ENV = {"WATTSERVE_MODEL": "identity", "WATTSERVE_IDENTITY_DELAY_MS": "20",
                "WATTSERVE_MAX_BATCH_SIZE": "2", "WATTSERVE_MAX_QUEUE_DELAY_MS": "0"}  # fmt: skip
MOBILENET_ENV = {"WATTSERVE_MODEL": "mobilenet_v2"}  # defaults otherwise, as a user starts it
COMMON_ENV = {"WATTSERVE_TELEMETRY": "false", "WATTSERVE_DEVICE": "cpu", "WATTSERVE_LOG_LEVEL": "info"}


class Run:
    """What every probe needs: the options, and a way to start a server."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.quick: bool = args.quick
        self.repo: Path = Path(args.repo).resolve()
        self.soak_seconds: float = args.soak_seconds or (30.0 if args.quick else 300.0)
        self.soak_minutes: float = args.soak_minutes or (3.0 if args.quick else 30.0)
        self.hog: bool = not args.no_hog

    @contextlib.contextmanager
    def server(self, env: dict[str, str], nofile_soft: int | None = None) -> Iterator[ServerProcess]:
        """A server from ``--repo``. ``nofile_soft``: the open-file soft limit it starts with
        (a common distribution default is 1024; this shell may have raised its own)."""
        old = resource.getrlimit(resource.RLIMIT_NOFILE)
        if nofile_soft is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile_soft, old[1]), old[1]))
        try:
            proc = wattserve_process({**COMMON_ENV, **env}, root=self.repo).start()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, old)
        try:
            proc.wait_ready(300)
            yield proc
        finally:
            proc.stop()


def infer_url(proc: ServerProcess, model: str) -> str:
    return f"{proc.url}/v2/models/{model}/infer"


def body_for(model: ModelShape) -> bytes:
    return (
        b'{"inputs":[{"name":"%s","shape":[1,%s],"datatype":"FP32","data":%s}]}'
        % (model.input_name.encode(), ",".join(map(str, model.item_shape)).encode(),
           valid_data_json(model).encode())
    )  # fmt: skip


async def latency_ms(url: str, body: bytes, n: int = 5) -> dict[str, Any]:
    """A normal client's experience: median latency of ``n`` requests one after another."""
    async with hc.session() as client:
        outcomes = [await hc.send(client, url, body, JSON, 30.0, 0.0) for _ in range(n)]
    ok = [o.latency_s * 1e3 for o in outcomes if o.status == 200]
    return {"ok": len(ok), "of": n, "median_ms": round(statistics.median(ok), 1) if ok else None}


# ----------------------------------------------------------------------------- overload
def overload(run: Run, model: str) -> dict[str, Any]:
    shape, env = (IDENTITY, IDENTITY_ENV) if model == "identity" else (MOBILENET_V2, MOBILENET_ENV)
    body = body_for(shape)
    seconds = 15.0 if run.quick else 40.0
    with run.server(env) as proc:
        url = infer_url(proc, model)
        baseline = asyncio.run(latency_ms(url, body))
        capacity = asyncio.run(hc.closed_loop_rate(url, body, JSON, concurrency=16,
                                                   seconds=5.0 if run.quick else 10.0))  # fmt: skip
        rate = 3 * capacity
        sampler = hc.RssSampler(proc.proc.pid)
        rss_before = sampler.now_mb()
        with sampler:
            outcomes = asyncio.run(hc.open_loop(url, body, JSON, rate, seconds))
            recovery = asyncio.run(latency_ms(url, body))
            time.sleep(10)
            rss_after = sampler.now_mb()
        row = {
            "model": model, "body": f"JSON {len(body)} B", "capacity_rps": round(capacity, 1),
            "rate_rps": round(rate, 1), "seconds": seconds, **hc.summarize(outcomes),
            "rss_before_mb": round(rss_before), "rss_peak_mb": round(sampler.peak_mb),
            "rss_after_10s_mb": round(rss_after), "baseline_median_ms": baseline["median_ms"],
            "recovery_median_ms": recovery["median_ms"], "recovery_ok": f"{recovery['ok']}/{recovery['of']}",
            **hc.log_counts(proc.log()),
        }  # fmt: skip
    return row


def probe_overload_identity(run: Run) -> dict[str, Any]:
    """3x measured capacity, open loop, identity with a 20 ms compute time."""
    return overload(run, "identity")


def probe_overload_mobilenet(run: Run) -> dict[str, Any]:
    """3x measured capacity, open loop, mobilenet_v2 (CPU) with ~0.9 MB JSON bodies."""
    return overload(run, "mobilenet_v2")


# ----------------------------------------------------------------------------- slow and idle
def probe_slowloris(run: Run) -> dict[str, Any]:
    """Connections that send a request header one byte a second, never finishing it."""
    count, seconds = 64, 20.0 if run.quick else 40.0

    async def slow_client(started: float) -> float | None:
        """Seconds until the server hung up; None if it was still listening at the end."""
        try:
            reader, writer = await asyncio.open_connection(HOST, proc.port)
        except OSError:
            return 0.0
        head = b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
        writer.write(head)
        try:
            while time.monotonic() - started < seconds:
                with contextlib.suppress(asyncio.TimeoutError):
                    if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                        return time.monotonic() - started
                    return time.monotonic() - started  # answered (e.g. 408) counts as hung up
                writer.write(b"X")
                await writer.drain()
            return None
        except (ConnectionError, OSError):
            return time.monotonic() - started
        finally:
            writer.close()

    async def scenario() -> tuple[list[float | None], dict[str, Any]]:
        started = time.monotonic()
        clients = asyncio.gather(*(slow_client(started) for _ in range(count)))
        await asyncio.sleep(min(5.0, seconds / 2))
        normal = await latency_ms(infer_url(proc, "identity"), body_for(IDENTITY))
        return await clients, normal

    with run.server(IDENTITY_ENV) as proc:
        closed, normal = asyncio.run(scenario())
    times = [t for t in closed if t is not None]
    return {
        "connections": count, "seconds": seconds, "closed_by_server": len(times),
        "median_close_s": round(statistics.median(times), 1) if times else None,
        "normal_request_ok": f"{normal['ok']}/{normal['of']}", "normal_median_ms": normal["median_ms"],
    }  # fmt: skip


def probe_idle_connections(run: Run) -> dict[str, Any]:
    """1,100 connections that send nothing, against a server started with the common
    1,024 open-file soft limit: does a normal request still get through, and when does the
    server close the idle ones?"""
    count, watch_s = 1100, 20.0 if run.quick else 60.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client needs >1,100 itself

    async def scenario() -> dict[str, Any]:
        async with hc.idle_connections(HOST, proc.port, count) as readers:
            await asyncio.sleep(1.0)
            async with hc.session() as client:
                outcome = await hc.send(client, infer_url(proc, "identity"), body_for(IDENTITY), JSON,
                                        10.0, 0.0)  # fmt: skip
            closed = await hc.time_to_close(readers, watch_s)
        times = [t for t in closed if t is not None]
        return {
            "opened": len(readers),
            "normal_request": outcome.status or outcome.error,
            "normal_latency_ms": round(outcome.latency_s * 1e3, 1),
            "closed_by_server_within_s": watch_s,
            "closed": len(times),
            "median_close_s": round(statistics.median(times), 1) if times else None,
        }

    try:
        with run.server(IDENTITY_ENV, nofile_soft=1024) as proc:
            row = asyncio.run(scenario())
            after = asyncio.run(latency_ms(infer_url(proc, "identity"), body_for(IDENTITY), 3))
            row["normal_after_ok"] = f"{after['ok']}/{after['of']}"
            log = proc.log()
            row["log_mentions_limit"] = sum(
                w in log.lower() for w in ("too many open files", "limit", "connections")
            )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return row


# ----------------------------------------------------------------------------- odd bodies
LIMIT = 8 * 2**20  # body limit the odd-bodies server runs with


def bomb_png(side: int = 8000) -> bytes:
    """A small PNG that decodes to side x side RGB (192 MB at 8000)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side)).save(buffer, format="PNG")
    return buffer.getvalue()


def multipart(
    data_pieces: Callable[[], Iterator[bytes]], boundary: bytes = b"wattserveboundary"
) -> Iterator[bytes]:
    yield (b"--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n"
           b"Content-Type: image/png\r\n\r\n" % boundary)  # fmt: skip
    yield from data_pieces()
    yield b"\r\n--%s--\r\n" % boundary


def head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def probe_odd_bodies(run: Run) -> dict[str, Any]:
    """Bodies over the limit (declared, chunked, chunked multipart), deep nesting, one huge
    header, a decompression-bomb PNG: the status each gets and what it costs in RSS."""
    block = b"7" * 65536
    png = bomb_png()
    infer, classify = "/v2/models/mobilenet_v2/infer", "/v2/models/mobilenet_v2/classify"
    over = 3 * LIMIT
    nested = b'{"inputs":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases: list[tuple[str, bytes, Callable[[], Any]]] = [
        ("declared over limit", head(infer, {**JSON, "Content-Length": str(over)}),
         lambda: hc.repeated(block, over)),
        ("chunked over limit", head(infer, {**JSON, "Transfer-Encoding": "chunked"}),
         lambda: hc.chunked(hc.repeated(block, over))),
        ("chunked multipart over limit", head(classify, {
            "Content-Type": "multipart/form-data; boundary=wattserveboundary", "Transfer-Encoding": "chunked"}),
         lambda: hc.chunked(multipart(lambda: hc.repeated(block, over)))),
        ("deep nesting 100k", head(infer, {**JSON, "Content-Length": str(len(nested))}), lambda: [nested]),
    ]  # fmt: skip
    for mb in (1, 16, 100):
        big = "a" * (mb * 2**20)
        cases.append((f"header of {mb} MB", head("/v2/health/live", {"X-Big": big}).replace(b"POST", b"GET", 1),
                      lambda: []))  # fmt: skip
    png_body = b"".join(multipart(lambda: iter([png])))
    cases.append((f"PNG bomb 8000x8000 ({len(png) // 1024} KB), raw body",
                  head(classify, {"Content-Type": "image/png", "Content-Length": str(len(png))}), lambda: [png]))  # fmt: skip
    cases.append(("PNG bomb, multipart",
                  head(classify, {"Content-Type": "multipart/form-data; boundary=wattserveboundary",
                                  "Content-Length": str(len(png_body))}), lambda: [png_body]))  # fmt: skip
    rows = []
    with run.server({**MOBILENET_ENV, "WATTSERVE_MAX_BODY_BYTES": str(LIMIT)}) as proc:
        sampler = hc.RssSampler(proc.proc.pid, 0.05)
        for name, request_head, pieces in cases:
            before = sampler.now_mb()
            with hc.RssSampler(proc.proc.pid, 0.05) as watch:
                answer = asyncio.run(hc.raw_request(HOST, proc.port, request_head, pieces(), 60.0))
            rows.append({
                "case": name, "status": answer.status or answer.error,
                "sent_mb": round(answer.bytes_sent / 2**20, 1), "seconds": round(answer.elapsed_s, 2),
                "rss_peak_delta_mb": round(watch.peak_mb - before),
                "rss_kept_mb": round(sampler.now_mb() - before),
            })  # fmt: skip
        # two bombs at once
        before = sampler.now_mb()
        with hc.RssSampler(proc.proc.pid, 0.05) as watch:
            answers = asyncio.run(_together(
                [hc.raw_request(HOST, proc.port, cases[-2][1], [png], 120.0) for _ in range(2)]))  # fmt: skip
        rows.append({"case": "2 PNG bombs at once", "status": ",".join(str(a.status or a.error) for a in answers),
                     "sent_mb": round(sum(a.bytes_sent for a in answers) / 2**20, 1),
                     "seconds": round(max(a.elapsed_s for a in answers), 2),
                     "rss_peak_delta_mb": round(watch.peak_mb - before),
                     "rss_kept_mb": round(sampler.now_mb() - before)})  # fmt: skip
        alive = asyncio.run(latency_ms(infer_url(proc, "mobilenet_v2"), body_for(MOBILENET_V2), 2))
        logs = hc.log_counts(proc.log())
    return {"limit_bytes": LIMIT, "cases": rows, "normal_after_ok": f"{alive['ok']}/{alive['of']}", **logs}


async def _together(coroutines: list) -> list:
    return list(await asyncio.gather(*coroutines))


# ----------------------------------------------------------------------------- disconnect storm
def probe_disconnect_storm(run: Run) -> dict[str, Any]:
    """Clients that send a whole request and hang up at once, and clients that leave in the
    middle of an upload: how much compute is avoided, and does the log flood?"""
    full, mid = (200, 100) if run.quick else (600, 300)
    body = body_for(IDENTITY)
    env = {**IDENTITY_ENV, "WATTSERVE_IDENTITY_DELAY_MS": "50"}  # ~40/s: the storm queues

    async def hang_up_after(request_head: bytes, pieces: list[bytes]) -> None:
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            _, writer = await asyncio.wait_for(asyncio.open_connection(HOST, proc.port), 5)
            for piece in (request_head, *pieces):
                writer.write(piece)
            await writer.drain()
            writer.close()

    async def storm() -> None:
        path = "/v2/models/identity/infer"
        whole = head(path, {**JSON, "Content-Length": str(len(body))})
        partial = head(path, {**JSON, "Content-Length": str(2**20)})
        await asyncio.gather(*(hang_up_after(whole, [body]) for _ in range(full)),
                             *(hang_up_after(partial, [b"[" * 65536]) for _ in range(mid)))  # fmt: skip

    with run.server(env) as proc:
        before = asyncio.run(hc.scrape(proc.url))
        asyncio.run(storm())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the queue is empty and counters settle
            time.sleep(1.0)
            after = asyncio.run(hc.scrape(proc.url))
            if (
                after.get("wattserve_queue_depth", 0) == 0
                and after.get("wattserve_inflight_requests", 0) == 0
            ):
                break
        time.sleep(1.0)
        after = asyncio.run(hc.scrape(proc.url))
        alive = asyncio.run(latency_ms(infer_url(proc, "identity"), body, 3))
        logs = hc.log_counts(proc.log())

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    outcomes: dict[str, int] = {}
    for key in after:
        if key.startswith("wattserve_requests_total{") and delta(key):
            outcome = re.search(r"outcome=([^,}]+)", key)
            name = outcome.group(1) if outcome else key
            outcomes[name] = outcomes.get(name, 0) + int(delta(key))  # summed over other labels
    computed = int(delta("wattserve_inferences_total"))
    return {
        "hung_up_after_request": full, "left_mid_upload": mid, "outcomes": outcomes,
        "computed": computed, "compute_avoided": full - computed,
        "batches": int(delta("wattserve_batch_executions_total")),
        "normal_after_ok": f"{alive['ok']}/{alive['of']}", **logs,
    }  # fmt: skip


# ----------------------------------------------------------------------------- JSON fuzz
def probe_fuzz_json(run: Run) -> dict[str, Any]:
    """Hypothesis-mutated KServe v2 bodies (support/fuzz_bodies.py) on one keep-alive
    connection: answers by status class, 5xx, non-JSON errors, connections dropped."""
    rows = []
    plan = [("identity", IDENTITY, IDENTITY_ENV, 3000),
            ("mobilenet_v2", MOBILENET_V2, MOBILENET_ENV, 300 if run.quick else 3000)]  # fmt: skip
    for model, shape, env, examples in plan:
        with run.server({**env, "WATTSERVE_IDENTITY_DELAY_MS": "0"}) as proc:
            rows.append(_fuzz_one(proc, model, shape, examples))
            rows[-1].update(hc.log_counts(proc.log()))
    return {"models": rows}


def _fuzz_one(proc: ServerProcess, model: str, shape: ModelShape, examples: int) -> dict[str, Any]:
    from hypothesis import HealthCheck, Phase, given, settings

    counts: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    dropped = 0
    conn = http.client.HTTPConnection(HOST, proc.port, timeout=60)
    path = f"/v2/models/{model}/infer"

    def exchange(case) -> tuple[int, str, str]:
        conn.request("POST", path, body=case.body, headers=case.headers)
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("content-type", ""), response.getheader("connection", "")

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=fuzz_cases(shape, valid_data_json(shape)))
    def one(case) -> None:
        nonlocal dropped
        try:
            status, media, connection = exchange(case)
        except (ConnectionError, http.client.HTTPException, OSError):
            dropped += 1  # the server closed the kept-alive connection without saying so
            conn.close()
            status, media, connection = exchange(case)
        key = "504_own_deadline" if status == 504 and case.sets_deadline() else f"{status // 100}xx"
        counts[key] = counts.get(key, 0) + 1
        if key == "5xx" or (status >= 400 and not media.startswith("application/json")):
            if len(failures) < 20:
                failures.append({"status": status, "content_type": media, "connection": connection,
                                 "case": case.describe()})  # fmt: skip
            counts["5xx_or_non_json"] = counts.get("5xx_or_non_json", 0) + 1
        if connection.lower() == "close":
            conn.close()

    try:
        one()
    finally:
        conn.close()
    return {"model": model, "bodies": examples, **counts, "5xx": counts.get("5xx", 0),
            "connection_dropped_silently": dropped, "examples": failures}  # fmt: skip


# ----------------------------------------------------------------------------- drain
def probe_drain(run: Run) -> dict[str, Any]:
    """SIGTERM while an open-loop load runs: every request the server accepted must get an
    answer (200, or 503 while draining); refusals to connect after it closed its listener
    are fine, an accepted request left with no answer (reset, timeout) is lost."""
    seconds, signal_at = (8.0, 3.0) if run.quick else (20.0, 8.0)
    rate = 80.0
    with run.server(IDENTITY_ENV) as proc:
        sent_signal: list[float] = []

        def maybe_signal(elapsed: float) -> None:
            if not sent_signal and elapsed >= signal_at:
                proc.proc.send_signal(signal.SIGTERM)
                sent_signal.append(elapsed)

        outcomes = asyncio.run(hc.open_loop(infer_url(proc, "identity"), body_for(IDENTITY), JSON, rate,
                                            seconds, timeout_s=60.0, during=maybe_signal))  # fmt: skip
        exit_code = proc.proc.wait(90)
        logs = hc.log_counts(proc.log())
    lost = [o for o in outcomes if o.status is None and o.error != "refused"]
    return {
        "rate_rps": rate, "seconds": seconds, "sigterm_at_s": signal_at, **hc.summarize(outcomes),
        "refused_connect": sum(o.error == "refused" for o in outcomes),
        "lost": len(lost), "lost_by": _count(o.error for o in lost),
        "lost_sent_before_sigterm": sum(o.sent_at < signal_at for o in lost), "exit_code": exit_code, **logs,
    }  # fmt: skip


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


# ----------------------------------------------------------------------------- soak
def probe_soak(run: Run) -> dict[str, Any]:
    """A moderate open-loop rate (half of identity's ~100/s) for --soak-seconds: RSS and p99
    per window (a minute; a tenth of the run in --quick), and any answer that went missing."""
    seconds = run.soak_seconds
    window = 60.0 if seconds >= 180 else max(5.0, seconds / 3)
    rate = 50.0
    with run.server(IDENTITY_ENV) as proc:
        sampler = hc.RssSampler(proc.proc.pid)
        rss: list[tuple[float, float]] = []

        async def load() -> list[hc.Outcome]:
            async def watch() -> None:
                start = time.monotonic()
                while time.monotonic() - start < seconds + 1:
                    rss.append((time.monotonic() - start, sampler.now_mb()))
                    await asyncio.sleep(1.0)

            watcher = asyncio.create_task(watch())
            outcomes = await hc.open_loop(
                infer_url(proc, "identity"), body_for(IDENTITY), JSON, rate, seconds
            )
            watcher.cancel()
            return outcomes

        outcomes = asyncio.run(load())
        logs = hc.log_counts(proc.log())
    windows = []
    for i in range(int(np.ceil(seconds / window))):
        lo, hi = i * window, (i + 1) * window
        part = [o for o in outcomes if lo <= o.sent_at < hi]
        summary = hc.summarize(part)
        in_window = [m for t, m in rss if lo <= t < hi] or [float("nan")]
        windows.append({"from_s": lo, "sent": summary["sent"], "ok": summary["ok"],
                        "no_answer": summary["no_answer"], "p99_ms": summary["p99_ms"],
                        "rss_mb": round(max(in_window))})  # fmt: skip
    return {"rate_rps": rate, "seconds": seconds, "window_s": window, **hc.summarize(outcomes),
            "windows": windows, **logs}  # fmt: skip


# ----------------------------------------------------------------------------- queue-time bound
QUEUE_BOUND_S = 3.0  # WATTSERVE_MAX_QUEUE_WAIT_S the queue_bound probe serves with (the default)


def binary_body_for(model: ModelShape) -> tuple[bytes, dict[str, str]]:
    """The same one-row request with its tensor in KServe's binary extension."""
    data = np.full((1, *model.item_shape), 0.5, dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": model.input_name, "shape": [1, *model.item_shape],
                                     "datatype": "FP32", "parameters": {"binary_data_size": len(data)}}]},
                        separators=(",", ":")).encode()  # fmt: skip
    return header + data, {"Content-Type": "application/octet-stream",
                           "Inference-Header-Content-Length": str(len(header))}  # fmt: skip


@contextlib.contextmanager
def cpu_hog(enabled: bool = True) -> Iterator[None]:
    """One busy-looping process beside the server (other load on the machine)."""
    import subprocess

    if not enabled:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def probe_queue_bound(run: Run) -> dict[str, Any]:
    """Admitted requests' queue time (the server's X-Queue-Time-Ms) against
    ``WATTSERVE_MAX_QUEUE_WAIT_S`` under 3x overload, JSON and binary bodies, identity with
    a 20 ms compute time and mobilenet_v2, with a CPU hog beside the server: does the
    bound hold (p99 within 1.2x)?"""
    seconds = 10.0 if run.quick else 30.0
    rows = []
    for model, shape, env in (
        ("identity", IDENTITY, IDENTITY_ENV),
        ("mobilenet_v2", MOBILENET_V2, MOBILENET_ENV),
    ):
        for kind in ("JSON", "binary"):
            body, headers = (body_for(shape), JSON) if kind == "JSON" else binary_body_for(shape)
            with (
                run.server({**env, "WATTSERVE_MAX_QUEUE_WAIT_S": str(QUEUE_BOUND_S)}) as proc,
                cpu_hog(run.hog),
            ):
                url = infer_url(proc, model)
                capacity = asyncio.run(hc.closed_loop_rate(url, body, headers, concurrency=16, seconds=4.0))
                # at least ~150 arrivals, so a p99 means something at mobilenet_v2's few per second
                length = max(seconds, 150 / max(3 * capacity, 0.1))
                outcomes = asyncio.run(hc.open_loop(url, body, headers, 3 * capacity, length))
                logs = hc.log_counts(proc.log())
            summary = hc.summarize(outcomes)
            queue_p99 = summary["queue_p99_ms"]
            rows.append({
                "model": model, "body": f"{kind} {len(body)} B", "capacity_rps": round(capacity, 1),
                "rate_rps": round(3 * capacity, 1), "seconds": round(length), "ok": summary["ok"], "503": summary["503"],
                "no_answer": summary["no_answer"], "queue_p99_ms": queue_p99,
                "bound_ms": QUEUE_BOUND_S * 1e3,
                "ratio": round(queue_p99 / (QUEUE_BOUND_S * 1e3), 2) if queue_p99 is not None else None,
                "p99_ms": summary["p99_ms"], **logs,
            })  # fmt: skip
    return {"seconds": seconds, "cpu_hog": run.hog, "runs": rows}


# ----------------------------------------------------------------------------- keep-alive race
def probe_keepalive_race(run: Run) -> dict[str, Any]:
    """A pooling client (aiohttp: FIFO pool, 15 s idle, the Keep-Alive hint ignored) whose
    loop is busy half the time, reusing a pool of 400 connections at a rate that leaves each
    idle ~5.05 s: the server's idle close meets the client's reuse (what the 30-minute mixed
    soak's big burst left behind: 18 answers lost, "reused before status")."""
    pool, idle_s, seconds = 400, 5.05, 10.0 if run.quick else 20.0
    with run.server({"WATTSERVE_MODEL": "identity"}) as proc:
        outcomes = asyncio.run(_pool_reuse(infer_url(proc, "identity"), pool, idle_s, seconds))
        logs = hc.log_counts(proc.log())
    lost = [o for o in outcomes if o.status is None]
    return {"pool": pool, "idle_s": idle_s, "rate_rps": round(pool / idle_s, 1), "sent": len(outcomes),
            "ok": sum(o.status == 200 for o in outcomes), "no_answer": len(lost),
            "lost_by": _count(f"{o.error}: {o.detail}" for o in lost), **logs}  # fmt: skip


async def _pool_reuse(url: str, pool: int, idle_s: float, seconds: float) -> list[hc.Outcome]:
    body = body_for(IDENTITY)

    async def busy() -> None:  # a client whose loop is busy (the soak's sends big JSON bodies)
        while True:
            time.sleep(0.05)  # noqa: ASYNC251 (blocking on purpose)
            await asyncio.sleep(0.05)

    async with hc.session() as client:
        await asyncio.gather(*(hc.send(client, url, body, JSON, 30.0, 0.0) for _ in range(pool)))
        hog = asyncio.create_task(busy())
        loop = asyncio.get_running_loop()
        start, rate, tasks = loop.time(), pool / idle_s, []
        for i in range(int(rate * seconds)):
            if (delay := start + i / rate - loop.time()) > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(hc.send(client, url, body, JSON, 30.0, loop.time() - start)))
        outcomes = list(await asyncio.gather(*tasks))
        hog.cancel()
    return outcomes


# ----------------------------------------------------------------------------- mixed soak
MIXED_REPO_EXTRA = """
backend: "wattserve"
max_batch_size: 8
dynamic_batching { }
parameters { key: "builtin" value: { string_value: "mobilenet_v2" } }
"""


def probe_mixed_soak(run: Run) -> dict[str, Any]:
    """A slow-lane soak (``--soak-minutes``, 30 by default; not in the default run):
    identity (20 ms) and mobilenet_v2 from one model repository at half their measured
    capacity, the repository's squeeze_onnx unloaded and reloaded every 30 s (and asked
    meanwhile), clients that hang up mid-request (2 a second), and a 3x burst of both
    every 5 minutes (a third of the run when shorter) for 20 s. Per minute: RSS, p99 by
    model, errors by kind; at the end: answers missing, ERROR lines in the log."""
    import tempfile

    from support.model_repository import make_repository

    seconds = run.soak_minutes * 60
    burst_every = 300.0 if seconds >= 900 else seconds / 3
    burst_s = 20.0 if seconds >= 900 else min(20.0, burst_every / 3)
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repository(Path(tmp), broken=False, identity_delay_ms=20)
        (repo / "mobilenet_v2").mkdir()
        (repo / "mobilenet_v2" / "config.pbtxt").write_text(MIXED_REPO_EXTRA)
        env = {"WATTSERVE_MODEL_REPOSITORY": str(repo), "WATTSERVE_MODEL_CONTROL_MODE": "explicit",
               "WATTSERVE_LOAD_MODEL": "*", "WATTSERVE_MAX_QUEUE_DELAY_MS": "2"}  # fmt: skip
        with run.server(env) as proc:
            loads = {"identity": (body_for(IDENTITY), JSON), "mobilenet_v2": (body_for(MOBILENET_V2), JSON)}
            capacity = {m: asyncio.run(hc.closed_loop_rate(infer_url(proc, m), b, h, 8, 4.0))
                        for m, (b, h) in loads.items()}  # fmt: skip
            sampler = hc.RssSampler(proc.proc.pid)
            result = asyncio.run(_mixed(proc, loads, capacity, seconds, burst_every, burst_s, sampler))
            try:  # the server's own word on the connections it closed (header timeout, cap)
                server_closes = {k.split("reason=")[1].rstrip("}"): v
                                 for k, v in asyncio.run(hc.scrape(proc.url)).items()
                                 if k.startswith("wattserve_connections_refused_total")}  # fmt: skip
            except Exception as exc:  # an older server: no such counter, or no /metrics
                server_closes = {"unknown": type(exc).__name__}
            log_text = proc.log()
            logs = hc.log_counts(log_text)
            # the server's after-peak trims (server.lifecycle.IdleTrimmer logs each one)
            logs["trims_after_peak"] = re.findall(
                r"after a peak: (\d+) MB returned to the OS in (\d+) ms", log_text
            )
    window = 60.0
    minutes = []
    outcomes, reloads, rss = result["outcomes"], result["reloads"], result["rss"]
    for i in range(int(np.ceil(seconds / window))):
        lo, hi = i * window, (i + 1) * window
        row: dict[str, Any] = {"minute": i + 1}
        for model in loads:
            part = [o for m, o in outcomes if m == model and lo <= o.sent_at < hi]
            ok = np.array([o.latency_s for o in part if o.status == 200]) * 1e3
            row[f"{model}_sent"] = len(part)
            row[f"{model}_p99_ms"] = round(float(np.percentile(ok, 99)), 1) if len(ok) else None
        errors: dict[str, int] = {}
        for _, o in outcomes:
            if lo <= o.sent_at < hi and o.status != 200:
                key = (
                    str(o.status)
                    if o.status is not None
                    else f"{o.error}: {o.detail}"
                    if o.detail
                    else str(o.error)
                )
                errors[key] = errors.get(key, 0) + 1
        row["errors"] = errors
        row["reload_failures"] = sum(1 for t, ok in reloads if lo <= t < hi and not ok)
        in_window = [m for t, m in rss if lo <= t < hi] or [float("nan")]
        row["rss_mb"] = round(max(in_window))
        row["rss_end_mb"] = round(in_window[-1])  # the minute's last sample: back after a burst?
        minutes.append(row)
    lost = sum(1 for _, o in outcomes if o.status is None)
    lost_at = [f"{o.sent_at:.1f}s {o.error}: {o.detail}" for _, o in outcomes if o.status is None][:40]
    return {"minutes_run": run.soak_minutes, "capacity_rps": {m: round(c, 1) for m, c in capacity.items()},
            "burst_every_s": burst_every, "burst_s": burst_s, "sent": len(outcomes), "no_answer": lost,
            "hung_up_mid_request": result["hung_up"], "reloads": len(reloads),
            "reload_failures": sum(not ok for _, ok in reloads), "server_closed_connections": server_closes,
            "lost_at": lost_at, "per_minute": minutes, **logs}  # fmt: skip


async def _mixed(proc: ServerProcess, loads: dict[str, tuple[bytes, dict[str, str]]], capacity: dict[str, float],
                 seconds: float, burst_every: float, burst_s: float, sampler: hc.RssSampler) -> dict[str, Any]:  # fmt: skip
    """The soak's traffic: per model an open loop at half capacity (3x in bursts), plus
    hang-ups and reloads, for ``seconds``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    outcomes: list[tuple[str, hc.Outcome]] = []
    reloads: list[tuple[float, bool]] = []
    rss: list[tuple[float, float]] = []
    hung_up = 0

    def elapsed() -> float:
        return loop.time() - start

    def in_burst(t: float) -> bool:
        return t >= burst_every and (t % burst_every) < burst_s

    async def model_load(client: Any, model: str) -> None:
        body, headers = loads[model]
        url, base, tasks = infer_url(proc, model), max(capacity[model] / 2, 0.5), []
        next_at = 0.0
        while (t := elapsed()) < seconds:
            if next_at > t:
                await asyncio.sleep(next_at - t)
            sent = elapsed()
            tasks.append(asyncio.create_task(_tagged(model, hc.send(client, url, body, headers, 60.0, sent))))
            next_at += 1.0 / (base * (3 if in_burst(sent) else 1))
        outcomes.extend(await asyncio.gather(*tasks))

    async def hang_ups() -> None:
        nonlocal hung_up
        body = body_for(MOBILENET_V2)
        path = "/v2/models/mobilenet_v2/infer"
        while elapsed() < seconds:
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                _, writer = await asyncio.wait_for(asyncio.open_connection(HOST, proc.port), 5)
                whole = hung_up % 2 == 0  # a whole request then gone, or gone mid-upload
                writer.write(head(path, {**JSON, "Content-Length": str(len(body))}))
                writer.write(body if whole else body[: len(body) // 3])
                await writer.drain()
                writer.close()
                hung_up += 1
            await asyncio.sleep(0.5)

    async def reloader(client: Any) -> None:
        base = proc.url + "/v2/repository/models/squeeze_onnx"
        while elapsed() + 30 < seconds:
            await asyncio.sleep(30)
            ok = True
            for action in ("unload", "load"):
                try:
                    async with client.post(f"{base}/{action}") as r:
                        ok &= r.status == 200
                except Exception:
                    ok = False
            reloads.append((elapsed(), ok))

    async def watch() -> None:
        while elapsed() < seconds + 1:
            rss.append((elapsed(), sampler.now_mb()))
            await asyncio.sleep(1.0)

    async with hc.session() as client:
        await asyncio.gather(model_load(client, "identity"), model_load(client, "mobilenet_v2"), hang_ups(),
                             reloader(client), watch())  # fmt: skip
    return {"outcomes": outcomes, "reloads": reloads, "rss": rss, "hung_up": hung_up}


async def _tagged(model: str, sending: Any) -> tuple[str, hc.Outcome]:
    return model, await sending


# ----------------------------------------------------------------------------- driver
PROBES: dict[str, Callable[[Run], dict[str, Any]]] = {
    "overload_identity": probe_overload_identity,
    "overload_mobilenet": probe_overload_mobilenet,
    "slowloris": probe_slowloris,
    "idle_connections": probe_idle_connections,
    "odd_bodies": probe_odd_bodies,
    "disconnect_storm": probe_disconnect_storm,
    "fuzz_json": probe_fuzz_json,
    "drain": probe_drain,
    "soak": probe_soak,
    "queue_bound": probe_queue_bound,
    "keepalive_race": probe_keepalive_race,
    "mixed_soak": probe_mixed_soak,
}
SLOW_LANE = ("mixed_soak",)  # run only when named (--probe mixed_soak)


def show(name: str, result: dict[str, Any]) -> None:
    """One table per probe: scalars as a two-column table, lists of rows as a grid."""
    nested = {k: v for k, v in result.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
    table = Table(title=name)
    table.add_column("measure")
    table.add_column("value")
    for key, value in result.items():
        if key not in nested:
            table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)
    for key, rows in nested.items():
        grid = Table(title=f"{name}: {key}")
        columns = [c for c in rows[0] if c != "examples"]
        for column in columns:
            grid.add_column(column)
        for row in rows:
            grid.add_row(*(str(row.get(c)) for c in columns))
        console.print(grid)


def key_figures(doc: dict[str, Any]) -> dict[tuple[str, str], str]:
    """The figures docs/reliability.md compares, as {(probe, measure): text}."""
    out: dict[tuple[str, str], str] = {}
    probes = doc.get("probes", {})

    def put(probe: str, measure: str, value: Any) -> None:
        out[(probe, measure)] = "-" if value is None else str(value)

    for name in ("overload_identity", "overload_mobilenet"):
        r = probes.get(name)
        if not r or "failed" in r:
            continue
        put(name, "capacity -> offered (req/s)", f"{r['capacity_rps']} -> {r['rate_rps']}")
        put(name, "200 / 503 / other", f"{r['ok']} / {r['503']} / {r['sent'] - r['ok'] - r['503']}")
        put(name, "503 without Retry-After", r["503_without_retry_after"])
        put(name, "admitted p50 / p99 (ms)", f"{r['p50_ms']} / {r['p99_ms']}")
        put(name, "admitted p99 queue time, server's X-Queue-Time-Ms (ms)", r.get("queue_p99_ms"))
        put(name, "RSS before / peak / +10 s (MB)",
            f"{r['rss_before_mb']} / {r['rss_peak_mb']} / {r['rss_after_10s_mb']}")  # fmt: skip
        put(
            name,
            "normal request before / after (ms)",
            f"{r['baseline_median_ms']} / {r['recovery_median_ms']}",
        )
    if (r := probes.get("slowloris")) and "failed" not in r:
        put("slowloris", f"of {r['connections']} slow connections, closed by server (median s)",
            f"{r['closed_by_server']} ({r['median_close_s']})")  # fmt: skip
        put("slowloris", "normal requests meanwhile", f"{r['normal_request_ok']}, {r['normal_median_ms']} ms")
    if (r := probes.get("idle_connections")) and "failed" not in r:
        put("idle_connections", f"normal request with {r['opened']} idle sockets open", r["normal_request"])
        put("idle_connections", f"idle closed by server within {r['closed_by_server_within_s']} s (median s)",
            f"{r['closed']} ({r['median_close_s']})")  # fmt: skip
    if (r := probes.get("odd_bodies")) and "failed" not in r:
        for case in r["cases"]:
            put("odd_bodies", case["case"], f"{case['status']}, peak +{case['rss_peak_delta_mb']} MB, "
                f"kept +{case['rss_kept_mb']} MB")  # fmt: skip
    if (r := probes.get("disconnect_storm")) and "failed" not in r:
        put("disconnect_storm", f"compute avoided (of {r['hung_up_after_request']} gone clients)",
            r["compute_avoided"])  # fmt: skip
        put("disconnect_storm", "outcomes counted", json.dumps(r["outcomes"]))
        put("disconnect_storm", f"ERROR lines / tracebacks ({r['left_mid_upload']} left mid-upload)",
            f"{r['error_lines']} / {r['traceback_lines']}")  # fmt: skip
    if (r := probes.get("fuzz_json")) and "failed" not in r:
        for m in r["models"]:
            put("fuzz_json", f"{m['model']}: 5xx of {m['bodies']} bodies (504 for a body's own deadline)",
                f"{m['5xx']} ({m.get('504_own_deadline', 0)})")  # fmt: skip
            put("fuzz_json", f"{m['model']}: connections dropped silently", m["connection_dropped_silently"])
    if (r := probes.get("drain")) and "failed" not in r:
        put("drain", "sent, no HTTP answer (of them sent before SIGTERM)",
            f"{r['lost']} {json.dumps(r['lost_by'])} ({r['lost_sent_before_sigterm']})")  # fmt: skip
        put("drain", "200 / 503 / refused to connect", f"{r['ok']} / {r['503']} / {r['refused_connect']}")
    if (r := probes.get("soak")) and "failed" not in r:
        windows = r["windows"]
        put("soak", f"p99 per {r['window_s']:.0f} s window (ms)", " ".join(str(w["p99_ms"]) for w in windows))
        put("soak", "RSS per window (MB)", " ".join(str(w["rss_mb"]) for w in windows))
        put("soak", "no answer / errors", f"{r['no_answer']} / {r['5xx_other']}")
    if (r := probes.get("keepalive_race")) and "failed" not in r:
        put("keepalive_race", f"no answer of {r['sent']} (pool {r['pool']}, idle {r['idle_s']} s)",
            f"{r['no_answer']} {json.dumps(r['lost_by'])}")  # fmt: skip
    for name, r in probes.items():
        if "failed" in r:
            put(name, "probe failed", r["failed"][:120])
    return out


def compare(before_path: str, after_path: str) -> str:
    """A Markdown before/after table of two saved runs."""
    before = key_figures(json.loads(Path(before_path).read_text()))
    after = key_figures(json.loads(Path(after_path).read_text()))
    keys = list(dict.fromkeys([*before, *after]))
    lines = ["| probe | measure | before | after |", "| --- | --- | --- | --- |"]
    lines += [f"| {p} | {m} | {before.get((p, m), 'n/a')} | {after.get((p, m), 'n/a')} |" for p, m in keys]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="shorter loads, 30 s soak, fewer mobilenet fuzz bodies"
    )
    parser.add_argument("--probe", nargs="+", choices=sorted(PROBES), help="run only these probes")
    parser.add_argument(
        "--repo", default=str(ROOT), help="checkout whose server to start (default: this one)"
    )
    parser.add_argument(
        "--label", default=None, help="results/reliability-<label>.json (default: the repo's name)"
    )
    parser.add_argument(
        "--soak-seconds", type=float, default=None, help="soak length (default 300; --quick 30)"
    )
    parser.add_argument("--soak-minutes", type=float, default=None,
                        help="mixed_soak length in minutes (default 30; --quick 3)")  # fmt: skip
    parser.add_argument("--no-hog", action="store_true",
                        help="queue_bound without the CPU hog beside the server")  # fmt: skip
    parser.add_argument("--json", default=None, help="also write the JSON here")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="print a Markdown before/after table of two saved runs, run nothing")  # fmt: skip
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
        return 0
    run = Run(args)
    label = args.label or run.repo.name
    doc: dict[str, Any] = {"repo": str(run.repo), "quick": run.quick, "probes": {}}
    previous = RESULTS / f"reliability-{label}.json"
    if args.probe and previous.exists():  # a rerun of some probes updates the label's file
        doc = json.loads(previous.read_text())
    doc["started"] = time.strftime("%FT%TZ", time.gmtime())
    for name in args.probe or [p for p in PROBES if p not in SLOW_LANE]:
        console.rule(f"{name} ({label})")
        start = time.monotonic()
        try:
            result = PROBES[name](run)
        except Exception as exc:  # a probe that cannot finish is a finding too; go on
            result = {"failed": f"{type(exc).__name__}: {exc}"[:2000]}
        result["probe_seconds"] = round(time.monotonic() - start, 1)
        doc["probes"][name] = result
        show(name, result)
        path = save(f"reliability-{label}", doc)  # after every probe: a partial run still counts
    console.print(f"saved {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
