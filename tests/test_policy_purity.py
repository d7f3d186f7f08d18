"""Every request-level policy's ``decide`` only reads (batchers/policy.py): asked twice with
the same view and time it gives the same answer, and neither the policy nor the queue is
changed by asking. What a policy keeps of its decisions it records in ``observe``, and a
queue move is part of its answer (``Delay``), applied by the scheduler (``decide_once``).

The adaptive batcher is the policy that learns while it decides: its learning runs on the
event loop as each batch is answered, while an engine thread that has just finished a batch
decides the next one. The interleaving test runs a learning step between every two lines a decision
executes (a trace hook standing in for the other thread, which can take the GIL at any
line), which is every interleaving of one learning step with a decision, deterministically.
"""

from __future__ import annotations

import ast
import enum
import inspect
import sys
import textwrap
from collections import deque
from collections.abc import Callable
from pathlib import Path
from time import monotonic
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import wattserve.batchers as batchers_package
from wattserve.batchers.adaptive import AdaptiveBatcher, AdaptiveConfig
from wattserve.batchers.base import Batcher
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.executor import BatchOutcome
from wattserve.batchers.policy import Delay, Dispatch, Wait
from wattserve.batchers.queue import PriorityFifo
from wattserve.batchers.registry import POLICIES
from wattserve.batchers.scheduler import decide_once
from wattserve.batchers.types import ItemState, WorkItem
from wattserve.engines.identity import IdentityEngine

BATCHERS = Path(batchers_package.__file__).resolve().parent
DECIDING = {
    name: cls for name, cls in POLICIES.items() if not inspect.isabstract(cls) and "decide" in dir(cls)
}


