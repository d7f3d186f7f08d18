"""A minimal KServe v2 endpoint for measuring the load generator itself.

It serves one identity model (FP32, ``elements`` values, echoed back) with no batching and no
model work, so the generator's own limits (its maximum sustainable rate, its send lag) can be
measured apart from any real server. It can also freeze once, for ``stall_s`` seconds, starting
``stall_after_s`` after its first inference: every request that arrives or is in progress during
the freeze waits until it ends. That is the scenario that exposes coordinated omission.

It is not wattserve: no queue, no metrics. Start it with
``python -m wattserve.loadgen calibration-server --port 8009``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

MODEL = "identity"


class CalibrationServer:
    def __init__(
        self,
        elements: int = 16,
        delay_ms: float = 0.0,
        stall_after_s: float | None = None,
        stall_s: float = 1.0,
        binary: bool = True,
    ) -> None:
        self.elements = elements
        self.delay_s = delay_ms / 1000.0
        self.stall_after_s = stall_after_s
        self.stall_s = stall_s
        self.first: float | None = None
        self.stall_until: float | None = None
        self.stalled_requests = 0
        self.count = 0
        self.binary = binary  # False: refuse the binary extension, like a JSON-only server

    def arm_stall(self, after_s: float, stall_s: float = 1.0) -> None:
        """Freeze once, ``after_s`` after the next inference request arrives."""
        self.first, self.stall_until = None, None
        self.stall_after_s, self.stall_s = after_s, stall_s

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_get("/v2", self.server_meta)
        app.router.add_get("/v2/health/live", self.ok)
        app.router.add_get("/v2/health/ready", self.ok)
        app.router.add_get("/v2/models/{model}", self.model_meta)
        app.router.add_get("/v2/models/{model}/ready", self.ok)
        app.router.add_post("/v2/models/{model}/infer", self.infer)
        app.router.add_post("/v2/models/{model}/classify", self.classify)
        return app

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def server_meta(self, request: web.Request) -> web.Response:
        return _json({"name": "loadgen-calibration", "version": "0", "extensions": ["binary_tensor_data"]})

    async def model_meta(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != MODEL:
            return _json({"error": "unknown model"}, 404)
        tensor = {"datatype": "FP32", "shape": [-1, self.elements]}
        return _json(
            {
                "name": MODEL,
                "platform": "calibration",
                "inputs": [{"name": "INPUT0", **tensor}],
                "outputs": [{"name": "OUTPUT0", **tensor}],
            }
        )

    async def _hold(self) -> None:
        """Freeze once, and keep everyone who arrives during the freeze waiting until it ends."""
        now = time.monotonic()
        self.count += 1
        if self.first is None:
            self.first = now
        if (
            self.stall_after_s is not None
            and self.stall_until is None
            and now - self.first >= self.stall_after_s
        ):
            self.stall_until = now + self.stall_s
        if self.stall_until is not None and now < self.stall_until:
            self.stalled_requests += 1
            await asyncio.sleep(self.stall_until - now)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)

    async def infer(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != MODEL:
            return _json({"error": "unknown model"}, 404)
        body = await request.read()
        header_len = request.headers.get("Inference-Header-Content-Length")
        await self._hold()
        if header_len is not None and not self.binary:
            return _json({"error": "binary tensor data extension not supported"}, 400)
        if header_len is not None:
            n = int(header_len)
            header = orjson.loads(body[:n])
            raw = body[n:]
            shape = header["inputs"][0]["shape"]
            out = orjson.dumps(
                {
                    "model_name": MODEL,
                    "outputs": [
                        {
                            "name": "OUTPUT0",
                            "datatype": "FP32",
                            "shape": shape,
                            "parameters": {"binary_data_size": len(raw)},
                        }
                    ],
                }
            )
            return web.Response(
                body=out + raw,
                content_type="application/octet-stream",
                headers={"Inference-Header-Content-Length": str(len(out))},
            )
        req = orjson.loads(body)
        inp = req["inputs"][0]
        return _json(
            {
                "model_name": MODEL,
                "outputs": [
                    {
                        "name": "OUTPUT0",
                        "datatype": "FP32",
                        "shape": inp["shape"],
                        "data": inp["data"],
                    }
                ],
            }
        )

    async def classify(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload = form.get("file")
        if upload is None or not hasattr(upload, "file"):
            return _json({"error": "multipart field 'file' missing"}, 400)
        await self._hold()
        return _json({"model_name": MODEL, "predictions": [{"index": 0, "score": 1.0}]})


@contextlib.asynccontextmanager
async def running_calibration_server(**kwargs: Any) -> AsyncIterator[tuple[CalibrationServer, str]]:
    """A CalibrationServer in this event loop on a free loopback port; yields (server, base
    url). Tests and the coordinated-omission benchmark drive it in-process this way."""
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


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="loadgen calibration-server", description=__doc__)
    add_arguments(parser)
    serve(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8009)
    parser.add_argument("--elements", type=int, default=16)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="fixed service time")
    parser.add_argument(
        "--stall-after-s",
        type=float,
        default=None,
        help="freeze once, this long after the first request",
    )
    parser.add_argument("--stall-s", type=float, default=1.0)
    parser.add_argument("--no-binary", action="store_true", help="refuse the binary extension")


def serve(args: argparse.Namespace) -> None:
    server = CalibrationServer(
        args.elements, args.delay_ms, args.stall_after_s, args.stall_s, not args.no_binary
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(server.app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
