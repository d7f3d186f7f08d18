"""The language-model workload: seeded length distributions, the prompts drawn from them,
and the ShareGPT-like reader (a small file written here)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wattserve.loadgen.lm_workload import LengthDist, LMItem, read_sharegpt, synthetic_items


def test_fixed_uniform_and_normal_lengths_are_seeded_and_within_their_bounds():
    assert LengthDist.parse("fixed:7").sample(5, np.random.default_rng(0)).tolist() == [7] * 5
    assert LengthDist.parse("12").sample(3, np.random.default_rng(0)).tolist() == [12] * 3
    uniform = LengthDist.parse("uniform:3,9")
    drawn = uniform.sample(4000, np.random.default_rng(1))
    assert drawn.min() == 3 and drawn.max() == 9  # both ends inclusive
    assert set(drawn.tolist()) == set(range(3, 10))
    normal = LengthDist.parse("normal:50,10")
    values = normal.sample(20_000, np.random.default_rng(2))
    assert abs(values.mean() - 50) < 0.5 and abs(values.std() - 10) < 0.5
    assert np.array_equal(values, normal.sample(20_000, np.random.default_rng(2)))  # same seed, same draws
    assert not np.array_equal(values, normal.sample(20_000, np.random.default_rng(3)))
    # a wide normal never draws a length below the minimum
    assert LengthDist.parse("normal:2,20").sample(5000, np.random.default_rng(0)).min() == 1


@pytest.mark.parametrize(
    "text", ["uniform:9,3", "normal:5", "fixed:0", "poisson:3", "fixed:x", "normal:4,-1"]
)
def test_a_bad_distribution_is_refused_with_the_forms_it_takes(text):
    with pytest.raises(ValueError, match=r"fixed|uniform|normal|at least"):
        LengthDist.parse(text)


def test_synthetic_items_have_the_drawn_word_counts_and_repeat_with_the_seed():
    items = synthetic_items(50, LengthDist.parse("uniform:2,6"), LengthDist.parse("normal:20,5"), seed=4)
    assert items == synthetic_items(
        50, LengthDist.parse("uniform:2,6"), LengthDist.parse("normal:20,5"), seed=4
    )
    assert items != synthetic_items(
        50, LengthDist.parse("uniform:2,6"), LengthDist.parse("normal:20,5"), seed=5
    )
    assert all(2 <= len(it.prompt.split()) <= 6 and it.max_tokens >= 1 for it in items)
    assert len({len(it.prompt.split()) for it in items}) > 1


def test_sharegpt_takes_the_first_human_turn_and_the_length_of_the_model_turn_after_it(tmp_path):
    doc = [
        {"id": "a", "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "what is a token"},
            {"from": "gpt", "value": "a piece of text the model reads"},
            {"from": "human", "value": "second question, not used"},
            {"from": "gpt", "value": "a much longer second answer that is not used either"},
        ]},
        {"id": "only-human", "conversations": [{"from": "human", "value": "no answer"}]},
        {"id": "empty-answer", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]},
        {"id": "gpt-first", "conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "x"}]},
        "not a conversation",
        {"messages": [{"role": "user", "content": "openai shaped"}, {"role": "assistant", "content": "one two"}]},
        [{"from": "human", "value": "a bare list of turns"}, {"from": "gpt", "value": "yes"}],
    ]  # fmt: skip
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(doc))
    assert read_sharegpt(path) == [
        LMItem("what is a token", 7),
        LMItem("openai shaped", 2),
        LMItem("a bare list of turns", 1),
    ]
    # a tokenizer's count instead of words; and a limit on how many are read
    assert read_sharegpt(path, count_tokens=len, limit=2) == [
        LMItem("what is a token", len("a piece of text the model reads")),
        LMItem("openai shaped", len("one two")),
    ]


@pytest.mark.parametrize("content", ['{"conversations": []}', "[]", "not json", '[{"conversations": []}]'])
def test_a_file_without_a_usable_conversation_is_a_clear_error(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"bad\.json"):
        read_sharegpt(path)
