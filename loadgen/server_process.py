"""Start a server as a subprocess, wait until it is ready, and stop it the way operators do."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp

DEFAULT_COMMAND = ("{python}", "-m", "wattserve", "serve", "--port", "{port}")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One server subprocess with its output in ``log_path``.

    ``start`` launches it; ``wait_ready`` polls ``GET /v2/health/ready`` until 200 (and fails
    early, with the log's tail, if the process dies); ``stop`` sends SIGTERM, lets it drain for
    ``stop_timeout_s``, then kills it.
    """

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        port: int,
        log_path: Path,
        cwd: str | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.command = [c.format(python=sys.executable, port=port) for c in command]
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.exit_code: int | None = None
        self.killed = False

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command,
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C on the study does not hit the server mid-run
            )
        finally:
            log.close()

    async def wait_ready(self, timeout_s: float) -> float:
        """Seconds until ready; raises RuntimeError if it exits or is not ready in time."""
        assert self.proc is not None
        t0 = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(
                        f"server exited with code {self.proc.returncode} before it was ready:\n"
                        + self.log_tail()
                    )
                try:
                    async with session.get(self.url + "/v2/health/ready") as resp:
                        if resp.status == 200:
                            return time.monotonic() - t0
                except (TimeoutError, aiohttp.ClientError):
                    pass
                if time.monotonic() - t0 > timeout_s:
                    raise RuntimeError(f"server not ready after {timeout_s:.0f} s:\n" + self.log_tail())
                await asyncio.sleep(0.25)

    async def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s`` for the drain, then SIGKILL."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.exit_code = await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                self.killed = True
                self.proc.kill()
                self.exit_code = await self.proc.wait()
            except ProcessLookupError:
                self.exit_code = await self.proc.wait()
        else:
            self.exit_code = self.proc.returncode
        return self.exit_code

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def server_env(base: Mapping[str, str] | None = None, **settings: object) -> dict[str, str]:
    """The environment for a wattserve subprocess: ours, plus WATTSERVE_* for each setting.

    The folder holding the ``server`` package goes on PYTHONPATH, so ``python -m wattserve``
    works from any directory in a source checkout as well as in an installed wattserve.
    """
    env = dict(os.environ if base is None else base)
    spec = importlib.util.find_spec("server")
    if spec is not None and spec.origin:
        root = str(Path(spec.origin).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("WATTSERVE_GRPC_PORT", "0")  # load goes over HTTP; no contention for port 8001
    for key, value in settings.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        env[f"WATTSERVE_{key.upper()}"] = str(value)
    return env
