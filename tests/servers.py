"""Real wattserve servers on loopback for tests: in a thread, or as a subprocess started
exactly as a user would, through the project's one harness (wattserve.loadgen.server_process)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import uvicorn
from wattserve.loadgen.server_process import (
    ServerProcess,
    free_port,
    running_wattserve,
    server_env,
    wattserve_process,
)
from wattserve.server.app import create_app
from wattserve.server.lifecycle import uvicorn_config
from wattserve.server.settings import Settings

__all__ = [
    "ROOT", "ServerProcess", "free_port", "server_process", "server_processes", "threaded_server",
    "wattserve_process",
]  # fmt: skip

ROOT = Path(__file__).resolve().parent.parent


# WATTSERVE_TEST_FRONTEND_WORKERS=N (N > 1): every threaded_server without a custom engine
# factory runs as N front-end processes over an engine core instead (the app it yields is
# None then), so the client-facing suites (tests/conformance) run against the split server.
SPLIT_WORKERS = int(os.environ.get("WATTSERVE_TEST_FRONTEND_WORKERS", "1"))
SPLIT_SERVE = (
    "import json, os, sys\n"
    "from wattserve.server.settings import Settings\n"
    "from wattserve.server.split.supervisor import serve\n"
    "sys.exit(serve(Settings(**json.loads(os.environ['WATTSERVE_TEST_SETTINGS']))))\n"
)


@contextlib.contextmanager
def threaded_server(settings: Settings, engine_factory=None) -> Iterator[tuple[str, object]]:
    """uvicorn in a background thread; yields (base url, app)."""
    kwargs = {"engine_factory": engine_factory} if engine_factory else {}
    if "grpc_port" not in settings.model_fields_set:  # gRPC only where a test asks (8001 is shared)
        settings = settings.model_copy(update={"grpc_port": 0})
    if SPLIT_WORKERS > 1 and engine_factory is None:
        with split_server(settings, SPLIT_WORKERS) as url:
            # what a client-facing test reads of the app: its settings and gRPC port (a test
            # that reads in-process state, the model set or the loggers, fails here: no such
            # state in this process)
            grpc = SimpleNamespace(port=settings.grpc_port) if settings.grpc_port else None
            yield url, SimpleNamespace(state=SimpleNamespace(settings=settings, grpc=grpc))
        return
    app = create_app(settings, **kwargs)
    # the socket is bound here and handed to uvicorn: a port only looked up (free_port) could be
    # taken by another test worker before uvicorn bound it ("address already in use", seen in CI)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        listener.close()


@contextlib.contextmanager
def split_server(settings: Settings, workers: int) -> Iterator[str]:
    """``settings`` served by ``workers`` front-end processes over an engine core; its url."""
    port = free_port()
    settings = settings.model_copy(update={"frontend_workers": workers, "port": port, "host": "127.0.0.1"})
    env = server_env()
    env["WATTSERVE_TEST_SETTINGS"] = json.dumps(settings.model_dump(mode="json", exclude_unset=True))
    with ServerProcess([sys.executable, "-c", SPLIT_SERVE], env, port, ready_timeout_s=180) as proc:
        yield proc.url


@contextlib.contextmanager
def server_process(env: dict[str, str]) -> Iterator[ServerProcess]:
    """``python -m wattserve serve`` with these WATTSERVE_* variables, ready for the block."""
    with running_wattserve(env, ready_timeout_s=180) as proc:
        yield proc


@contextlib.contextmanager
def server_processes(*envs: dict[str, str]) -> Iterator[list[ServerProcess]]:
    """One ``server_process`` per env, all started before any is waited for (their starts
    overlap: ready in about the time of the slowest), every one stopped after the block."""
    with contextlib.ExitStack() as stack:
        procs = []
        for env in envs:
            proc = wattserve_process(env)
            stack.callback(proc.stop)
            procs.append(proc.start())
        for proc in procs:
            proc.wait_ready(180)
        yield procs
