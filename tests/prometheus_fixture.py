"""A real Prometheus server on loopback for tests (the Debian ``prometheus`` binary).

Use the ``prometheus_factory`` fixture: ``prom = prometheus_factory(["127.0.0.1:8000"])``
starts Prometheus with a temporary config (scrape every 0.5 s) and storage folder on a free
loopback port, and stops it after the test. Where the binary is missing the test is skipped,
except under ``CI=true``, where a missing Prometheus is a failure (CI must run these checks).

To offer the fixture to every test module, import it in tests/conftest.py:
``from tests.prometheus_fixture import prometheus_factory  # noqa: F401``.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from wattserve.loadgen.server_process import free_port

PROMETHEUS_BIN = os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus")


def require_prometheus() -> str:
    """The binary's path; skip (locally) or fail (CI=true) when it is not installed."""
    binary = shutil.which(PROMETHEUS_BIN) or (PROMETHEUS_BIN if os.access(PROMETHEUS_BIN, os.X_OK) else None)
    if binary is None:
        message = f"Prometheus binary {PROMETHEUS_BIN} not found (apt-get install prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run the Prometheus checks")
        pytest.skip(message)
    return binary


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (host:port) under job ``job``."""

    def __init__(self, binary: str, workdir: Path, targets: list[str], job: str = "wattserve"):
        self.binary = binary
        self.workdir = workdir
        self.targets = targets
        self.job = job
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    # Every 0.5 s: the tests wait for scrapes (a series to appear, rate() to have two points,
    # six scrapes for the dashboard's windows), so the interval is what they wait; a scrape
    # that times out on a busy machine only makes them wait for the next one.
    SCRAPE = "500ms"

    def config_text(self) -> str:
        targets = ", ".join(f'"{t}"' for t in self.targets)
        return (
            "global:\n"
            f"  scrape_interval: {self.SCRAPE}\n"
            f"  evaluation_interval: {self.SCRAPE}\n"
            "scrape_configs:\n"
            f"  - job_name: {self.job}\n"
            f"    scrape_interval: {self.SCRAPE}\n"
            f"    scrape_timeout: {self.SCRAPE}\n"
            f"    static_configs:\n      - targets: [{targets}]\n"
        )

    def start(self, timeout: float = 30.0) -> None:
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config_text())
        for _attempt in range(3):  # the free port can be taken between probe and bind
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
            log.close()
            if self._wait_ready(timeout):
                return
            self.stop()
        raise RuntimeError(f"Prometheus did not start:\n{self.log()}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    # --- HTTP API ---
    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at now; the result vector (raises on a PromQL error)."""
        response = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"PromQL error for {expr!r}: {body.get('error', response.text)}")
        result = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        response = httpx.get(
            self.url + f"/api/v1/label/{label}/values", params={"match[]": match}, timeout=10
        )
        response.raise_for_status()
        return response.json()["data"]

    def scrapes(self) -> int:
        """Successful scrapes of the job in the last minute."""
        result = self.query(f'sum(sum_over_time(up{{job="{self.job}"}}[1m]))')
        return int(float(result[0]["value"][1])) if result else 0

    def wait_until(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns at least one finite value."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if any(math.isfinite(float(r["value"][1])) for r in result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} returned no data in {timeout} s:\n{self.log()}")
            time.sleep(0.25)


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[[list[str]], PrometheusServer]]:
    binary = require_prometheus()
    started: list[PrometheusServer] = []

    def start(targets: list[str]) -> PrometheusServer:
        workdir = tmp_path / f"prometheus-{len(started)}"
        workdir.mkdir()
        server = PrometheusServer(binary, workdir, targets)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()
