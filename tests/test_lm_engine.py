"""The causal-LM step engine on tiny random-weight GPT-2 and Llama folders, against
Hugging Face's own ``generate()`` on the same weights."""

from __future__ import annotations

import pytest
from wattserve.engines import lm_model
from wattserve.engines.lm_engine import LMEngine

from tests.lm_support import PROMPTS, request, run_all, tiny_lm_folder
from tests.lm_support import hf_greedy as greedy_with_text

KINDS = ("gpt2", "llama")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    return {kind: tiny_lm_folder(root, kind) for kind in KINDS}


def hf_greedy(folder, prompt: str, max_tokens: int) -> list[int]:
    """Hugging Face's greedy token ids (``tests.lm_support.hf_greedy`` without its text)."""
    return greedy_with_text(folder, prompt, max_tokens)[0]


def engine(folder, **kwargs) -> LMEngine:
    settings = {"kv_blocks": 256, "block_size": 4, "token_budget": 64, "max_batch_size": 16}
    settings.update(kwargs)
    return LMEngine(folder.name, model_path=folder, **settings)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pad_limit", [lm_model.PAD_LIMIT, 0], ids=["buckets", "one-call-per-context"])
def test_greedy_equals_hf_generate_alone_and_in_a_batch_of_eight(folders, kind, pad_limit, monkeypatch):
    # pad_limit 0: every distinct context length is its own attention call (decode buckets)
    monkeypatch.setattr(lm_model, "PAD_LIMIT", pad_limit)
    folder = folders[kind]
    target = PROMPTS[1]
    want = hf_greedy(folder, target, 24)
    assert len(set(want)) > 2, "the random model should not repeat one token (a weak check)"

    eng = engine(folder)
    alone = eng.start(request(target, 24))
    run_all(eng, [alone])
    assert alone.output == want

    # Eight others join first and run a few steps, so they sit at different positions (some
    # still mid-prefill: the budget of 16 tokens splits the long prompts into chunks).
    eng = engine(folder, token_budget=16)
    others = [eng.start(request(p, 8 + 3 * i)) for i, p in enumerate(PROMPTS[2:] + PROMPTS[:1])]
    assert len(others) == 8
    for n in range(len(others)):
        eng.step([s for s in others[: n + 1] if not eng.finished(s)])
    assert len({s.computed for s in others}) > 3
    target_state = eng.start(request(target, 24))
    run_all(eng, [*[s for s in others if not eng.finished(s)], target_state])
    assert target_state.output == want
    for s, p in zip(others, PROMPTS[2:] + PROMPTS[:1], strict=True):
        assert s.output == hf_greedy(folder, p, s.params.max_tokens)
    assert eng.blocks.used == 0  # every block back in the pool


