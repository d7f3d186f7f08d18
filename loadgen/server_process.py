"""The one harness for "start a server, wait until it is ready, stop it" and for free ports.

Tests, benchmarks, the study runner and the GPU scripts all start servers through this module,
so they start them the same way users do (``python -m wattserve serve`` with WATTSERVE_*
settings) and stop them the same way operators do (SIGTERM, a drain, then SIGKILL).
``root`` runs another checkout instead of the installed one, which is how a benchmark compares
two versions side by side in one run; a checkout from before the ``wattserve`` namespace
keeps its own ``python -m server`` entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from wattserve import with_checkout_on_path

READY_PATH = "/v2/health/ready"
DEFAULT_COMMAND = ("{python}", "-m", "wattserve", "serve", "--port", "{port}")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(root: Path | None = None) -> list[str]:
    """The argv that starts wattserve as a user would, from ``root`` if given."""
    namespaced = root is None or (Path(root) / "wattserve" / "__init__.py").is_file()
    return [sys.executable, "-m", "wattserve" if namespaced else "server", "serve"]


def server_env(base: Mapping[str, str] | None = None, **settings: object) -> dict[str, str]:
    """The environment for a wattserve subprocess: ours, plus WATTSERVE_* for each setting."""
    env = with_checkout_on_path(dict(os.environ if base is None else base))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("WATTSERVE_GRPC_PORT", "0")  # load goes over HTTP; no contention for port 8001
    for key, value in settings.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        env[f"WATTSERVE_{key.upper()}"] = str(value)
    return env


class ServerProcess:
    """One server subprocess, its output in ``log_path`` (a temporary file if not given: a
    pipe nobody reads would fill up and stall the server). A temporary log is read into
    memory and deleted when the process stops (``log()`` still returns it): benchmarks start
    hundreds of servers, and their logs were never removed.

    ``start`` launches it; ``wait_ready`` polls ``ready_path`` until one of ``ready_statuses``
    (and fails early, with the log's tail, if the process dies); ``stop`` sends SIGTERM, lets
    it drain for ``timeout_s``, then kills it. As a context manager it does all three. The
    ``a``-prefixed methods are the same steps for asyncio callers (the blocking parts run in
    a thread). ``{python}`` and ``{port}`` in ``command`` are filled in.
    """

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        port: int,
        log_path: Path | None = None,
        cwd: str | Path | None = None,
        ready_path: str = READY_PATH,
        ready_statuses: Iterable[int] = (200,),
        new_session: bool = False,
        ready_timeout_s: float = 180.0,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.command = [c.format(python=sys.executable, port=port) for c in command]
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = str(cwd) if cwd is not None else None
        self.ready_path = ready_path
        self.ready_statuses = frozenset(ready_statuses)
        self.new_session = new_session  # Ctrl-C on a study does not hit the server mid-run
        self.ready_timeout_s = ready_timeout_s  # what the context manager waits
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.killed = False
        self._log: IO[bytes] | None = None
        self._temporary_log = log_path is None
        self._stopped_log: str | None = None  # a temporary log's text, once the file is gone

    # ------------------------------------------------------------------ blocking steps
    def start(self) -> ServerProcess:
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"wattserve-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.command, env=self.env, cwd=self.cwd, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=self.new_session,
        )  # fmt: skip
        return self

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Seconds until ready; raises RuntimeError if it exits or is not ready in time."""
        assert self.proc is not None, "start() first"
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.command} exited with code {self.proc.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if self._ready_status() in self.ready_statuses:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"{self.command} not ready after {timeout_s:.0f} s:\n" + self.log_tail())
            time.sleep(0.1)

    def _ready_status(self) -> int | None:
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def terminate(self) -> None:
        """SIGTERM without waiting (a test that watches the drain)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s`` for the drain, then SIGKILL; the exit code."""
        if self.proc is None:
            return None
        self.terminate()
        try:
            self.exit_code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.killed = True
            self.proc.kill()
            self.exit_code = self.proc.wait()
        finally:
            if self._log is not None:
                self._log.close()
            if self._temporary_log and self.log_path is not None and self._stopped_log is None:
                self._stopped_log = self.log()
                self.log_path.unlink(missing_ok=True)
        return self.exit_code

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        """The server's process id (for /proc readings by benchmarks)."""
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def log(self) -> str:
        if self._stopped_log is not None:
            return self._stopped_log
        if self._log is not None and not self._log.closed:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return "(no log)"

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ asyncio callers
    async def astart(self) -> ServerProcess:
        return await asyncio.to_thread(self.start)

    async def await_ready(self, timeout_s: float | None = None) -> float:
        return await asyncio.to_thread(self.wait_ready, timeout_s)

    async def astop(self, timeout_s: float = 60.0) -> int | None:
        return await asyncio.to_thread(self.stop, timeout_s)


def wattserve_process(
    settings_env: Mapping[str, str] | None = None,
    *,
    port: int | None = None,
    root: Path | None = None,
    log_path: Path | None = None,
) -> ServerProcess:
    """An unstarted ``python -m wattserve serve`` with these WATTSERVE_* variables on top of
    ours (gRPC off unless asked: port 8001 is shared), from ``root`` if given."""
    port = port or free_port()
    env = server_env()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env.update(settings_env or {})
    env["WATTSERVE_PORT"] = str(port)
    return ServerProcess(serve_command(root), env, port, log_path, cwd=root)


@contextlib.contextmanager
def running_wattserve(
    settings_env: Mapping[str, str] | None = None,
    *,
    root: Path | None = None,
    log_path: Path | None = None,
    ready_timeout_s: float = 300.0,
) -> Iterator[ServerProcess]:
    """``wattserve_process`` started and ready for the block, stopped after it."""
    proc = wattserve_process(settings_env, root=root, log_path=log_path).start()
    try:
        proc.wait_ready(ready_timeout_s)
        yield proc
    finally:
        proc.stop()
