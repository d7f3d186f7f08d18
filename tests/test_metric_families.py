"""Metric families are declared once per registry, whoever binds children of them
(telemetry/families.py: the serving and the iteration metrics' one home)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from wattserve.batchers.iteration_metrics import IterationMetrics
from wattserve.server.models.metrics import ServingMetrics
from wattserve.telemetry.families import families


class Group:
    declared = 0

    def __init__(self, registry: CollectorRegistry) -> None:
        Group.declared += 1
        self.calls = Counter("test_calls", "Calls.", ("model",), registry=registry)


def test_one_group_per_registry_declared_on_first_use():
    a, b = CollectorRegistry(), CollectorRegistry()
    before = Group.declared
    first = families(a, Group)
    assert families(a, Group) is first  # a second declaration would raise in the registry
    assert families(b, Group) is not first
    assert Group.declared == before + 2


def test_many_models_and_reloads_share_the_serving_and_iteration_families():
    registry = CollectorRegistry()
    for model in ("m1", "m2", "m1"):  # m1 twice: a reload
        ServingMetrics(model, "dynamic", registry).executions.inc()
        IterationMetrics(model, "iteration", registry).iterations.inc()
    labels = {"model": "m1", "batcher": "dynamic"}
    assert registry.get_sample_value("wattserve_batch_executions_total", labels) == 2
    assert registry.get_sample_value("wattserve_iterations_total", {**labels, "batcher": "iteration"}) == 2
