"""The autoscaling signal, end to end without a cluster: the HPA's metric is the one the
prometheus-adapter rule produces, the rule's series is one a live wattserve really exports and
it counts queued + computing requests, and the rule's PromQL, run by a real Prometheus that
scrapes that server (with the pod/namespace labels a PodMonitor adds), returns that pod's
queue pressure. A renamed metric fails here instead of silently stopping autoscaling."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy_support import DEPLOY, KUSTOMIZATIONS, by_kind, render
from tests.prometheus_fixture import PrometheusServer, require_prometheus
from tests.servers import free_port, wattserve_process

ADAPTER_VALUES = DEPLOY / "k8s" / "base" / "prometheus-adapter-values.yaml"
# identity compute per batch: requests stay in flight long enough to scrape (all three for
# 1.5 s, some for 4.5 s: Prometheus scrapes every 0.5 s)
DELAY_MS = 1500
HELD = 3  # batch size 1: one computing, two queued
NAMESPACE, POD = "wattserve-test", "wattserve-0"


def hpa_metric_name() -> str:
    hpa = by_kind(render(KUSTOMIZATIONS["k8s-base"]))["HorizontalPodAutoscaler", "wattserve"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    return metric["pods"]["metric"]["name"]


def adapter_rule(name: str) -> dict:
    rules = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    matching = [r for r in rules if r["name"]["as"] == name]
    assert len(matching) == 1, f"no prometheus-adapter rule exposes {name!r}"
    return matching[0]


def series_name(rule: dict) -> str:
    m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["seriesQuery"])
    assert m, rule["seriesQuery"]
    return m.group(1)


def adapter_query(rule: dict, series: str) -> str:
    """The PromQL prometheus-adapter sends for one pod (its Go template, filled in)."""
    matchers = f'namespace="{NAMESPACE}",pod="{POD}"'
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", "pod")
    )


def test_hpa_metric_is_what_the_adapter_rule_exposes():
    rule = adapter_rule(hpa_metric_name())
    series = series_name(rule)
    assert re.fullmatch(rule["name"]["matches"], series)
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
        assert placeholder in rule["metricsQuery"]


class LabelledPrometheus(PrometheusServer):
    """Scrapes like a PodMonitor target: with the pod's namespace and name as labels."""

    def config_text(self) -> str:
        text = super().config_text()
        return text.replace("]\n", f"]\n        labels: {{namespace: {NAMESPACE}, pod: {POD}}}\n", 1)


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ("wattserve_inflight_requests", "wattserve_queue_depth")
    }


def _post_identity(url: str, answers: list[int]) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    answers.append(httpx.post(url + "/v2/models/identity/infer", json=body, timeout=60).status_code)


@pytest.mark.slow
def test_live_server_exports_the_series_and_the_adapter_query_sees_queue_pressure(tmp_path):
    rule = adapter_rule(hpa_metric_name())
    series = series_name(rule)
    env = {
        "WATTSERVE_MODEL": "identity",
        "WATTSERVE_IDENTITY_DELAY_MS": str(DELAY_MS),
        "WATTSERVE_MAX_BATCH_SIZE": "1",
        "WATTSERVE_TELEMETRY": "false",
        # the third request waits two 1.5 s batches: the default 3 s queue-time bound
        "WATTSERVE_MAX_QUEUE_WAIT_S": "0",
    }
    # Prometheus first, on the port the server will have: Prometheus 2.42 waits 5 s before its
    # first scrape, and the server starts in that time instead of after it.
    port = free_port()
    prometheus = LabelledPrometheus(require_prometheus(), tmp_path, [f"127.0.0.1:{port}"])
    prometheus.start()
    try:
        with wattserve_process(env, port=port) as server:
            assert series in _scrape(server.url), f"wattserve does not export {series}"
            prometheus.wait_until(f'{series}{{pod="{POD}"}}')
            answers: list[int] = []
            threads = [
                threading.Thread(target=_post_identity, args=(server.url, answers)) for _ in range(HELD)
            ]
            for t in threads:
                t.start()
            deadline = time.monotonic() + DELAY_MS / 1000
            seen: dict[str, float] = {}
            while time.monotonic() < deadline:  # one computing and the rest queued, in one scrape
                seen = _scrape(server.url)
                if seen.get(series) == HELD:
                    break
                time.sleep(0.05)
            assert seen.get(series) == HELD, seen
            assert seen["wattserve_queue_depth"] == HELD - 1  # the in-flight gauge includes the queue
            result = prometheus.wait_until(
                f"({adapter_query(rule, series)}) > 0", timeout=2 * DELAY_MS / 1000
            )
            assert [r["metric"] for r in result] == [{"pod": POD}]
            assert 0 < float(result[0]["value"][1]) <= HELD
            for t in threads:
                t.join(timeout=30)
            assert answers == [200] * HELD
    finally:
        prometheus.stop()
