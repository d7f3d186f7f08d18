"""The Grafana dashboard's expressions (deploy/grafana) and their check against a live
wattserve scraped by a real Prometheus: every panel returns data, the energy panels only
where energy hardware is there. Shared by the dashboard tests on the plain and the
simulated GPU servers."""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from wattserve.server.settings import Settings
from wattserve.telemetry.metrics import needs_energy_hardware

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


@contextlib.contextmanager
def live_wattserve(settings: Settings) -> Iterator[str]:
    with threaded_server(settings) as (url, _app):
        yield url.removeprefix("http://")


def drive_load(url: str, stop: threading.Event, sent: list[int]) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    with httpx.Client(base_url=f"http://{url}", timeout=10) as client:
        while not stop.is_set():
            response = client.post("/v2/models/identity/infer", json=body)
            assert response.status_code == 200, response.text
            sent[0] += 1
            time.sleep(0.002)  # a steady trickle; the machine is shared


def evaluate_dashboard(prom) -> list[str]:
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
