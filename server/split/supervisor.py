"""``wattserve serve --frontend-workers N``: one engine core and N front ends, kept running.

The supervisor does no request work. It reserves the public ports (so that port 0 names one
port every front end shares), starts the core and the front ends as processes of their own,
restarts any that dies (a front end's requests die with it; while the core is away the
front ends answer 503 and report not ready), and on SIGTERM drains in order: the front
ends first (no new requests; those in flight answered), then the core.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from wattserve.server.settings import Settings
from wattserve.server.split.processes import ENV_DIR, ENV_INDEX, ENV_SETTINGS, reuseport_socket

from wattserve import with_checkout_on_path

log = logging.getLogger("wattserve.supervisor")

POLL_S = 0.1
CRASH_WINDOW_S = 10.0  # a process that dies this soon after its start counts towards giving up
MAX_QUICK_CRASHES = 5  # in a row: a core that cannot start (bad config) is not restarted forever


def child_env(settings: Settings, folder: Path, role: str, index: int) -> dict[str, str]:
    """The child's environment: ours, the settings that were set, and this checkout on
    PYTHONPATH (the children run the same files)."""
    env = with_checkout_on_path(dict(os.environ))
    # only what was set (a flag, a variable, the supervisor's ports): a default must stay a
    # default in the child, where a repository model tells the two apart (max_queue_wait_s)
    env[ENV_SETTINGS] = json.dumps(settings.model_dump(mode="json", exclude_unset=True))
    env[ENV_DIR] = str(folder)
    env[ENV_INDEX] = str(index)
    env["WATTSERVE_ROLE"] = role  # how benchmarks.accelerator_ceiling groups CPU by process role
    return env


@dataclass
class Child:
    role: str  # "core" or "frontend"
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_crashes: int = 0
    restarts: int = field(default=0)


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.folder = Path(tempfile.mkdtemp(prefix="wattserve-"))  # 0700
        self.children: list[Child] = []
        self._stopping = 0  # signals seen
        self._reserved: list[object] = []

    # ------------------------------------------------------------------ start-up
    def _reserve_ports(self) -> Settings:
        """Bind (without listening) the public ports with SO_REUSEPORT, so a port 0 becomes one
        port that every front end then binds and listens on."""
        s = self.settings
        update: dict[str, int] = {}
        http = reuseport_socket(s.host, s.port, listen=False)
        self._reserved.append(http)
        update["port"] = http.getsockname()[1]
        if s.grpc_port:
            grpc = reuseport_socket(s.grpc_host or s.host, s.grpc_port, listen=False)
            self._reserved.append(grpc)
            update["grpc_port"] = grpc.getsockname()[1]
        return s.model_copy(update=update)

    def _spawn(self, child: Child) -> None:
        env = child_env(self.child_settings, self.folder, child.role, child.index)
        child.process = subprocess.Popen(
            [sys.executable, "-m", "wattserve.server.split", child.role], env=env
        )
        child.started_at = time.monotonic()
        log.info("started %s %d (pid %d)", child.role, child.index, child.process.pid)

    def run(self) -> int:
        self.child_settings = self._reserve_ports()
        s = self.child_settings
        log.info("serving HTTP on %s:%d%s with %d front ends over one engine core", s.host, s.port,
                 f", gRPC on port {s.grpc_port}" if s.grpc_port else "", s.frontend_workers)  # fmt: skip
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.children = [Child("core", 0)] + [Child("frontend", i + 1) for i in range(s.frontend_workers)]
        for child in self.children:
            self._spawn(child)
        try:
            return self._watch()
        finally:
            self._stop_all()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._stopping += 1

    # ------------------------------------------------------------------ watching
    def _watch(self) -> int:
        while not self._stopping:
            for child in self.children:
                assert child.process is not None
                code = child.process.poll()
                if code is None:
                    continue
                quick = time.monotonic() - child.started_at < CRASH_WINDOW_S
                child.quick_crashes = child.quick_crashes + 1 if quick else 0
                if child.quick_crashes >= MAX_QUICK_CRASHES:
                    log.error("%s %d exited %d, %d times within %.0fs of starting; giving up",
                              child.role, child.index, code, child.quick_crashes, CRASH_WINDOW_S)  # fmt: skip
                    return 1
                log.warning("%s %d (pid %d) exited with %d; restarting", child.role, child.index,
                            child.process.pid, code)  # fmt: skip
                child.restarts += 1
                self._spawn(child)
            time.sleep(POLL_S)
        return 0

    def _stop_all(self) -> None:
        """Front ends first (they answer what they hold, which needs the core), then the core."""
        s = self.settings
        budget = s.drain_grace_s + s.drain_timeout_s + 10.0
        frontends = [c for c in self.children if c.role == "frontend"]
        cores = [c for c in self.children if c.role == "core"]
        for group in (frontends, cores):
            for child in group:
                if child.process is not None and child.process.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + budget
            for child in group:
                if child.process is None:
                    continue
                try:
                    child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.error("%s %d did not stop in %.0fs; killing it", child.role, child.index, budget)
                    child.process.kill()
                    child.process.wait()


def serve(settings: Settings) -> int:
    return Supervisor(settings).run()
