"""token_stream's sinks: tokens from the engine thread reach the loop in the order generated,
a step's tokens in one loop callback (not one wake-up per token)."""

from __future__ import annotations

import asyncio
import threading

from wattserve.server.core.token_stream import token_sink


def test_a_steps_tokens_cross_in_order_in_one_callback() -> None:
    async def main() -> tuple[list[tuple[str, int, bool]], int]:
        loop = asyncio.get_running_loop()
        got: list[tuple[str, int, bool]] = []
        sinks = [
            token_sink(loop, lambda o, final, r=r: got.append((r, int(o["output_ids"][0, 0]), final)))
            for r in ("a", "b")
        ]
        wakeups = 0
        real = loop.call_soon_threadsafe

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal wakeups
            wakeups += 1
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]

        # one step of two sequences, then the step that ends both: posted back to back (as
        # the engine thread posts a step's tokens), so no flush can run in between
        for step in range(2):
            for i, sink in enumerate(sinks):
                sink("x", 10 * step + i, "length" if step == 1 else None, 3)
        assert got == []  # nothing runs on the loop until it turns
        await asyncio.sleep(0)
        return got, wakeups

    got, wakeups = asyncio.run(main())
    assert got == [("a", 0, False), ("b", 1, False), ("a", 10, True), ("b", 11, True)]
    assert wakeups == 1


def test_tokens_posted_while_a_flush_runs_are_not_lost() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        got: list[int] = []
        done = asyncio.Event()

        def deliver(outputs: dict, final: bool) -> None:
            got.append(int(outputs["output_ids"][0, 0]))
            if final:
                done.set()

        sink = token_sink(loop, deliver)

        def engine_thread() -> None:  # the loop flushes while this thread keeps posting
            for t in range(2000):
                sink("", t, "length" if t == 1999 else None, 1)

        threading.Thread(target=engine_thread).start()
        await asyncio.wait_for(done.wait(), 30)
        return got

    assert asyncio.run(main()) == list(range(2000))
