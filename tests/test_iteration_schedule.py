"""``schedule()``, the iteration batcher's decision, as a pure function: (waiting, running,
capacity) in, (run on, admit, leave) out; no engine, no event loop, nothing mutated."""

from __future__ import annotations

import numpy as np
from wattserve.batchers.iteration import Running, schedule
from wattserve.batchers.types import ItemState, WorkItem


def item(state: ItemState = ItemState.QUEUED, priority: int = 1) -> WorkItem:
    return WorkItem(inputs={"seed": np.array([0])}, priority=priority, state=state)


def running(state: ItemState = ItemState.RUNNING) -> Running:
    return Running(item(state), state=object(), joined=0.0)


def test_empty_is_idle():
    plan = schedule([], [], 4)
    assert plan.idle and plan.running == [] and plan.admit == [] and plan.leave == []


def test_waiting_fill_the_room_in_the_order_given():
    waiting = [item() for _ in range(6)]
    plan = schedule(waiting, [], 4)
    assert plan.admit == waiting[:4] and not plan.idle


def test_running_keep_their_place_and_only_the_room_left_is_admitted():
    run = [running(), running(), running()]
    waiting = [item(), item()]
    plan = schedule(waiting, run, 4)
    assert plan.running == run
    assert plan.admit == waiting[:1]
    assert plan.leave == []


def test_a_full_running_set_admits_nobody():
    run = [running() for _ in range(4)]
    plan = schedule([item()], run, 4)
    assert plan.running == run and plan.admit == []


def test_answered_requests_leave_and_free_their_room():
    gone = running(ItemState.DONE)  # deadline passed or client left while it ran
    stay = running()
    waiting = [item(), item()]
    plan = schedule(waiting, [gone, stay], 2)
    assert plan.running == [stay]
    assert plan.leave == [gone]
    assert plan.admit == waiting[:1]


def test_inputs_are_not_mutated():
    run = [running(ItemState.DONE), running()]
    waiting = [item(), item()]
    before = (list(run), list(waiting), [r.item.state for r in run])
    schedule(waiting, run, 1)
    assert (run, waiting, [r.item.state for r in run]) == before


def test_everything_answered_leaves_an_idle_plan():
    plan = schedule([], [running(ItemState.DONE)], 4)
    assert plan.idle and len(plan.leave) == 1
