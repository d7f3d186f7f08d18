"""Real wattserve servers on loopback for tests: in a thread, or as a subprocess
started exactly as a user would (``python -m wattserve serve`` with WATTSERVE_* env)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn
from wattserve.server.app import create_app
from wattserve.server.lifecycle import uvicorn_config
from wattserve.server.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def threaded_server(settings: Settings, engine_factory=None) -> Iterator[tuple[str, object]]:
    """uvicorn in a background thread; yields (base url, app)."""
    kwargs = {"engine_factory": engine_factory} if engine_factory else {}
    if "grpc_port" not in settings.model_fields_set:  # gRPC only where a test asks (8001 is shared)
        settings = settings.model_copy(update={"grpc_port": 0})
    app = create_app(settings, **kwargs)
    port = free_port()
    config = uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
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


class ServerProcess:
    """``python -m wattserve serve`` from ``root`` (default: this checkout; another checkout
    lets a benchmark compare an older version with the same client)."""

    def __init__(self, env: dict[str, str], port: int, root: Path = ROOT) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        full_env = {"WATTSERVE_GRPC_PORT": "0", **os.environ, **env, "WATTSERVE_PORT": str(port),
                    "PYTHONUNBUFFERED": "1"}  # fmt: skip
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"wattserve-test-{port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wattserve", "serve"], env=full_env, cwd=root,
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60) -> int:
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._log.close()


@contextlib.contextmanager
def server_process(env: dict[str, str]) -> Iterator[ServerProcess]:
    proc = ServerProcess(env, free_port())
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