@pytest.mark.parametrize("kind", KINDS)
def test_seeded_sampling_is_the_same_alone_and_batched(folders, kind):
    folder = folders[kind]
    params = {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 1234}
    eng = engine(folder)
    alone = eng.start(request(PROMPTS[0], 20, **params))
    run_all(eng, [alone])
    again = eng.start(request(PROMPTS[0], 20, **{**params, "seed": 99}))
    run_all(eng, [again])
    assert again.output != alone.output  # the seed matters

    eng = engine(folder, token_budget=12)
    others = [eng.start(request(p, 10, temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS[1:9])]
    eng.step(others)
    eng.step(others)
    mine = eng.start(request(PROMPTS[0], 20, **params))
    run_all(eng, [*[s for s in others if not eng.finished(s)], mine])
    assert mine.output == alone.output


@pytest.mark.parametrize("kind", KINDS)
def test_text_equals_hf_decode_whether_decoded_per_token_or_once_at_the_end(folders, kind):
    # A generation without stop strings or a sink decodes its text once, when it ends; one
    # with a sink per token. Both must be Hugging Face's text for generate()'s tokens, and
    # the streamed pieces must add up to it.
    from types import SimpleNamespace

    folder = folders[kind]
    want_ids, want_text = greedy_with_text(folder, PROMPTS[3], 20)
    eng = engine(folder)
    quiet = eng.start(request(PROMPTS[3], 20))
    pieces: list[str] = []
    streamed = eng.start(request(PROMPTS[3], 20))
    streamed.context = SimpleNamespace(token_sink=lambda delta, *_: pieces.append(delta))
    texts = []
    while not (eng.finished(quiet) and eng.finished(streamed)):
        eng.step([s for s in (quiet, streamed) if not eng.finished(s)])
        if not eng.finished(quiet):
            assert quiet.text == ""  # not decoded while nothing reads it
        texts.append((len(streamed.output), streamed.text))
    for state in (quiet, streamed):
        assert state.output == want_ids
        assert state.text == want_text
        assert eng.result(state)["text_output"][0].decode() == want_text
    assert "".join(pieces) == want_text and len(pieces) == 20
    for n, text in texts:  # every intermediate text is the decode of the tokens so far
        assert text == eng.tokenizer.decode(want_ids[:n], skip_special_tokens=True)


def test_request_level_infer_matches_step_level(folders):
    folder = folders["llama"]
    eng = engine(folder)
    import numpy as np

    batch = {
        "text_input": np.array([[p.encode()] for p in PROMPTS[:4]], dtype=object),
        "max_tokens": np.array([[5], [9], [3], [12]], np.int32),
    }
    out = eng.infer(batch)
    for i, p in enumerate(PROMPTS[:4]):
        want = hf_greedy(folder, p, int(batch["max_tokens"][i, 0]))
        got = [t for t in out["output_ids"][i].tolist() if t >= 0]
        assert got == want
    assert eng.blocks.used == 0


def test_pool_smaller_than_the_load_preempts_and_answers_everyone(folders):
    """24 KV blocks of 4 tokens (96 slots) for 8 generations of ~50 tokens each."""
    folder = folders["gpt2"]
    eng = engine(folder, kv_blocks=24, block_size=4, token_budget=32)
    states = [eng.start(request(p, 40, ignore_eos=True)) for p in PROMPTS[:8]]
    peak = 0

    def watch(_states):
        nonlocal peak
        peak = max(peak, eng.blocks.used)

    eng.token_observer = watch
    run_all(eng, states)
    assert all(eng.finished(s) for s in states)
    assert eng.preemptions > 0 and sum(s.preemptions for s in states) == eng.preemptions
    assert peak <= 24
    assert eng.blocks.used == 0
    roomy = engine(folder)
    for s, p in zip(states, PROMPTS[:8], strict=True):  # recompute did not change the answer
        alone = roomy.start(request(p, 40, ignore_eos=True))
        run_all(roomy, [alone])
        assert len(s.output) == 40 and s.output == alone.output


def test_stop_strings_and_max_tokens(folders):
    folder = folders["gpt2"]
    eng = engine(folder)
    full = eng.start(request(PROMPTS[3], 24, ignore_eos=True))
    run_all(eng, [full])
    assert len(full.output) == 24 and full.finish_reason == "length"
    tok = eng.tokenizer
    # a stop string the 8th token's text makes appear for the first time
    stop = None
    for i in range(4, 20):
        piece = tok.decode(full.output[i : i + 1])
        if piece.strip() and piece.isprintable() and piece not in tok.decode(full.output[:i]):
            stop, cut = piece, i
            break
    assert stop is not None
    s = eng.start(request(PROMPTS[3], 24, stop=[stop], ignore_eos=True))
    run_all(eng, [s])
    assert s.finish_reason == "stop"
    assert s.output == full.output[: cut + 1]
    assert stop not in s.text
    assert eng.result(s)["finish_reason"][0] == b"stop"


@pytest.mark.parametrize(
    "item, message",
    [
        ({}, "text_input is required"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_tokens": 10_000}, "exceeds"),
        ({"stop": "[1, 2]"}, "stop"),
    ],
)
def test_bad_requests_are_refused_before_any_block(folders, item, message):
    import numpy as np

    eng = engine(folders["gpt2"])
    inputs = request("hello") if item != {} else {}
    for name, value in item.items():
        dtype = object if isinstance(value, str) else None
        inputs[name] = np.array([value.encode() if isinstance(value, str) else value], dtype=dtype)
    with pytest.raises(ValueError, match=message):
        eng.start(inputs)
    assert eng.blocks.used == 0
