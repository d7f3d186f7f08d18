"""``telemetry.counter_add``: the hot path's add to a labelled counter child is the same
sample ``Counter.inc`` would have made."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter
from wattserve.telemetry.counter_add import counter_add


def test_adds_show_in_the_exposition_as_inc_would():
    registry = CollectorRegistry()
    counter = Counter("things", "things counted", ["kind"], registry=registry)
    add = counter_add(counter.labels("a"))
    add(3)
    add(1)
    counter.labels("b").inc(2)
    assert registry.get_sample_value("things_total", {"kind": "a"}) == 4
    assert registry.get_sample_value("things_total", {"kind": "b"}) == 2


def test_an_unlabelled_counter_and_a_labelled_parent():
    registry = CollectorRegistry()
    plain = Counter("plain", "one series", registry=registry)
    counter_add(plain)(5)
    assert registry.get_sample_value("plain_total") == 5
    parent = Counter("parent", "labelled", ["kind"], registry=registry)
    with pytest.raises(ValueError):
        counter_add(parent)
