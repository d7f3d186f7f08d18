"""``pb_utils.MetricFamily``: Triton's custom metrics API and its errors, and what /metrics shows.

The rules come from Triton's python_backend (``MetricFamily.Metric``'s label and bucket
checks) and core (``Metric::Increment``/``Set``/``Observe``/``Value`` per kind), as its QA
model ``qa/python_models/custom_metrics`` checks them: a counter refuses a negative
increment, ``set`` and ``observe``; a gauge refuses ``observe``; a histogram refuses
``value``, ``increment`` and ``set``, needs strictly increasing buckets (an empty list is
allowed); the same family name with another kind is refused, with the same kind it is the
same family (its first description kept); the same labels are the same series.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from wattserve.engines.python_backend import custom_metrics, pb_utils
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from support.python_models import write_python_model

Family = pb_utils.MetricFamily
Error = pb_utils.TritonModelException


@pytest.fixture
def store():
    """A fresh store bound to this thread, published on its own registry."""
    store = custom_metrics.CustomMetrics()
    owner = custom_metrics.Owner(store)
    custom_metrics.bind(owner, thread_only=True)
    registry = CollectorRegistry()
    registry.register(store)
    yield store, owner, lambda: generate_latest(registry).decode()
    custom_metrics.bind(None, thread_only=True)


def test_counter_gauge_histogram_published_under_the_models_names(store):
    _, _, scrape = store
    labels = {"example1": "a", "example2": "b"}
    # the families are kept: Triton deletes a family's metrics with it (test_lifetimes...)
    families = [Family("t_counter", "a counter", Family.COUNTER), Family("t_gauge", "a gauge", Family.GAUGE),
                Family("t_hist", "a histogram", Family.HISTOGRAM)]  # fmt: skip
    counter, gauge = families[0].Metric(labels=labels), families[1].Metric(labels=labels)
    histogram = families[2].Metric(labels=labels, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    assert counter.value() == 0.0 and gauge.value() == 0.0
    counter.increment(2023.0)
    gauge.increment(2023.0)
    gauge.increment(-23.5)
    assert (counter.value(), gauge.value()) == (2023.0, 1999.5)
    gauge.set(999.9)
    for value in (0.05, 1.5, 6.0):
        histogram.observe(value)
    text = scrape()
    assert "# HELP t_counter a counter" in text and "# TYPE t_counter untyped" in text
    assert 't_counter{example1="a",example2="b"} 2023.0' in text
    assert "# TYPE t_gauge gauge" in text and 't_gauge{example1="a",example2="b"} 999.9' in text
    assert "# TYPE t_hist histogram" in text
    for le, n in (("0.1", 1), ("1", 1), ("2.5", 2), ("5", 2), ("10", 3), ("+Inf", 3)):
        assert f't_hist_bucket{{example1="a",example2="b",le="{le}"}} {n}.0' in text
    assert 't_hist_count{example1="a",example2="b"} 3.0' in text
    assert 't_hist_sum{example1="a",example2="b"} 7.55' in text


def test_each_kind_refuses_what_triton_refuses(store):
    families = [Family("t_c", "c", Family.COUNTER), Family("t_g", "g", Family.GAUGE),
                Family("t_h", "h", Family.HISTOGRAM)]  # fmt: skip
    counter, gauge = families[0].Metric(), families[1].Metric()
    histogram = families[2].Metric(buckets=[1.0])
    with pytest.raises(Error, match="non-negative"):
        counter.increment(-1.0)
    with pytest.raises(Error, match="does not support set"):
        counter.set(1.0)
    for metric in (counter, gauge):
        with pytest.raises(Error, match="does not support observe"):
            metric.observe(0.05)
    with pytest.raises(Error, match="does not support value"):
        histogram.value()
    with pytest.raises(Error, match="does not support increment"):
        histogram.increment(1.0)
    with pytest.raises(Error, match="does not support set"):
        histogram.set(1.0)
    assert counter.value() == 0.0  # nothing refused changed a value


def test_labels_and_buckets_checks(store):
    histogram = Family("t_hargs", "h", Family.HISTOGRAM)
    with pytest.raises(Error, match="Missing required buckets"):
        histogram.Metric(labels={})
    with pytest.raises(Error, match="strictly sorted"):
        histogram.Metric(labels={}, buckets=[2.5, 0.1, 1.0])
    with pytest.raises(Error, match="strictly sorted"):
        histogram.Metric(labels={}, buckets=[1, 1, 2])
    histogram.Metric(labels={}, buckets=[])  # one +Inf bucket
    counter = Family("t_cargs", "c", Family.COUNTER)
    with pytest.raises(Error, match="Unexpected buckets"):
        counter.Metric(buckets=[1.0])
    with pytest.raises(Error, match="Labels must be a dictionary"):
        counter.Metric(labels=[("a", "b")])  # type: ignore[arg-type]  # the misuse under test
    with pytest.raises(Error, match="str value"):
        counter.Metric(labels={"a": 1})  # type: ignore[dict-item]  # the misuse under test
    with pytest.raises(Error, match="invalid label name"):
        counter.Metric(labels={"not-a-name": "x"})
    with pytest.raises(Error, match="invalid metric name"):
        Family("bad name", "x", Family.COUNTER)
    with pytest.raises(Error, match="unknown kind"):
        Family("t_kind", "x", 7)
    with pytest.raises(Error, match="server's own"):
        Family("nv_inference_count", "x", Family.COUNTER)


def test_same_name_is_one_family_another_kind_is_refused(store):
    _, _, scrape = store
    first = Family("t_dup", "first description", Family.COUNTER)
    second = Family("t_dup", "second description", Family.COUNTER)
    with pytest.raises(Error, match="already exists with kind COUNTER, not GAUGE"):
        Family("t_dup", "x", Family.GAUGE)
    a = first.Metric(labels={"k": "v"})
    b = second.Metric(labels={"k": "v"})  # same labels: the same series
    a.increment(7.5)
    assert b.value() == 7.5
    other = second.Metric(labels={"k": "other"})  # kept: a dropped handle takes its series
    text = scrape()
    assert "# HELP t_dup first description" in text and "second description" not in text
    assert text.count('t_dup{k="v"}') == 1 and 't_dup{k="other"} 0.0' in text
    assert other.value() == 0.0


def test_lifetimes_follow_the_handles(store):
    _, _, scrape = store
    family = Family("t_life", "life", Family.GAUGE)
    one = family.Metric(labels={"k": "v"})
    two = family.Metric(labels={"k": "v"})
    one.set(3.0)
    del one
    gc.collect()
    assert 't_life{k="v"} 3.0' in scrape()  # another handle holds the series
    del two
    gc.collect()
    assert 't_life{k="v"}' not in scrape()
    kept = family.Metric(labels={"k": "w"})
    del family  # Triton: a family deleted before its metrics takes them with it
    gc.collect()
    with pytest.raises(Error, match="Invalid metric operation as the corresponding 'MetricFamily'"):
        kept.set(1.0)
    assert "t_life" not in scrape()


def test_owner_release_drops_every_series_of_an_unloaded_model(store):
    _, owner, scrape = store
    family = Family("t_owned", "owned", Family.COUNTER)
    metric = family.Metric(labels={"model": "m"})
    metric.increment(1)
    assert 't_owned{model="m"} 1.0' in scrape()
    owner.release()  # what the engine does when it closes (unload), after finalize
    assert "t_owned" not in scrape()
    with pytest.raises(Error, match="Invalid metric operation"):
        metric.increment(1)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_an_engine_publishes_to_its_servers_store_until_it_closes(tmp_path, isolation):
    """Two instances of one model share its series (Triton: one family per server); closing
    both (an unload) takes the series off /metrics, even though (thread mode) the model object
    lives on; in process mode the series cross from the worker processes to this store."""
    store = custom_metrics.CustomMetrics()
    registry = CollectorRegistry()
    registry.register(store)
    folder = write_python_model(tmp_path, "custom_metrics")
    (plan,) = plan_model(folder, Settings(telemetry=False, python_model_isolation=isolation))
    build = custom_metrics.publishing_to(store, plan.engine_factory)
    engines = [build(plan.serving.engine), build(plan.serving.engine)]
    x = np.ones((1, 3), np.float32)
    for engine in engines:
        engine.infer({"INPUT0": x})
    text = generate_latest(registry).decode()
    assert 'pbm_requests{model="custom_metrics",version="1"} 2.0' in text
    engines[0].close()
    assert 'pbm_requests{model="custom_metrics",version="1"} 2.0' in generate_latest(registry).decode()
    kept = getattr(engines[1], "instance", None)  # the model object outlives its engine: its handles do not
    engines[1].close()
    assert "pbm_" not in generate_latest(registry).decode()
    assert isolation == "process" or kept.requests is not None
