"""The per-size running mean of CostModel (the one home of batch cost; the queue's time
bound measures the drain instead, batchers/service_rate.py)."""

from __future__ import annotations

import pytest
from wattserve.batchers.cost_model import CostModel
from wattserve.batchers.size_ewma import SizeEwma


def test_first_observation_is_taken_then_averaged():
    ewma = SizeEwma(alpha=0.25)
    assert ewma.update(4, 0.040) == 0.040
    assert ewma.update(4, 0.080) == pytest.approx(0.050)
    assert 4 in ewma and 8 not in ewma and len(ewma) == 1
    ewma.set(4, 0.010)  # a seed replaces what was learned
    assert ewma.get(4) == 0.010 and ewma.get(8) is None


def test_cost_model_averages_joules_by_the_ewma_rule():
    """CostModel's joules per size follow the one EWMA rule."""
    costs = CostModel(1, size_alpha=0.3)
    for seconds, joules in ((0.010, 2.0), (0.020, 4.0), (0.015, 3.0)):
        costs.observe(1, seconds, joules)
    expected_joules = SizeEwma(alpha=0.3)
    for joules in (2.0, 4.0, 3.0):
        expected_joules.update(1, joules)
    assert costs.joules(1) == pytest.approx(expected_joules[1])
