"""run_load(end_window=...): a window that must hold an event of unknown length (the rolling
restart of benchmarks/replicas.py) ends when the event is over, not at its longest, and is
summarised as it ran: its real duration, the requests due inside it, the server's counters
read at its real end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from wattserve.loadgen.calibration_server import running_calibration_server
from wattserve.loadgen.client import make_session
from wattserve.loadgen.runner import LoadSpec, prepare_target, run_load

LONGEST_S = 60.0


@asynccontextmanager
async def metrics_server() -> AsyncIterator[tuple[list[int], str]]:
    """A /metrics that counts its scrapes in its inference counter."""
    scrapes: list[int] = []

    async def metrics(_: web.Request) -> web.Response:
        scrapes.append(1)
        text = (
            "# TYPE wattserve_inferences counter\n"
            f'wattserve_inferences_total{{batcher="b",model="identity"}} {len(scrapes)}.0\n'
        )
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield scrapes, f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    finally:
        await runner.cleanup()


async def test_a_window_ended_early_is_summarised_as_it_ran() -> None:
    async with (
        running_calibration_server() as (_, url),
        metrics_server() as (scrapes, metrics_url),
        make_session(30) as session,
    ):
        target = await prepare_target(session, url, "identity", "binary", metrics_url=metrics_url)
        spec = LoadSpec("constant", rate=50, warmup_s=0.3, duration_s=LONGEST_S, scrape_interval_s=0.2)
        over = asyncio.Event()
        load = asyncio.create_task(run_load(session, target, spec, end_window=over))
        await asyncio.sleep(1.0)
        over.set()
        run = await asyncio.wait_for(load, 30)  # not the 60 s window: it ended when told
        scraped = len(scrapes)
        await asyncio.sleep(0.5)
        assert len(scrapes) == scraped  # no sample after the window's end

    assert spec.duration_s == LONGEST_S  # the caller's spec is untouched
    duration = run.spec.duration_s
    assert 0 < duration < LONGEST_S / 2
    s = run.summary
    assert s["duration_s"] == duration
    w1 = run.spec.warmup_s + duration
    inside = [r for r in run.records if run.spec.warmup_s <= r.intended_s < w1]
    assert s["sent"] == len(inside) == s["scheduled"] == s["completed"] > 0
    assert all(r.ok for r in inside)
    assert all(r.intended_s < w1 + 1.0 for r in run.records)  # nothing planned to the old end
    assert run.server is not None  # start and end samples, the end one at the real end
    assert run.server["window_s"] == pytest.approx(duration, abs=0.15)


async def test_a_closed_loop_has_no_window_to_end() -> None:
    async with running_calibration_server() as (_, url), make_session(30) as session:
        target = await prepare_target(session, url, "identity", "binary", metrics_url=None)
        with pytest.raises(ValueError, match="open-loop"):
            await run_load(session, target, LoadSpec("closed", duration_s=1), end_window=asyncio.Event())
