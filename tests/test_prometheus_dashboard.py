"""The shipped Prometheus/Grafana files, checked against a real Prometheus and a live server.

The live test starts wattserve (identity model) on loopback, drives load at it, lets the
Debian ``prometheus`` binary scrape it every second, and evaluates every PromQL expression in
deploy/grafana/dashboards/wattserve.json through Prometheus's HTTP API. Expressions that need
energy hardware (metric names per ``telemetry.metrics.needs_energy_hardware``) must return
data where the hardware is present and must return *nothing* where it is absent: that is
the check that no power or energy figure is made up on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from wattserve.server.settings import Settings
from wattserve.telemetry.metrics import needs_energy_hardware

from tests.prometheus_fixture import prometheus_factory  # noqa: F401 - the fixture
from tests.servers import threaded_server

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "wattserve.json"
RATE_INTERVAL = "15s"  # what $__rate_interval stands for in these checks
METRIC = re.compile(r"\bwattserve_[a-z0-9_]+\b")


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets", []) if "expr" in t]


def needs_hardware(expr: str) -> bool:
    return any(needs_energy_hardware(name) for name in METRIC.findall(expr))


# ------------------------------------------------------------------ static checks
def test_dashboard_structure_and_datasource():
    dashboard = load_dashboard()
    provisioned = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == uid
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid
    for var in dashboard["templating"]["list"]:
        assert var["datasource"]["uid"] == uid
    exprs = [e for _, e in expressions(dashboard)]
    # the panels are all there
    for needed in (
        "wattserve_requests_total",
        "wattserve_request_duration_seconds_bucket",
        "wattserve_queue_duration_seconds_bucket",
        "wattserve_batch_size_bucket",
        "wattserve_gpu_power_watts",
        "wattserve_gpu_utilization_ratio",
        "wattserve_energy_inference_joules_sum",
        "wattserve_energy_joules_total",
        "wattserve_inferences_total",
    ):
        assert any(needed in e for e in exprs), f"no panel queries {needed}"


def test_hardware_panels_are_exactly_the_energy_ones():
    hardware = {title for title, expr in expressions(load_dashboard()) if needs_hardware(expr)}
    assert "Telemetry available" not in hardware
    assert "Request latency (p50 / p95 / p99)" not in hardware
    assert {"GPU power", "Energy per inference", "Busy vs idle power"} <= hardware


def test_prometheus_config_is_valid():
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool not installed; CI must check the Prometheus config")
        pytest.skip("promtool not installed")
    done = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus/prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_file_mounts_files_that_exist():
    """docker-compose.yml is untested here (no Docker engine); at least its paths are real."""
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"wattserve", "prometheus", "grafana"}
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (DEPLOY / host).exists(), f"{volume}: {host} missing"
    scrape = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["wattserve:8000"]


# ------------------------------------------------------------------ live check
@contextlib.contextmanager
def live_wattserve(settings: Settings) -> Iterator[str]:
    with threaded_server(settings) as (url, _app):
        yield url.removeprefix("http://")


def _drive_load(url: str, stop: threading.Event, sent: list[int]) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    with httpx.Client(base_url=f"http://{url}", timeout=10) as client:
        while not stop.is_set():
            response = client.post("/v2/models/identity/infer", json=body)
            assert response.status_code == 200, response.text
            sent[0] += 1
            time.sleep(0.002)  # a steady trickle; the machine is shared


@pytest.mark.slow
def test_every_dashboard_expression_against_live_wattserve(prometheus_factory):  # noqa: F811
    settings = Settings(model="identity", batcher="dynamic", max_batch_size=8, telemetry_interval_ms=200)
    with live_wattserve(settings) as target:
        stop, sent = threading.Event(), [0]
        loaders = [threading.Thread(target=_drive_load, args=(target, stop, sent)) for _ in range(3)]
        for loader in loaders:
            loader.start()
        try:
            prom = prometheus_factory([target])
            prom.wait_until('up{job="wattserve"} == 1')
            prom.wait_until(f"sum(rate(wattserve_inferences_total[{RATE_INTERVAL}])) > 0", timeout=60)
            while prom.scrapes() < 6:  # enough points for every rate() window
                time.sleep(0.5)
            failures = _evaluate_dashboard(prom)
        finally:
            stop.set()
            for loader in loaders:
                loader.join(30)
    assert sent[0] > 0
    assert not failures, "\n".join(failures)


def _evaluate_dashboard(prom) -> list[str]:
    dashboard = load_dashboard()
    values: dict[str, str] = {}
    for var in dashboard["templating"]["list"]:
        query = var["query"]["query"]
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert match, f"unexpected variable query {query!r}"
        selector = match.group(1).replace("$model", values.get("model", ".*"))
        found = prom.label_values(match.group(2), selector)
        assert found, f"variable {var['name']}: {query} found nothing"
        values[var["name"]] = "|".join(found)
    assert values == {"model": "identity", "batcher": "dynamic"}

    available = prom.query("max(wattserve_gpu_telemetry_available) + max(wattserve_rapl_available)")
    no_hardware = float(available[0]["value"][1]) == 0

    failures: list[str] = []
    for title, template in expressions(dashboard):
        expr = template.replace("$__rate_interval", RATE_INTERVAL)
        for name, value in values.items():
            expr = expr.replace(f"${name}", value)
        assert "$" not in expr, f"unsubstituted variable in {expr!r}"
        try:
            result = prom.query(expr)
        except AssertionError as exc:
            failures.append(f"{title}: {exc}")
            continue
        finite = [r for r in result if math.isfinite(float(r["value"][1]))]
        if needs_hardware(template) and no_hardware:
            if result:
                failures.append(f"{title}: {expr} returned {result} without energy hardware")
        elif not finite:
            failures.append(f"{title}: {expr} returned no data ({result})")
    return failures
