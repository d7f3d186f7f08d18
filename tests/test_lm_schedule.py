"""The token scheduler alone: plain data in, plain data out, no model."""

from __future__ import annotations

import pytest
from wattserve.engines.lm_schedule import SeqView, TokenPlan, blocks_needed, schedule_tokens


def seq(key, total, computed=0, blocks=0, priority=1, order=None):
    return SeqView(key, priority, key if order is None else order, total, computed, blocks)


def test_decodes_first_then_prefill_chunked_to_the_budget():
    running = [seq(0, 11, 10, 3), seq(1, 21, 20, 5)]  # decoding: one token each
    new = seq(2, 100)  # a 100-token prompt
    plan = schedule_tokens([new, *running], token_budget=32, free_blocks=100, block_size=4)
    assert plan.chunks == {0: 1, 1: 1, 2: 30}  # the long prompt waits for no one, stalls no one
    assert plan.preempt == ()
    assert plan.tokens == 32


def test_unchunked_admits_only_whole_prompts_and_fcfs_stops_at_the_first_misfit():
    plan = schedule_tokens(
        [seq(0, 50), seq(1, 5)], token_budget=32, free_blocks=100, block_size=4, chunked=False
    )
    assert plan.chunks == {}  # the 5-token prompt does not overtake the 50-token one


def test_a_chunk_in_progress_continues_before_new_prompts():
    plan = schedule_tokens([seq(0, 40, 16, 4), seq(1, 8)], token_budget=20, free_blocks=10, block_size=4)
    assert plan.chunks == {0: 20}


def test_no_free_block_preempts_the_newest_running_sequence():
    # both decoding, both at a block boundary (next token needs a new block), no block free
    a, b = seq(0, 9, 8, 2), seq(1, 9, 8, 2)
    plan = schedule_tokens([a, b], token_budget=8, free_blocks=0, block_size=4)
    assert plan.preempt == (1,)
    assert plan.chunks == {0: 1}  # the older one runs on with the freed block


def test_the_newest_preempts_itself_rather_than_an_older_one():
    a = seq(0, 6, 5, 2)  # needs no new block
    b = seq(1, 9, 8, 2)  # needs one, none free
    plan = schedule_tokens([a, b], token_budget=8, free_blocks=0, block_size=4)
    assert plan.preempt == (1,)
    assert plan.chunks == {0: 1}


def test_a_preempted_sequence_waits_a_step_and_then_recomputes():
    plan = schedule_tokens([seq(0, 9, 8, 2), seq(1, 9, 8, 2)], token_budget=8, free_blocks=0, block_size=4)
    assert 1 not in plan.chunks
    later = schedule_tokens([seq(0, 10, 9, 3), seq(1, 9)], token_budget=16, free_blocks=3, block_size=4)
    assert later.chunks == {0: 1, 1: 9}  # the whole prompt + tokens so far, recomputed


def test_priority_ranks_before_arrival():
    old_low = seq(0, 30, priority=2)
    new_high = seq(1, 30, priority=1)
    plan = schedule_tokens([old_low, new_high], token_budget=30, free_blocks=100, block_size=4)
    assert plan.chunks == {1: 30}
    # and under memory pressure the low-priority sequence is the one preempted
    plan = schedule_tokens(
        [seq(0, 9, 8, 2, priority=2), seq(1, 9, 8, 2, priority=1)],
        token_budget=8,
        free_blocks=0,
        block_size=4,
    )
    assert plan.preempt == (0,) and plan.chunks == {1: 1}


def test_prefill_limited_by_free_blocks():
    plan = schedule_tokens([seq(0, 40)], token_budget=64, free_blocks=3, block_size=4)
    assert plan.chunks == {0: 12}


def test_budget_smaller_than_the_running_set_serves_the_best_ranked():
    running = [seq(i, 5, 4, 1) for i in range(5)]
    plan = schedule_tokens(running, token_budget=3, free_blocks=10, block_size=4)
    assert plan.chunks == {0: 1, 1: 1, 2: 1}


def test_plan_is_plain_data_and_bad_budgets_are_refused():
    assert isinstance(schedule_tokens([], 1, 0, 4), TokenPlan)
    assert blocks_needed(9, 4) == 3 and blocks_needed(8, 4) == 2
    with pytest.raises(ValueError):
        schedule_tokens([], 0, 1, 4)
