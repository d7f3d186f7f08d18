"""Token-level continuous batching (the iteration batcher on the LM step engine) and
request-level dynamic batching of whole generations, on one tiny GPT-2 folder."""

from __future__ import annotations

import asyncio

import pytest
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.iteration import IterationBatcher
from wattserve.batchers.registry import build_batcher
from wattserve.batchers.types import ClientGone, WorkItem
from wattserve.engines.lm_engine import LMEngine

from tests.lm_support import PROMPTS, request, run_all, tiny_lm_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_lm_folder(tmp_path_factory.mktemp("lm"), "gpt2")


def work(engine: LMEngine, prompt: str, max_tokens: int, **params) -> WorkItem:
    filled, _ = engine.prepare({k: v[None] for k, v in request(prompt, max_tokens, **params).items()})
    return WorkItem(inputs=filled)


def solo(folder, prompt: str, max_tokens: int) -> list[int]:
    eng = LMEngine("solo", model_path=folder, kv_blocks=128, block_size=4)
    s = eng.start(request(prompt, max_tokens, ignore_eos=True))
    run_all(eng, [s])
    return s.output


async def serve(batcher, items):
    task = asyncio.create_task(batcher.run())
    try:
        return await asyncio.gather(*(batcher.submit(i) for i in items))
    finally:
        await batcher.drain(timeout=120)
        await task
        batcher.close()


async def test_concurrent_long_requests_past_the_pool_are_all_answered_once(folder):
    """16 generations of ~50 tokens over a 20-block x 4-token pool (80 slots)."""
    engine = LMEngine(
        "tiny", model_path=folder, kv_blocks=20, block_size=4, token_budget=24, max_batch_size=6
    )
    spec = BatchingSpec(batcher="continuous", max_batch_size=6, max_queue_size=64, max_queue_wait_s=0)
    batcher = build_batcher(spec, [engine])
    assert isinstance(batcher, IterationBatcher)
    peak = 0

    def watch(_grew):
        nonlocal peak
        peak = max(peak, engine.blocks.used)

    engine.token_observer = watch
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    items = [work(engine, p, 36, ignore_eos=True) for p in prompts]
    results = await serve(batcher, items)
    assert len(results) == 16 and all(i.future is not None and i.future.done() for i in items)
    assert engine.preemptions > 0
    assert peak <= 20 and engine.blocks.used == 0
    # none twice, none mixed up: each answer is its own prompt's greedy generation
    cache: dict[str, list[int]] = {}
    for p, r in zip(prompts, results, strict=True):
        if p not in cache:
            cache[p] = solo(folder, p, 36)
        assert r.outputs["output_ids"][0].tolist() == cache[p]


async def test_dynamic_batching_of_whole_generations_gives_the_same_answers(folder):
    engine = LMEngine("tiny", model_path=folder, kv_blocks=128, block_size=4, max_batch_size=4)
    spec = BatchingSpec(batcher="dynamic", max_batch_size=4, max_queue_delay_ms=20, max_queue_wait_s=0)
    batcher = build_batcher(spec, [engine])
    items = [work(engine, p, 6 + 2 * i, ignore_eos=True) for i, p in enumerate(PROMPTS[:4])]
    results = await serve(batcher, items)
    assert max(r.batch_size for r in results) > 1
    for i, (p, r) in enumerate(zip(PROMPTS[:4], results, strict=True)):
        got = [t for t in r.outputs["output_ids"][0].tolist() if t >= 0]
        assert got == solo(folder, p, 6 + 2 * i)


async def test_a_request_that_leaves_gives_its_blocks_back(folder):
    engine = LMEngine("tiny", model_path=folder, kv_blocks=64, block_size=4, max_batch_size=4)
    spec = BatchingSpec(batcher="continuous", max_batch_size=4, max_queue_wait_s=0)
    batcher = build_batcher(spec, [engine])
    task = asyncio.create_task(batcher.run())
    long = work(engine, PROMPTS[1], 200, ignore_eos=True)
    waiter = asyncio.create_task(batcher.submit(long))
    for _ in range(2000):
        await asyncio.sleep(0.005)
        if engine.blocks.used > 0:
            break
    assert engine.blocks.used > 0
    long.finish(error=ClientGone("client left"))
    short = await batcher.submit(work(engine, PROMPTS[0], 3))  # one more iteration: the leaver is released
    assert short.outputs["finish_reason"][0] in (b"length", b"stop")
    assert engine.blocks.used == 0
    with pytest.raises(ClientGone):
        await waiter
    await batcher.drain(timeout=30)
    await task
    batcher.close()