def fingerprint(obj: Any, seen: set[int] | None = None, depth: int = 0) -> Any:
    """A comparable picture of ``obj``'s state: values of plain data, and of the batchers'
    own objects (policy, queue, items, learned models) recursively; anything else (engines,
    locks, threads, futures) by identity only."""
    seen = set() if seen is None else seen
    if isinstance(obj, (int, float, str, bytes, bool, type(None))):
        return obj
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.shape, obj.dtype.str, obj.tobytes())
    if id(obj) in seen or depth > 8:
        return ("seen", id(obj))
    seen.add(id(obj))
    if isinstance(obj, (list, tuple, deque)):
        return (type(obj).__name__, tuple(fingerprint(x, seen, depth + 1) for x in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((repr(k), fingerprint(v, seen, depth + 1)) for k, v in obj.items()))
    if isinstance(obj, (set, frozenset)):
        return ("set", tuple(sorted(map(repr, obj))))
    if type(obj).__module__.startswith("wattserve.batchers"):
        names = list(getattr(obj, "__dict__", {})) + [
            s for klass in type(obj).__mro__ for s in getattr(klass, "__slots__", ())
        ]
        return (
            type(obj).__name__,
            tuple(
                (n, fingerprint(getattr(obj, n, None), seen, depth + 1)) for n in names if n != "__weakref__"
            ),
        )
    return ("object", type(obj).__name__, id(obj))


def policy(name: str) -> Batcher:
    engine = IdentityEngine(elements=4, max_batch_size=8)
    cls = DECIDING[name]
    built = cls([engine], cls.config_from(BatchingSpec(batcher=name, max_batch_size=8, slo_ms=100.0), engine))
    if isinstance(built, AdaptiveBatcher):
        built.seed_costs({b: 0.010 * b for b in (1, 2, 4, 8)})  # a request older than 80 ms is late alone
    return built


def view(now: float, ages_ms: list[float], closing: bool = False) -> SimpleNamespace:
    queue = PriorityFifo()
    for age in ages_ms:
        queue.push(WorkItem({"x": np.full((1, 4), age, np.float32)}, arrival=now - age / 1000))
    return SimpleNamespace(queue=queue, closing=closing)


QUEUES = {
    "one fresh": ([1.0], False),
    "a few": ([30.0, 20.0, 10.0], False),
    "full": ([5.0] * 8, False),
    "some past saving": ([95.0, 90.0, 85.0, 45.0, 40.0], False),
    "a burst": [[5.0 - 0.01 * i for i in range(20)], False],
    "draining": ([3.0, 2.0], True),
}


@pytest.mark.parametrize("name", sorted(DECIDING))
@pytest.mark.parametrize("queue", sorted(QUEUES))
def test_deciding_twice_gives_one_answer_and_changes_nothing(name: str, queue: str) -> None:
    decider = policy(name)
    now = monotonic()
    ages, closing = QUEUES[queue]
    asked = view(now, list(ages), closing)
    for k in range(5):  # an arrival history, so the adaptive batcher's rate is not zero
        if isinstance(decider, AdaptiveBatcher):
            decider.arrivals.arrived(now - 0.4 + 0.1 * k)
    before = fingerprint((decider, asked.queue))
    first = decider.decide(asked, now)
    second = decider.decide(asked, now)
    assert first == second
    assert fingerprint((decider, asked.queue)) == before, f"{name}.decide changed state ({queue})"
    assert isinstance(first, (Dispatch, Wait, Delay))


def test_the_check_sees_a_decision_that_writes() -> None:
    """The fingerprint is not blind: a decision that counts its calls is caught."""
    decider = policy("continuous")
    before = fingerprint(decider)
    decider.decided = 1  # what a writing decide would leave behind
    assert fingerprint(decider) != before
    asked = view(monotonic(), [1.0])
    before = fingerprint(asked.queue)
    asked.queue.pop(1)
    assert fingerprint(asked.queue) != before


def test_a_late_move_is_part_of_the_answer_and_the_scheduler_applies_it() -> None:
    decider = policy("adaptive")
    now = monotonic()
    asked = view(now, [95.0, 90.0, 85.0, 45.0, 40.0, 35.0])
    answer = decider.decide(asked, now)
    assert isinstance(answer, Delay) and answer.counts == (3,)
    assert asked.queue.delayed == 0 and decider.delayed_total == 0  # asking moved nothing
    assert decide_once(decider, asked, now) == answer.then  # the step applies and records it
    assert asked.queue.delayed == 3 and decider.delayed_total == 3


# ---------------------------------------------------------------- no attribute writes from decide
def _batchers_own(klass: type) -> bool:
    return klass.__module__.startswith("wattserve.batchers")


def _methods(cls: type, own: Callable[[type], bool]) -> dict[str, ast.FunctionDef]:
    """The class's methods (its own and those inherited from classes ``own`` accepts), by name."""
    found: dict[str, ast.FunctionDef] = {}
    for klass in reversed(cls.__mro__):
        if not own(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in tree.body[0].body:  # type: ignore[attr-defined]
            if isinstance(node, ast.FunctionDef):
                found[node.name] = node
    return found


def _on_self(node: ast.expr) -> bool:
    """``self.name`` (an attribute of ``self``)."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _writes_reachable_from_decide(cls: type, own: Callable[[type], bool] = _batchers_own) -> list[str]:
    methods = _methods(cls, own)
    todo, done, writes = ["decide"], set(), []
    while todo:
        name = todo.pop()
        if name in done or name not in methods:
            continue
        done.add(name)
        for node in ast.walk(methods[name]):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if _on_self(part):
                        writes.append(f"{cls.__name__}.{name}: self.{part.attr} = ...")  # type: ignore[attr-defined]
            if isinstance(node, ast.Call) and _on_self(node.func):
                todo.append(node.func.attr)  # type: ignore[attr-defined]
    return writes


@pytest.mark.parametrize("name", sorted(DECIDING))
def test_no_attribute_is_assigned_on_any_path_from_decide(name: str) -> None:
    assert _writes_reachable_from_decide(DECIDING[name]) == []


def test_the_walk_sees_an_assignment_two_calls_down() -> None:
    class Writes(DECIDING["continuous"]):  # type: ignore[misc, valid-type]
        def decide(self, view, now):
            return self._helper(view)

        def _helper(self, view):
            self.last = view
            return Dispatch(1)

    def own(klass: type) -> bool:
        return klass is Writes or _batchers_own(klass)

    assert _writes_reachable_from_decide(Writes, own) == ["Writes._helper: self.last = ..."]


# ---------------------------------------------------------------- learning interleaved with a decision
def interleaved(call: Callable[[], Any], other: Callable[[], None]) -> tuple[Any, int]:
    """``call()``, running ``other()`` before every line it executes in batchers/ (as another
    thread may at any line); its result and how many times ``other`` ran."""
    state = {"busy": False, "runs": 0}

    def local(frame, event, arg):
        if event == "line" and not state["busy"]:
            state["busy"] = True
            try:
                other()
                state["runs"] += 1
            finally:
                state["busy"] = False
        return local

    def tracer(frame, event, arg):
        inside = frame.f_code.co_filename.startswith(str(BATCHERS))
        return local if inside and not state["busy"] else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return call(), state["runs"]
    finally:
        sys.settrace(previous)


def _two_instances() -> AdaptiveBatcher:
    engines = [IdentityEngine(elements=4, max_batch_size=8) for _ in range(2)]
    batcher = AdaptiveBatcher(engines, AdaptiveConfig(max_batch_size=8, slo_s=0.100, calibrate=False))
    batcher.seed_costs({b: 0.010 + 0.001 * b for b in (1, 2, 4, 8)})
    return batcher


def _learning_step(batcher: AdaptiveBatcher) -> Callable[[], None]:
    """What the event loop does when another instance's batch of two is answered."""

    def learn() -> None:
        now = monotonic()
        items = [WorkItem({}, arrival=now - 0.010, state=ItemState.RUNNING) for _ in range(2)]
        for item in items:
            item.dispatched_at = now - 0.005
        batcher.batch_finished(
            BatchOutcome(items, [{}] * 2, started=now - 0.005, finished=now, energy=None, padded=0, rows=2)
        )

    return learn


@pytest.mark.parametrize("queue", sorted(QUEUES))
def test_a_decision_is_whole_whatever_another_instance_learns_meanwhile(queue: str) -> None:
    """Two instances: a decision on one instance's engine thread while the loop learns from
    the other instance's batch. On the main of 2026-12-03 this raised inside ``cost_view``
    (``'NoneType' object is not subscriptable``): a learning step cleared the cached view
    between the decision's building it and reading it."""
    batcher = _two_instances()
    now = monotonic()
    ages, closing = QUEUES[queue]
    asked = view(now, list(ages), closing)
    calm = decide_once(_two_instances(), view(now, list(ages), closing), now)
    answer, runs = interleaved(lambda: decide_once(batcher, asked, now), _learning_step(batcher))
    assert runs > 10, "the hook ran the other thread's step between the decision's lines"
    assert isinstance(answer, (Dispatch, Wait)) and type(answer) is type(calm)
