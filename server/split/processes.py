"""The two process roles behind ``--frontend-workers N``: their start-up, as the supervisor
launches them (``python -m wattserve.server.split core|frontend``).

Both take the server's settings whole from the supervisor (JSON in ``WATTSERVE_SPLIT_SETTINGS``)
and the folder of the core's sockets (``WATTSERVE_SPLIT_DIR``): the channel (``core.sock``),
the core's HTTP (``http.sock``) and gRPC (``grpc.sock``) servers, private to the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from wattserve.server.settings import Settings

ENV_SETTINGS = "WATTSERVE_SPLIT_SETTINGS"
ENV_DIR = "WATTSERVE_SPLIT_DIR"
ENV_INDEX = "WATTSERVE_SPLIT_INDEX"


@dataclass(frozen=True)
class CoreSockets:
    """Where the engine core listens (a 0700 folder of the supervisor's)."""

    folder: Path

    @property
    def channel(self) -> str:
        return str(self.folder / "core.sock")

    @property
    def http(self) -> str:
        return str(self.folder / "http.sock")

    @property
    def grpc(self) -> str:
        return f"unix:{self.folder / 'grpc.sock'}"


def settings_from_env() -> Settings:
    return Settings(**json.loads(os.environ[ENV_SETTINGS]))


def _setup(settings: Settings, role: str) -> None:
    from wattserve.server.lifecycle import tune_malloc

    line = f"%(asctime)s %(levelname)s {role}[%(process)d] %(name)s: %(message)s"
    logging.basicConfig(level=settings.log_level.upper(), format=line)
    if settings.tune_malloc:
        tune_malloc()
    sys.setswitchinterval(settings.gil_switch_interval_ms / 1000.0)


def run_core(settings: Settings, sockets: CoreSockets) -> None:
    """The engine core: the whole single-process server (models, batchers, engines,
    metrics, model control), reached only through its private sockets."""
    from wattserve.server.app import create_app
    from wattserve.server.lifecycle import DrainingServer, uvicorn_config

    _setup(settings, "core")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sockets.http)
    grpc_address = sockets.grpc if settings.grpc_port else None
    app = create_app(settings, core_channel=sockets.channel, grpc_address=grpc_address)
    config = uvicorn_config(app, settings, uds=sockets.http)
    DrainingServer(config, app.state.models, 0.0).run()


def reuseport_socket(host: str, port: int, listen: bool = True) -> socket.socket:
    """A TCP socket on ``host:port`` that other processes may bind too (SO_REUSEPORT): the
    kernel spreads new connections over the listening ones."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
        sock.set_inheritable(True)
    return sock


def run_frontend(settings: Settings, sockets: CoreSockets) -> None:
    """A front end: the public HTTP and gRPC ports (shared), the core behind."""
    from wattserve.server.core.decode import BodyBudget
    from wattserve.server.grpc.access import GrpcAccessControl
    from wattserve.server.lifecycle import DrainingServer, uvicorn_config
    from wattserve.server.security import parse_restricted_api
    from wattserve.server.split.core_client import CoreClient
    from wattserve.server.split.frontend import FrontEndDrain, FrontEndRuntimes, frontend_app
    from wattserve.server.split.grpc_proxy import FrontEndInference, GrpcRelay
    from wattserve.server.split.http_proxy import CoreHttp

    _setup(settings, "frontend")
    index = int(os.environ.get(ENV_INDEX, "0"))
    client = CoreClient(sockets.channel, settings.frontend_slab_mib << 20, index)
    runtimes = FrontEndRuntimes(client)
    budget = BodyBudget(settings.max_inflight_body_bytes)  # HTTP and gRPC together, as in one process
    core_http = CoreHttp(sockets.http, settings.retry_after_s)
    relay = None
    if settings.grpc_port:
        host = settings.grpc_host or settings.host
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        inference = FrontEndInference(runtimes, settings, budget)
        restrictions = parse_restricted_api(settings.restricted_api)
        guarded = restrictions or settings.api_token
        guard = [GrpcAccessControl(restrictions, settings.api_token)] if guarded else []
        relay = GrpcRelay(f"{host}:{settings.grpc_port}", sockets.grpc, settings.max_body_bytes,
                          settings.max_header_bytes, inference, guard)  # fmt: skip

    @contextlib.asynccontextmanager
    async def grpc_lifespan() -> AsyncIterator[None]:
        if relay is not None:
            await relay.start()
        try:
            yield
        finally:
            if relay is not None:
                await relay.stop(settings.drain_timeout_s)

    app = frontend_app(settings, runtimes, core_http, budget, grpc_lifespan)
    config = uvicorn_config(app, settings)
    server = DrainingServer(config, FrontEndDrain(client), settings.drain_grace_s)

    async def serve() -> None:
        """Listen only once the core is connected: until then the other front ends (or,
        at start-up, the kernel's backlog of the first to listen) take the connections."""
        client.start()
        await client.connected.wait()
        await server.serve(sockets=[reuseport_socket(settings.host, settings.port)])

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(serve())


def main(argv: list[str]) -> int:
    role = argv[0] if argv else ""
    settings = settings_from_env()
    sockets = CoreSockets(Path(os.environ[ENV_DIR]))
    if role == "core":
        run_core(settings, sockets)
    elif role == "frontend":
        run_frontend(settings, sockets)
    else:
        print("usage: python -m wattserve.server.split core|frontend", file=sys.stderr)
        return 2
    return 0
