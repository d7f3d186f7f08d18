"""``batchers.engine_thread.EngineThread``: the one thread of an engine instance, as an
``Executor`` (futures, ``run_in_executor``) and as a plain queue of calls (``post``)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from wattserve.batchers.engine_thread import EngineThread


def test_every_call_runs_in_order_on_one_named_thread():
    thread = EngineThread("engine-7")
    seen: list[tuple[int, str]] = []
    done = threading.Event()
    futures = [
        thread.submit(lambda i=i: seen.append((i, threading.current_thread().name)) or i) for i in range(5)
    ]
    thread.post(lambda: seen.append((5, threading.current_thread().name)))
    thread.post(done.set)
    assert [f.result(timeout=5) for f in futures] == [0, 1, 2, 3, 4]
    assert done.wait(5)
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4, 5]
    assert {name for _, name in seen} == {"engine-7"}
    thread.shutdown()


def test_a_failing_call_fails_its_future_or_is_logged_and_the_thread_goes_on(caplog):
    thread = EngineThread("engine-0")
    with pytest.raises(ZeroDivisionError):
        thread.submit(lambda: 1 / 0).result(timeout=5)
    with caplog.at_level(logging.ERROR, logger="wattserve.batcher"):
        thread.post(lambda: 1 / 0)
        assert thread.submit(lambda: "still here").result(timeout=5) == "still here"
    assert "a call failed" in caplog.text
    thread.shutdown()


def test_keyword_arguments_reach_the_call():
    thread = EngineThread("engine-0")
    assert thread.submit(lambda a, b=0: a - b, 5, b=2).result(timeout=5) == 3
    thread.shutdown()


def test_shutdown_runs_what_was_queued_then_refuses_new_calls():
    thread = EngineThread("engine-0")
    gate = threading.Event()
    ran: list[int] = []
    thread.post(gate.wait, 5)
    later = [thread.submit(ran.append, i) for i in range(3)]
    stopper = threading.Thread(target=thread.shutdown)  # waits for the queued calls
    stopper.start()
    gate.set()
    stopper.join(5)
    assert not stopper.is_alive()
    assert ran == [0, 1, 2] and all(f.done() for f in later)
    with pytest.raises(RuntimeError):
        thread.submit(print)
    with pytest.raises(RuntimeError):
        thread.post(print)


def test_shutdown_can_cancel_queued_futures():
    thread = EngineThread("engine-0")
    gate = threading.Event()
    thread.post(gate.wait, 5)
    queued = thread.submit(lambda: "never")
    stopper = threading.Thread(target=thread.shutdown, kwargs={"cancel_futures": True})
    stopper.start()
    while not thread._shut:  # shutdown has taken the queue
        pass
    gate.set()
    stopper.join(5)
    assert queued.cancelled()


def test_the_initializer_runs_first_on_the_thread():
    where: list[str] = []
    thread = EngineThread("engine-3", initializer=lambda: where.append(threading.current_thread().name))
    assert thread.submit(lambda: list(where)).result(timeout=5) == ["engine-3"]
    thread.shutdown()


async def test_run_in_executor_awaits_a_call_on_the_thread():
    thread = EngineThread("engine-1")
    name = await asyncio.get_running_loop().run_in_executor(thread, lambda: threading.current_thread().name)
    assert name == "engine-1"
    thread.shutdown()
