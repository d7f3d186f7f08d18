"""Clipper's AIMD rule on its own: additive growth within the objective, 10% cut past it."""

from __future__ import annotations

from wattserve.batchers.aimd import AimdConfig, next_limit

CONFIG = AimdConfig(max_batch_size=32, slo_s=0.050, step=1, backoff=0.9)


def test_grows_by_one_step_while_batches_stay_within_the_objective():
    limit = 1
    for _ in range(10):
        limit = next_limit(limit, 0.020, CONFIG)
    assert limit == 11


def test_never_grows_past_the_maximum():
    assert next_limit(32, 0.001, CONFIG) == 32


def test_shrinks_by_ten_percent_after_a_batch_past_the_objective():
    assert next_limit(30, 0.060, CONFIG) == 27
    assert next_limit(1, 0.060, CONFIG) == 1  # never below one


def test_settles_where_the_batch_time_crosses_the_objective():
    """Batch time 10 ms + 2 ms per item crosses 50 ms above 20 items: the limit saw-tooths there."""
    limit, seen = 1, []
    for _ in range(200):
        limit = next_limit(limit, 0.010 + 0.002 * limit, CONFIG)
        seen.append(limit)
    assert max(seen[100:]) == 21 and min(seen[100:]) >= 18
