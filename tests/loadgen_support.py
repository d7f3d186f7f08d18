"""Helpers for the load generator's tests: the calibration endpoint on loopback, in-process."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from wattserve.loadgen.calibration_server import CalibrationServer


@contextlib.asynccontextmanager
async def calibration_server(**kwargs: Any) -> AsyncIterator[tuple[CalibrationServer, str]]:
    """A CalibrationServer listening on a free loopback port; yields (server, base url)."""
    server = CalibrationServer(**kwargs)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
