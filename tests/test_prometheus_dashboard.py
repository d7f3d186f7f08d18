"""The shipped Prometheus/Grafana files, checked against a real Prometheus and a live server.

The live test starts wattserve (identity model) on loopback, drives load at it, lets the
Debian ``prometheus`` binary scrape it every second, and evaluates every PromQL expression in
deploy/grafana/dashboards/wattserve.json through Prometheus's HTTP API. Expressions that need
energy hardware (metric names per ``telemetry.metrics.needs_energy_hardware``) must return
data where the hardware is present and must return *nothing* where it is absent: that is
the check that no power or energy figure is made up on a machine without a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest
import yaml
from wattserve.server.settings import Settings

from tests.dashboard_support import (
    DEPLOY,
    RATE_INTERVAL,
    drive_load,
    evaluate_dashboard,
    expressions,
    live_wattserve,
    load_dashboard,
    needs_hardware,
    panels,
)
from tests.prometheus_fixture import prometheus_factory  # noqa: F401 - the fixture


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
@pytest.mark.slow
def test_every_dashboard_expression_against_live_wattserve(prometheus_factory):  # noqa: F811
    settings = Settings(model="identity", batcher="dynamic", max_batch_size=8, telemetry_interval_ms=200)
    with live_wattserve(settings) as target:
        stop, sent = threading.Event(), [0]
        loaders = [threading.Thread(target=drive_load, args=(target, stop, sent)) for _ in range(3)]
        for loader in loaders:
            loader.start()
        try:
            prom = prometheus_factory([target])
            prom.wait_until('up{job="wattserve"} == 1')
            prom.wait_until(f"sum(rate(wattserve_inferences_total[{RATE_INTERVAL}])) > 0", timeout=60)
            while prom.scrapes() < 6:  # enough points for every rate() window
                time.sleep(0.5)
            failures = evaluate_dashboard(prom)
        finally:
            stop.set()
            for loader in loaders:
                loader.join(30)
    assert sent[0] > 0
    assert not failures, "\n".join(failures)
